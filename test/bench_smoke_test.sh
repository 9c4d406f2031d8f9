#!/usr/bin/env bash
# The benchmark tools work end to end: rdmarpc_bench against its own server (latency run and
# idle-connection run), tcp_pingpong and grpc_bench (the gRPC C++ yardstick), each for a second,
# with every call succeeding.
set -uo pipefail
bin=tools/bench
fail() { echo "bench_smoke_test: $*"; exit 1; }
log=$(mktemp)
$bin/rdmarpc_bench --server --listen tcp://127.0.0.1:0 >"$log" 2>&1 &
srv=$!
trap 'kill $srv $pp $gs 2>/dev/null' EXIT
for _ in $(seq 100); do grep -q "^listening on" "$log" && break; sleep 0.05; done
target=$(sed -n 's/^listening on //p' "$log")
[ -n "$target" ] || fail "server did not start: $(cat "$log")"
out=$($bin/rdmarpc_bench --target "$target" --depth 4 --request-bytes 100 --response-bytes 7 \
      --duration 1 --warmup 0 --json) || fail "client failed: $out"
echo "$out"
echo "$out" | grep -q '"failed":0,' || fail "calls failed"
echo "$out" | grep -Eq '"calls":[1-9][0-9]*,' || fail "no calls counted"
echo "$out" | grep -Eq '"mb_per_s":[0-9.]+' || fail "no throughput"
idle=$($bin/rdmarpc_bench --target "$target" --idle-connections 20 --json) || fail "idle run failed: $idle"
echo "$idle"
echo "$idle" | grep -q '"opened":20,' || fail "idle connections not all opened"
port=$((20000 + RANDOM % 20000))
$bin/tcp_pingpong --server --port "$port" >/dev/null 2>&1 &
pp=$!
sleep 0.3
p=$($bin/tcp_pingpong --port "$port" --bytes 64 --depth 2 --duration 1 --warmup 0 --json) || fail "tcp_pingpong failed"
echo "$p"
echo "$p" | grep -Eq '"calls":[1-9][0-9]*,' || fail "tcp_pingpong counted nothing"
glog=$(mktemp)
$bin/grpc_bench --server >"$glog" 2>&1 &
gs=$!
for _ in $(seq 100); do grep -q "^listening on" "$glog" && break; sleep 0.05; done
gtarget=$(sed -n 's/^listening on //p' "$glog")
[ -n "$gtarget" ] || fail "grpc_bench server did not start: $(cat "$glog")"
g=$($bin/grpc_bench --target "$gtarget" --depth 4 --request-bytes 100 --response-bytes 7 \
    --duration 1 --warmup 0 --json) || fail "grpc_bench client failed: $g"
echo "$g"
echo "$g" | grep -q '"failed":0,' || fail "grpc_bench calls failed"
echo "$g" | grep -Eq '"calls":[1-9][0-9]*,' || fail "grpc_bench counted nothing"
echo "bench_smoke_test: ok"

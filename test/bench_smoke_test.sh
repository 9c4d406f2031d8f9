#!/usr/bin/env bash
# The benchmark tools work end to end: rdmarpc_bench against its own server (latency run and
# idle-connection run, a server stream and a client stream), tcp_pingpong and grpc_bench (the gRPC
# C++ yardstick: calls, a server stream, a client stream), each for a second,
# with every call succeeding; tcp_wait_probe's read paths each echo a second of tcp_pingpong.
set -uo pipefail
bin=tools/bench
fail() { echo "bench_smoke_test: $*"; exit 1; }
tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT
# start_server NAME CMD...: starts a server that prints "listening on ADDR"; sets $addr.
start_server() {
  local name=$1
  shift
  "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -q "^listening on" "$tmp/$name.log" && break; sleep 0.05; done
  addr=$(sed -n 's/^listening on //p' "$tmp/$name.log")
  [ -n "$addr" ] || fail "$name did not start: $(cat "$tmp/$name.log")"
}
start_server rdmarpc_bench $bin/rdmarpc_bench --server --listen tcp://127.0.0.1:0
target=$addr
out=$($bin/rdmarpc_bench --target "$target" --depth 4 --request-bytes 100 --response-bytes 7 \
      --duration 1 --warmup 0 --json) || fail "client failed: $out"
echo "$out"
echo "$out" | grep -q '"failed":0,' || fail "calls failed"
echo "$out" | grep -Eq '"calls":[1-9][0-9]*,' || fail "no calls counted"
echo "$out" | grep -Eq '"mb_per_s":[0-9.]+' || fail "no throughput"
idle=$($bin/rdmarpc_bench --target "$target" --idle-connections 20 --json) || fail "idle run failed: $idle"
echo "$idle"
echo "$idle" | grep -q '"opened":20,' || fail "idle connections not all opened"
st=$($bin/rdmarpc_bench --target "$target" --stream --response-bytes 100 --duration 1 --warmup 0 \
     --json) || fail "stream run failed: $st"
echo "$st"
echo "$st" | grep -Eq '"messages":[1-9][0-9]*,' || fail "no stream messages counted"
echo "$st" | grep -q '"error":""' || fail "stream run reported an error"
up=$($bin/rdmarpc_bench --target "$target" --upload --request-bytes 100 --duration 1 --warmup 0 \
     --json) || fail "upload run failed: $up"
echo "$up"
echo "$up" | grep -Eq '"messages":[1-9][0-9]*,' || fail "no upload messages counted"
echo "$up" | grep -q '"error":""' || fail "upload run reported an error"
port=$((20000 + RANDOM % 20000))
$bin/tcp_pingpong --server --port "$port" >/dev/null 2>&1 &
pids+=($!)
sleep 0.3
p=$($bin/tcp_pingpong --port "$port" --bytes 64 --depth 2 --duration 1 --warmup 0 --json) || fail "tcp_pingpong failed"
echo "$p"
echo "$p" | grep -Eq '"calls":[1-9][0-9]*,' || fail "tcp_pingpong counted nothing"
for mode in blocking epoll uring-eventfd uring-oneshot uring-wait; do
  start_server "probe-$mode" $bin/tcp_wait_probe --mode "$mode"
  p=$(timeout 20 $bin/tcp_pingpong --port "${addr##*:}" --bytes 64 --depth 2 --duration 1 \
      --warmup 0 --json)
  status=$?
  [ $status = 124 ] && fail "tcp_pingpong against tcp_wait_probe --mode $mode hung (20 s)"
  wait "${pids[-1]}"
  probe_status=$?
  probe=$(grep '^{' "$tmp/probe-$mode.log")
  if [[ $mode == uring-* ]] && grep -q "io_uring_setup" "$tmp/probe-$mode.log"; then
    # An experiment, not part of rdmarpc: a kernel or sandbox without io_uring skips it, loudly.
    echo "bench_smoke_test: SKIPPED tcp_wait_probe --mode $mode: $(cat "$tmp/probe-$mode.log")"
    continue
  fi
  if [ $mode = uring-eventfd ] && [ $probe_status = 3 ]; then
    # io_uring lost a completion in a way the probe does not know (it recovers the one it
    # knows, see Uring::Stalled in tcp_wait_probe.cc): a finding about the kernel, reported
    # loudly, not a failure of rdmarpc, whose receives (single-shot, no eventfd) this mode's
    # multishot-and-eventfd path does not share.
    echo "bench_smoke_test: STALLED (reported, not failed) tcp_wait_probe --mode $mode: $(cat "$tmp/probe-$mode.log")"
    continue
  fi
  [ $probe_status = 0 ] || fail "tcp_wait_probe --mode $mode exited $probe_status: $(cat "$tmp/probe-$mode.log")"
  [ $status = 0 ] || fail "tcp_pingpong against tcp_wait_probe --mode $mode failed: $p"
  echo "$probe"
  echo "$probe" | grep -Eq '"messages":[1-9][0-9]*,' || fail "tcp_wait_probe --mode $mode read nothing"
done
# Debian's libgrpc is not built for ThreadSanitizer: under --config=tsan (which sets
# TSAN_OPTIONS) its own locking is invisible and TSan reports races inside it. The gRPC
# comparison runs with reports off there; rdmarpc's binaries keep theirs.
grpc=($bin/grpc_bench)
[ -n "${TSAN_OPTIONS:-}" ] && grpc=(env "TSAN_OPTIONS=$TSAN_OPTIONS:report_bugs=0" $bin/grpc_bench)
start_server grpc_bench "${grpc[@]}" --server
g=$("${grpc[@]}" --target "$addr" --depth 4 --request-bytes 100 --response-bytes 7 \
    --duration 1 --warmup 0 --json) || fail "grpc_bench client failed: $g"
echo "$g"
echo "$g" | grep -q '"failed":0,' || fail "grpc_bench calls failed"
echo "$g" | grep -Eq '"calls":[1-9][0-9]*,' || fail "grpc_bench counted nothing"
gs=$("${grpc[@]}" --target "$addr" --stream --response-bytes 100 --duration 1 --warmup 0 \
     --json) || fail "grpc_bench stream run failed: $gs"
echo "$gs"
echo "$gs" | grep -Eq '"messages":[1-9][0-9]*,' || fail "grpc_bench counted no stream messages"
echo "$gs" | grep -q '"error":""' || fail "grpc_bench stream run reported an error"
gu=$("${grpc[@]}" --target "$addr" --upload --request-bytes 100 --duration 1 --warmup 0 \
     --json) || fail "grpc_bench upload run failed: $gu"
echo "$gu"
echo "$gu" | grep -Eq '"messages":[1-9][0-9]*,' || fail "grpc_bench counted no upload messages"
echo "$gu" | grep -q '"error":""' || fail "grpc_bench upload run reported an error"
echo "bench_smoke_test: ok"

#!/usr/bin/env bash
# Reproduces every figure in docs/BENCHMARKS.md: TCP on loopback (rdmarpc next to a raw-socket
# ping-pong and gRPC C++), CPU cost per call (callgrind), memory per idle connection and connection counts,
# and RDMA in the Soft-RoCE VM (rdmarpc next to perftest on the same device in the same boot).
# Then writes docs/BENCHMARKS.md and the plots in docs/bench/.
#
#   tools/bench/run_all.sh            # about 16 minutes on a 2-core machine (2026-12-04)
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "run_all.sh: takes no arguments, got '$1' (see tools/bench/run_all.sh --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
bash tools/setup.sh >/dev/null
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

res=$(mktemp -d /var/tmp/rdmarpc_bench.XXXXXX)
chmod 777 "$res"
trap 'jobs -p | xargs -r kill 2>/dev/null; rm -rf "$res"' EXIT
bazel build //tools/bench:all >/dev/null 2>&1 || bazel build //tools/bench:all
bin=bazel-bin/tools/bench
ulimit -n "$(ulimit -Hn)"  # as many descriptors as allowed: the connection-count runs need them

. tools/bench/lib.sh  # wait_listening, listening_uri, callgrind_pair, cg_total

echo "== TCP on loopback: rdmarpc_bench next to tcp_pingpong and gRPC C++ (grpc_bench)"
$bin/rdmarpc_bench --server --listen tcp://127.0.0.1:0 >"$res/srv.log" 2>&1 &
srv=$!
$bin/tcp_pingpong --server --port 7495 >"$res/pp.log" 2>&1 &
pp=$!
$bin/grpc_bench --server >"$res/grpc.log" 2>&1 &
gs=$!
wait_listening "$res/srv.log"; wait_listening "$res/pp.log"; wait_listening "$res/grpc.log"
target=$(sed -n 's/^listening on //p' "$res/srv.log")
grpc_target=$(sed -n 's/^listening on //p' "$res/grpc.log")
for depth in 1 32; do
  sizes="64 4096 65536 1048576"
  [ "$depth" = 32 ] && sizes="64"
  for size in $sizes; do
    # Three interleaved rounds: this machine's speed drifts by 2x within minutes (a 1 MiB raw
    # round trip measured 470 us and 1,810 us in one session), so one round of each can compare
    # a fast moment with a slow one. report.py shows the round with the median ratio.
    for round in 1 2 3; do
      r=$($bin/rdmarpc_bench --target "$target" --request-bytes "$size" --depth "$depth" \
          --duration 3 --warmup 1 --json)
      p=$($bin/tcp_pingpong --port 7495 --bytes "$size" --depth "$depth" --duration 3 --warmup 1 --json)
      g=$($bin/grpc_bench --target "$grpc_target" --request-bytes "$size" --depth "$depth" \
          --duration 3 --warmup 1 --json)
      echo "{\"kind\":\"tcp_round\",\"round\":$round,\"bytes\":$size,\"depth\":$depth,\"rdmarpc\":$r,\"raw\":$p,\"grpc\":$g}" >> "$res/tcp.jsonl"
      echo "  $size B depth $depth round $round: rdmarpc p50 $(echo "$r" | sed 's/.*"p50_us":\([0-9.]*\).*/\1/') us, raw p50 $(echo "$p" | sed 's/.*"p50_us":\([0-9.]*\).*/\1/') us, gRPC p50 $(echo "$g" | sed 's/.*"p50_us":\([0-9.]*\).*/\1/') us"
    done
  done
done
r=$($bin/rdmarpc_bench --target "$target" --request-bytes 1048576 --response-bytes 0 \
    --depth 4 --duration 3 --warmup 1 --json)
echo "{\"kind\":\"tcp_throughput\",\"rdmarpc\":$r}" >> "$res/tcp.jsonl"
# Streams, next to gRPC C++ streaming the same messages: a server stream read as fast as it
# comes (report.py sets it beside unary calls of the same size), then a client stream written as
# fast as the server's window lets it go (--upload).
for kind in stream upload; do
  bytes_flag=--response-bytes
  [ "$kind" = upload ] && bytes_flag=--request-bytes
  for size in 64 65536; do
    r=$($bin/rdmarpc_bench --target "$target" --$kind $bytes_flag "$size" --duration 3 \
        --warmup 1 --json)
    g=$($bin/grpc_bench --target "$grpc_target" --$kind $bytes_flag "$size" --duration 3 \
        --warmup 1 --json)
    echo "{\"kind\":\"$kind\",\"transport\":\"tcp\",\"bytes\":$size,\"result\":$r,\"grpc\":$g}" >> "$res/tcp.jsonl"
    echo "  $kind of $size B: $(echo "$r" | sed 's/.*"messages_per_s":\([0-9.]*\).*/\1/') messages/s, gRPC $(echo "$g" | sed 's/.*"messages_per_s":\([0-9.]*\).*/\1/')"
  done
done

echo "== memory per idle connection and connection count (TCP)"
for n in 1000 10000 19000; do
  r=$($bin/rdmarpc_bench --target "$target" --idle-connections "$n" --json || true)
  echo "{\"kind\":\"tcp_idle\",\"result\":$r}" >> "$res/tcp.jsonl"
done
kill "$srv" "$pp" "$gs"; wait "$srv" "$pp" "$gs" 2>/dev/null || true

# cpu_rows PREFIX EXTRA: cpu.jsonl's two rows (client, server) of the callgrind_pair run PREFIX;
# EXTRA: JSON fields that mark the run (empty for the plain echo).
cpu_rows() {
  local side i1 i2
  for side in client server; do
    i1=$(cg_total "$1$side.2000.cg")
    i2=$(cg_total "$1$side.12000.cg")
    # Sleeps of the event loop per call (see cg_calls): the count depends on them.
    echo "{\"kind\":\"callgrind\"$2,\"side\":\"$side\",\"ir_2000\":$i1,\"ir_12000\":$i2,\"ir_per_call\":$(( (i2 - i1) / 10000 )),\"epoll_waits_per_call\":$(cg_sleeps_per_call "$1" "$side")}" >> "$res/cpu.jsonl"
  done
}

echo "== CPU cost: instructions per call (callgrind), 64 B echo over TCP, set-up excluded"
# Run each side twice, with 2,000 and 12,000 calls; the difference / 10,000 is the cost per call
# with connection set-up, start and exit cancelled out.
callgrind_pair $bin/rdmarpc_bench "$res/"
cpu_rows "$res/" ""
for side in client server; do
  callgrind_annotate "$res/$side.12000.cg" 2>/dev/null | grep -E '^ *[0-9,]+ \(' |
    grep -v 'PROGRAM TOTALS' | awk 'NR <= 15' > "$res/$side.top.txt"
done
# The same with the fast forms on both sides, rows marked "handler" and "client": the echo
# served by an inline handler (option (rdmarpc.inline_handler), rpc/options.proto:
# rdmarpc_bench --inline-handler calls CallInline), and called through the stub's
# completion-token form with asio::deferred (--deferred: no coroutine frame per call).
callgrind_pair $bin/rdmarpc_bench "$res/inline." --inline-handler --deferred
cpu_rows "$res/inline." ',"handler":"inline","client":"deferred"'

echo "== metrics overhead: --metrics off and on, interleaved (tools/bench/metrics_overhead.sh)"
bash tools/bench/metrics_overhead.sh 11 >"$res/metrics_overhead.md"

echo "== RDMA in the Soft-RoCE VM (perftest and rdmarpc_bench, same device, same boot)"
# 8 GiB: 10,000 connections, with their client in the same guest (rxe maps each queue pair's
# queues into the process: about 380 KiB resident per connection and side).
bash tools/vm/rxe_vm.sh --timeout 1500 --mem 8G --share "$res" -- bash tools/bench/vm_bench.sh "$res"

echo "== report"
mkdir -p docs/bench
cp "$res"/*.jsonl "$res"/*.top.txt "$res"/metrics_overhead.md docs/bench/
if ls "$res"/stuck_server.*.txt >/dev/null 2>&1; then
  cp "$res"/stuck_server.*.txt docs/bench/
  echo "WARNING: a server did not exit on SIGTERM in the VM; stacks in docs/bench/stuck_server.*.txt"
fi
python3 tools/bench/report.py docs/bench docs/BENCHMARKS.md
echo "wrote docs/BENCHMARKS.md and docs/bench/"

#!/usr/bin/env bash
# What metrics cost on the call path: the same rdmarpc_bench binary with and without --metrics
# (a Metrics registry's interceptors on the server and the client), over TCP on loopback.
#   1. Interleaved rounds, the order alternating (off then on, on then off: a fixed order puts
#      any drift within a round on one side): 64 B at depth 1 (p50 latency) and at depth 32
#      (calls/s); medians and on/off ratios. Then a control, half as many rounds with metrics off
#      in both arms: how far two identical arms differ, the noise the ratios are read against.
#   2. Instructions per call (callgrind; 2,000 vs 12,000 calls, set-up cancelled out) on each
#      side, off and on: deterministic, so a few instructions show where timing noise would not.
# Writes a markdown table to stdout. Usage: tools/bench/metrics_overhead.sh [ROUNDS]
# (bazel build -c opt //tools/bench:rdmarpc_bench first; run from the repository root).
set -euo pipefail
rounds=${1:-7}
bin=bazel-bin/tools/bench/rdmarpc_bench
res=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$res"' EXIT

. tools/bench/lib.sh  # wait_listening, listening_uri, callgrind_pair, cg_per_call, cg_sleeps_per_call

arm() {  # mode (off, on, control1, control2): one fresh server, depth 1 then depth 32
  local mode=$1 flags=() srv target d1 d32
  [ "$mode" = on ] && flags=(--metrics)
  $bin --server --listen tcp://127.0.0.1:0 "${flags[@]}" >"$res/srv.log" 2>&1 &
  srv=$!
  wait_listening "$res/srv.log"
  target=$(listening_uri "$res/srv.log")
  d1=$($bin --target "$target" --duration 3 --warmup 1 --json "${flags[@]}")
  d32=$($bin --target "$target" --depth 32 --duration 3 --warmup 1 --json "${flags[@]}")
  kill -TERM "$srv"; wait "$srv" || true
  echo "{\"mode\":\"$mode\",\"d1\":$d1,\"d32\":$d32}" >>"$res/rounds.jsonl"
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then arm off; arm on; else arm on; arm off; fi
done
for r in $(seq $(((rounds + 1) / 2))); do
  arm control1
  arm control2
done

for mode in off on; do
  flags=()
  [ "$mode" = on ] && flags=(--metrics)
  callgrind_pair "$bin" "$res/$mode." "${flags[@]}"
  for side in client server; do
    # The event loop's sleeps per call move the count (~600 each, see cg_calls): recorded so
    # that an on/off difference that is really a difference in sleeps shows as such.
    echo "{\"mode\":\"$mode\",\"side\":\"$side\",\"per_call\":$(cg_per_call "$res/$mode." "$side"),\"waits\":$(cg_sleeps_per_call "$res/$mode." "$side")}" >>"$res/cg.jsonl"
  done
done

python3 - "$res" "$rounds" <<'PY'
import json, statistics, sys
res, rounds = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{res}/rounds.jsonl")]
cgrows = [json.loads(l) for l in open(f"{res}/cg.jsonl")]
cg = {(c["mode"], c["side"]): c["per_call"] for c in cgrows}
waits = {(c["mode"], c["side"]): c["waits"] for c in cgrows}
med = lambda mode, key, field: statistics.median(r[key][field] for r in rows if r["mode"] == mode)
vals = lambda mode, key, field: [r[key][field] for r in rows if r["mode"] == mode]
print(f"| 64 B over TCP ({rounds} interleaved rounds, order alternating, medians) | metrics off | metrics on | on / off "
      "| off: min - max | on: min - max |")
print("| --- | --- | --- | --- | --- | --- |")
for label, key, field, fmt in [("depth 1, p50 latency (us)", "d1", "p50_us", "{:.1f}"),
                               ("depth 1, calls/s", "d1", "calls_per_s", "{:,.0f}"),
                               ("depth 32, calls/s", "d32", "calls_per_s", "{:,.0f}"),
                               ("depth 32, p50 latency (us)", "d32", "p50_us", "{:.1f}")]:
    off, on = med("off", key, field), med("on", key, field)
    spread = lambda mode: " - ".join(fmt.format(f(vals(mode, key, field))) for f in (min, max))
    print(f"| {label} | {fmt.format(off)} | {fmt.format(on)} | {on / off:.3f} "
          f"| {spread('off')} | {spread('on')} |")
for label, key, field, fmt in [("depth 1, p50 latency (us)", "d1", "p50_us", "{:.1f}"),
                               ("depth 32, calls/s", "d32", "calls_per_s", "{:,.0f}")]:
    a, b = med("control1", key, field), med("control2", key, field)
    n = len(vals("control1", key, field))
    spread = lambda mode: " - ".join(fmt.format(f(vals(mode, key, field))) for f in (min, max))
    print(f"| control, metrics off in both arms ({n} rounds): {label} | {fmt.format(a)} "
          f"| {fmt.format(b)} (off again) | {b / a:.3f} | {spread('control1')} "
          f"| {spread('control2')} |")
for side in ("client", "server"):
    off, on = cg[("off", side)], cg[("on", side)]
    print(f"| instructions per call, {side} (callgrind; epoll_wait per call "
          f"{waits[('off', side)]:.2f} off, {waits[('on', side)]:.2f} on) | {off:,} | {on:,} "
          f"| {on / off:.3f} (+{on - off}) | | |")
PY

#!/usr/bin/env bash
# How much of a small TCP round trip is the server's way of waiting for and reading its next
# message: tcp_wait_probe's read paths (see tools/bench/tcp_wait_probe.cc) against the same
# blocking tcp_pingpong client, in interleaved rounds (this machine's speed moves from minute to
# minute: compare within a round). Prints each round, then per mode the median over the rounds
# of p50 / epoll's p50 and CPU per message / epoll's, and the probe's wait counts.
# Usage (repository root): tools/bench/tcp_wait_ab.sh [ROUNDS] [BYTES]
set -euo pipefail
rounds=${1:-7}
bytes=${2:-64}
bazel build -c opt --config=ci //tools/bench:tcp_wait_probe //tools/bench:tcp_pingpong >/dev/null 2>&1
probe=bazel-bin/tools/bench/tcp_wait_probe
pingpong=bazel-bin/tools/bench/tcp_pingpong
res=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$res"' EXIT
. tools/bench/lib.sh # wait_listening, listening_uri

modes=(blocking epoll uring-eventfd uring-oneshot uring-wait)
for r in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do
    $probe --mode "$mode" >"$res/probe.log" 2>&1 &
    pid=$!
    wait_listening "$res/probe.log"
    port=$(listening_uri "$res/probe.log" | sed 's/.*://')
    client=$($pingpong --port "$port" --bytes "$bytes" --duration 3 --warmup 1 --json) || true
    if ! wait "$pid"; then
      # A probe that stalled (tcp_wait_probe.cc, Uring::Stalled: exit 3) or failed: the round
      # goes without that mode.
      echo "round $r: $mode left out: $(grep -v '^listening' "$res/probe.log")" >&2
      continue
    fi
    server=$(grep '^{' "$res/probe.log")
    echo "{\"round\":$r,\"client\":$client,\"server\":$server}" | tee -a "$res/rounds.jsonl"
  done
done

python3 - "$res/rounds.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by_round = {}
for r in rows:
    by_round.setdefault(r["round"], {})[r["server"]["mode"]] = r
modes = []
for r in rows:
    if r["server"]["mode"] not in modes:
        modes.append(r["server"]["mode"])
print()
print("| server read path | p50 / epoll's (median of rounds) | CPU per message / epoll's | p50 us (median) | CPU us per message (median) | waits per message | EINTR per message |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for m in modes:
    # (this mode's run, epoll's run) of each round that has both
    pairs = [(x[m], x["epoll"]) for x in by_round.values() if m in x and "epoll" in x]
    lat = [a["client"]["p50_us"] / e["client"]["p50_us"] for a, e in pairs]
    cpu = [a["server"]["cpu_us_per_message"] / e["server"]["cpu_us_per_message"] for a, e in pairs]
    med = lambda k, s="client": statistics.median(a[s][k] for a, _ in pairs)
    print(f"| {m} | {statistics.median(lat):.3f} | {statistics.median(cpu):.3f} | {med('p50_us'):.1f} | {med('cpu_us_per_message','server'):.2f} | {med('waits_per_message','server'):.3f} | {med('eintr_per_message','server'):.3f} |")
PY

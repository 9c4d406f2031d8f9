#!/usr/bin/env bash
# Runs inside the Soft-RoCE guest (started by tools/bench/run_all.sh): perftest's raw verbs
# figures and rdmarpc_bench on the same rxe0 device in the same boot, one JSON line per
# measurement into $1/rdma.jsonl. Sizes and durations are kept small: the guest CPU is emulated.
set -uo pipefail
# The results directory, kept by name: `set -- $line` below reuses the positional parameters.
dir="$1"
out="$dir/rdma.jsonl"
bin=bazel-bin/tools/bench
addr="$RXE_ADDR"
: > "$out"
echo "{\"kind\":\"vm\",\"mem_mib\":$(free -m | awk '/^Mem:/{print $2}')}" >> "$out"
# One descriptor per connection on each side (its CM event channel); rdmarpc_bench raises its soft
# limit to this hard one.
ulimit -Hn 65536

# perftest prints a header line starting with " #bytes" and then one data line per size.
perf_line() {  # tool size iters extra... -> the data line
  local tool=$1 size=$2 iters=$3; shift 3
  "$tool" -d rxe0 -x 1 -s "$size" -n "$iters" -F "$@" >/dev/null 2>&1 &
  local server=$!
  sleep 1
  "$tool" -d rxe0 -x 1 -s "$size" -n "$iters" -F "$@" "$addr" 2>/dev/null |
    awk '/^ *#bytes/{getline; print; exit}'
  wait "$server" 2>/dev/null
}

# SIGTERM, and a server that has not exited 30 s later is recorded (with its threads' stacks in
# $1/stuck_server.<mode>.txt) and killed, so that one stuck shutdown cannot eat the whole run.
stop_server() {  # pid mode
  kill "$1" 2>/dev/null
  for _ in $(seq 150); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$1" 2>/dev/null; then
    echo "{\"kind\":\"rdmarpc\",\"test\":\"stuck_shutdown\",\"mode\":\"$2\"}" >> "$out"
    gdb -p "$1" -batch -ex 'thread apply all bt 20' > "$dir/stuck_server.$2.txt" 2>&1
    kill -9 "$1"
  fi
  wait "$1" 2>/dev/null
}

# The polling mode's flags, for server and client alike: busy-poll (--busy-poll), adaptive (the
# default: none) or pure events (--poll-spin-us 0). Sets the array `flags`.
mode_flags() {
  flags=()
  case "$1" in
    busy-poll) flags=(--busy-poll) ;;
    events) flags=(--poll-spin-us 0) ;;
  esac
}

# start_server FLAG...: a fresh rdmarpc_bench server on rdma://$addr:7490, its pid in $server.
start_server() {
  $bin/rdmarpc_bench --server --listen "rdma://$addr:7490" "$@" >/dev/null 2>&1 &
  server=$!
  sleep 1
}

# run_client FLAG...: one rdmarpc_bench client run against that server (with --json: its
# result, one line of JSON, on stdout). Not for a client run in the background whose CPU time
# is read: $! would be the shell running the function, not rdmarpc_bench.
run_client() { $bin/rdmarpc_bench --target "rdma://$addr:7490" "$@"; }

# json_field NAME: the number named NAME in the JSON on stdin (nothing when it is absent).
json_field() { grep -o "\"$1\":[0-9.]*" | cut -d: -f2; }

for size in 64 4096 65536 1048576; do
  iters=2000
  [ "$size" -ge 65536 ] && iters=200
  for tool in ib_send_lat ib_write_lat; do
    # Columns: bytes iterations t_min t_max t_typical t_avg t_stdev p99 p99.9 (half round trips).
    line=$(perf_line "$tool" "$size" "$iters")
    set -- $line
    [ $# -ge 6 ] && echo "{\"kind\":\"perftest\",\"tool\":\"$tool\",\"bytes\":$size,\"half_rtt_typical_us\":$5,\"half_rtt_avg_us\":$6}" >> "$out"
  done
done

line=$(perf_line ib_write_bw 1048576 500)
set -- $line
[ $# -ge 4 ] && echo "{\"kind\":\"perftest\",\"tool\":\"ib_write_bw\",\"bytes\":1048576,\"mb_per_s\":$4}" >> "$out"

# Three polling modes: busy-poll (--busy-poll), adaptive (the default: no flag) and pure events
# (--poll-spin-us 0). After each mode's runs, one client holds one connection open without
# calling, and the CPU time of both processes over 10 s is recorded (utime + stime, in ticks).
for mode in busy-poll adaptive events; do
  mode_flags "$mode"
  start_server "${flags[@]}"
  for size in 64 4096 65536 1048576; do
    r=$(run_client "${flags[@]}" --request-bytes "$size" --duration 3 --warmup 1 --json)
    echo "{\"kind\":\"rdmarpc\",\"mode\":\"$mode\",\"test\":\"latency\",\"result\":$r}" >> "$out"
  done
  r=$(run_client "${flags[@]}" --request-bytes 1048576 --response-bytes 0 --depth 4 --duration 5 \
      --warmup 1 --json)
  echo "{\"kind\":\"rdmarpc\",\"mode\":\"$mode\",\"test\":\"throughput\",\"result\":$r}" >> "$out"
  # Streams: a server stream read as fast as it comes, a client stream written as fast as the
  # server's window lets it go (--upload).
  for kind in stream upload; do
    bytes_flag=--response-bytes
    [ "$kind" = upload ] && bytes_flag=--request-bytes
    for size in 64 65536; do
      r=$(run_client "${flags[@]}" --$kind $bytes_flag "$size" --duration 3 --warmup 1 --json)
      echo "{\"kind\":\"$kind\",\"transport\":\"rdma\",\"mode\":\"$mode\",\"bytes\":$size,\"result\":$r}" >> "$out"
    done
  done
  $bin/rdmarpc_bench --target "rdma://$addr:7490" "${flags[@]}" --idle-connections 1 --hold 13 \
    --idle-settle 0 --json >/dev/null 2>&1 &
  client=$!
  sleep 2
  cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
  s0=$(cpu "$server"); c0=$(cpu "$client")
  sleep 10
  s1=$(cpu "$server"); c1=$(cpu "$client")
  wait "$client"
  echo "{\"kind\":\"rdmarpc\",\"mode\":\"$mode\",\"test\":\"idle_cpu\",\"seconds\":10,\"ticks\":$((s1 - s0)),\"client_ticks\":$((c1 - c0)),\"ticks_per_s\":$(getconf CLK_TCK)}" >> "$out"
  stop_server "$server" "$mode"
done

# The latency targets again, as interleaved rounds: under TCG perftest's round trip moves from
# boot to boot and within a boot, so each round measures ib_write_lat and rdmarpc_bench (a fresh
# server each) side by side, and report.py judges the targets by the median of the rounds'
# ratios. One JSON line per measurement, kind "round".
for round in 1 2 3; do
  for size in 64 4096; do
    line=$(perf_line ib_write_lat "$size" 2000)
    set -- $line
    [ $# -ge 6 ] && echo "{\"kind\":\"round\",\"round\":$round,\"bytes\":$size,\"what\":\"ib_write_lat\",\"rtt_us\":$(awk -v h="$5" 'BEGIN { printf "%.2f", 2 * h }')}" >> "$out"
    # MODE-fast: the same polling with the fast forms (the echo served by an inline handler and
    # called with asio::deferred: rdmarpc_bench --inline-handler --deferred), 64 B only.
    for mode in busy-poll adaptive busy-poll-fast adaptive-fast; do
      [ "$size" = 4096 ] && [ "$mode" != busy-poll ] && continue  # no target for it
      fast=()
      [ "$mode" != "${mode%-fast}" ] && fast=(--inline-handler --deferred)
      mode_flags "${mode%-fast}"
      start_server "${flags[@]}"
      p50=$(run_client "${flags[@]}" "${fast[@]}" --request-bytes "$size" --duration 3 \
            --warmup 1 --json | json_field p50_us)
      [ -n "$p50" ] && echo "{\"kind\":\"round\",\"round\":$round,\"bytes\":$size,\"what\":\"$mode\",\"rtt_us\":$p50}" >> "$out"
      stop_server "$server" "$mode"
    done
  done
done

# What metrics cost over rdma:// (the same binary with and without --metrics on both sides; the
# host's tools/bench/metrics_overhead.sh measures it over TCP): busy-poll, 64 B, depth 1 (p50)
# and depth 32 (calls/s), a fresh server for each arm (about 10 s an arm). 8 rounds, the order
# alternating (off then on, on then off: a fixed order puts any drift within a round on one
# side), kind "metrics_round"; then 4 rounds of off against off
# (kind "metrics_control", arms "first" and "second"): how far two identical arms differ in
# this boot, the noise an on/off ratio is to be read against.
metrics_arm() {  # kind round label FLAG...
  local kind=$1 round=$2 label=$3 field=metrics p50 cps
  shift 3
  [ "$kind" = metrics_control ] && field=arm
  start_server "$@"
  p50=$(run_client "$@" --request-bytes 64 --duration 3 --warmup 1 --json | json_field p50_us)
  cps=$(run_client "$@" --request-bytes 64 --depth 32 --duration 3 --warmup 1 --json |
        json_field calls_per_s)
  [ -n "$p50" ] && [ -n "$cps" ] && echo "{\"kind\":\"$kind\",\"round\":$round,\"$field\":\"$label\",\"p50_us\":$p50,\"depth32_calls_per_s\":$cps}" >> "$out"
  stop_server "$server" "busy-poll"
}
for round in 1 2 3 4 5 6 7 8; do
  if [ $((round % 2)) = 1 ]; then
    metrics_arm metrics_round $round off --busy-poll
    metrics_arm metrics_round $round on --busy-poll --metrics
  else
    metrics_arm metrics_round $round on --busy-poll --metrics
    metrics_arm metrics_round $round off --busy-poll
  fi
done
for round in 1 2 3 4; do
  metrics_arm metrics_control $round first --busy-poll
  metrics_arm metrics_control $round second --busy-poll
done

# CPU cost per call over rdma://, as the host's TCP figure is measured: both sides under
# callgrind, 200 and 1,200 calls, (difference) / 1,000. Events mode (--poll-spin-us 0): with
# adaptive polling, callgrind would also count the polling done while waiting for the peer,
# which under valgrind takes milliseconds to answer. The client's connect timeout is raised:
# the server under callgrind takes longer than 5 s to set up its device state. --no-latency: the
# bench's own timing of each call is not counted (as on the host, tools/bench/lib.sh).
. tools/bench/lib.sh  # cg_total, cg_sleeps
# Then the same with --metrics on both sides ("metrics":true), for what metrics cost per call,
# and with the fast forms ("handler":"inline","client":"deferred": the echo served by an inline
# handler, rpc/options.proto, and called with asio::deferred; rdmarpc_bench --inline-handler
# --deferred).
cgdir=$(mktemp -d)
for variant in off on inline; do
  mflag=()
  cflag=()
  [ "$variant" = on ] && mflag=(--metrics)
  [ "$variant" = inline ] && cflag=(--inline-handler --deferred)
  for n in 200 1200; do
    valgrind --tool=callgrind --callgrind-out-file="$cgdir/server.$n" $bin/rdmarpc_bench --server \
      --listen "rdma://$addr:7490" --poll-spin-us 0 "${mflag[@]}" >"$cgdir/server.log" 2>&1 &
    server=$!
    for _ in $(seq 600); do grep -q "listening on" "$cgdir/server.log" && break; sleep 0.2; done
    valgrind --tool=callgrind --callgrind-out-file="$cgdir/client.$n" $bin/rdmarpc_bench \
      --target "rdma://$addr:7490" --poll-spin-us 0 "${mflag[@]}" "${cflag[@]}" --connect-timeout-ms 120000 \
      --calls "$n" --warmup 0 --quiet --no-latency >/dev/null 2>&1
    kill -TERM "$server"; wait "$server" 2>/dev/null
  done
  extra=""
  [ "$variant" = on ] && extra=",\"metrics\":true"
  [ "$variant" = inline ] && extra=",\"handler\":\"inline\",\"client\":\"deferred\""
  for side in client server; do
    a=$(cg_total "$cgdir/$side.200"); b=$(cg_total "$cgdir/$side.1200")
    wa=$(cg_sleeps "$cgdir/$side.200"); wb=$(cg_sleeps "$cgdir/$side.1200")
    [ -n "$a" ] && [ -n "$b" ] && echo "{\"kind\":\"rdmarpc\",\"test\":\"callgrind\",\"mode\":\"events\",\"side\":\"$side\",\"ir_per_call\":$(( (b - a) / 1000 )),\"epoll_waits_per_call\":$(awk -v a="$wa" -v b="$wb" 'BEGIN { printf "%.2f", (b - a) / 1000 }')$extra}" >> "$out"
  done
  rm -f "$cgdir"/*
done
rm -rf "$cgdir"

# Connections one server holds: a fresh server per count, since a count past the guest's memory
# gets a process killed (the out-of-memory killer); that run is recorded with its error. The client
# opens 16 at a time (rdmarpc_bench's --connect-window default): 10,000 took 178 s under emulation
# (2026-12-03, a boot with ib_write_lat 64 B at ~80 us), one at a time they ran past the limit below
# in a slow boot; 1,000 took 29 s one at a time and 16 s at 16.
for n in 100 1000 10000; do
  start_server
  started=$(date +%s)
  r=$(timeout 600 $bin/rdmarpc_bench --target "rdma://$addr:7490" --idle-connections "$n" \
      --connect-timeout-ms 60000 --json 2>"$dir/idle_client.err")
  rc=$?
  alive=yes
  kill -0 "$server" 2>/dev/null || alive=no
  # Say why there is no result: a slow boot runs into the time limit (exit 124), the
  # out-of-memory killer ends the client with SIGKILL (137), anything else is the client's own
  # error (its last line of stderr).
  case "$rc" in
    124) why="did not finish within 600 s (timeout; this boot may be slower, see ib_write_lat)" ;;
    137) why="client killed (SIGKILL: out of memory?)" ;;
    *) why="client exited with status $rc: $(tail -n 1 "$dir/idle_client.err" | tr -d '"\\' | cut -c1-200)" ;;
  esac
  [ -n "$r" ] || r="{\"idle_connections_asked\":$n,\"opened\":0,\"failed_calls\":0,\"client_bytes_per_connection\":0,\"server_bytes_per_connection\":0,\"seconds\":$(( $(date +%s) - started )),\"error\":\"$why; server alive: $alive\"}"
  echo "{\"kind\":\"rdmarpc\",\"test\":\"idle\",\"server_alive\":\"$alive\",\"result\":$r}" >> "$out"
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
done
rm -f "$dir/idle_client.err"
echo "vm_bench: $(wc -l < "$out") results"

# Helpers the benchmark scripts share; source it from the repository root:
#   . tools/bench/lib.sh

# wait_listening LOG: waits up to 10 s for a server whose output goes to LOG to print
# "listening on ..."; fails, showing that output, if it does not.
wait_listening() {
  for _ in $(seq 200); do grep -q "listening on" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "server did not start: $(cat "$1")" >&2
  return 1
}

# listening_uri LOG: the address the server in LOG printed.
listening_uri() { sed -n 's/^listening on //p' "$1"; }

# cg_total FILE: a callgrind profile's total instruction count.
cg_total() { callgrind_annotate "$1" | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}'; }

# cg_calls FILE FUNCTION: how many times a callgrind profile's program called FUNCTION (an exact
# symbol name, e.g. epoll_wait), from the call records of the raw profile. Instructions per call
# depend on it: each time the event loop sleeps in epoll_wait it pays the sleep, the reactor's
# turn and a scheduler round (about 600 instructions), and how often a depth-1 call finds its
# reply already there, rather than sleeping for it, depends on how the two processes were
# scheduled (machine load), not on the code. So the figures are reported with their sleeps.
cg_calls() {
  awk -v want="$2" '
    /^c?fn=\(/ {
      id = $0; sub(/^c?fn=\(/, "", id); sub(/\).*/, "", id)
      name = $0; sub(/^c?fn=\([0-9]+\) ?/, "", name)
      if (name != "") names[id] = name
      if ($0 ~ /^cfn=/) callee = names[id]
      next
    }
    /^calls=/ { n = $0; sub(/^calls=/, "", n); sub(/ .*/, "", n); if (callee == want) total += n }
    END { print total + 0 }' "$1"
}

# cg_sleeps FILE: how many times the profile's event loops slept: rdmarpc's own loop waits in
# LoopEpollWait (a raw system call, transport/poller.cc), Asio's run() in glibc's epoll_wait.
cg_sleeps() {
  echo $(($(cg_calls "$1" epoll_wait) + $(cg_calls "$1" \
    'rdmarpc::transport::(anonymous namespace)::LoopEpollWait(int, epoll_event*, int, int)')))
}

# callgrind_pair BENCH PREFIX [FLAG...]: runs rdmarpc_bench (the binary BENCH) as server and
# client over TCP on loopback under callgrind, twice, with 2,000 and 12,000 calls, FLAGs given to
# both; writes PREFIX{server,client}.{2000,12000}.cg. The difference of the two runs / 10,000 is
# the cost of one call with connection set-up, start and exit cancelled out (cg_per_call). The
# client runs with --no-latency: the bench's own timing of each call (two clock reads and a
# histogram record) is not rdmarpc's cost.
callgrind_pair() {
  local bench=$1 prefix=$2 n srv
  shift 2
  # Under valgrind rdmarpc's TCP connections take the readiness path (epoll_wait, recv), not
  # io_uring (transport/poller.cc): that is what this counts. RDMARPC_IO_URING=1 in the caller's
  # environment counts the io_uring path instead, whose idle wake-ups under valgrind (one every
  # 10 ms) make its sleeps per call meaningless.
  for n in 2000 12000; do
    valgrind --tool=callgrind --callgrind-out-file="${prefix}server.$n.cg" \
      "$bench" --server --listen tcp://127.0.0.1:0 "$@" >"${prefix}cgsrv.log" 2>&1 &
    srv=$!
    wait_listening "${prefix}cgsrv.log"
    valgrind --tool=callgrind --callgrind-out-file="${prefix}client.$n.cg" \
      "$bench" --target "$(listening_uri "${prefix}cgsrv.log")" --calls "$n" --warmup 0 --quiet --no-latency \
      "$@" >/dev/null 2>&1
    kill -TERM "$srv"
    wait "$srv" || true
  done
}

# cg_per_call PREFIX SIDE: instructions per call of SIDE (server or client) from callgrind_pair.
cg_per_call() {
  local a b
  a=$(cg_total "$1$2.2000.cg")
  b=$(cg_total "$1$2.12000.cg")
  echo $(((b - a) / 10000))
}

# cg_sleeps_per_call PREFIX SIDE: the event loop's sleeps (epoll_wait calls, cg_sleeps) per call
# of SIDE from callgrind_pair (two decimals): the sleeps its instruction count includes (see
# cg_calls).
cg_sleeps_per_call() {
  local a b
  a=$(cg_sleeps "$1$2.2000.cg")
  b=$(cg_sleeps "$1$2.12000.cg")
  awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (b - a) / 10000 }'
}

#!/usr/bin/env bash
# Soak: one million calls at 256 outstanding over each transport (TCP on loopback; RDMA in the
# Soft-RoCE VM), every request unique and every reply checked to be its own echo. Prints, per
# transport, failed (lost) and mismatched (crossed or duplicated) replies, which must both be 0,
# and client/server RSS at start and end. Exit 0 only if both transports are clean.
#
#   tools/soak.sh [CALLS]        # default 1000000; about 2 min for TCP, 2-4 min in the VM
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
bin=bazel-bin/tools/bench/rdmarpc_bench
inside_vm=0
if [ "${1:-}" = --inside-vm ]; then inside_vm=1; shift; fi  # the RDMA half, run in the VM below
calls="${1:-1000000}"
args="--calls $calls --depth 256 --request-bytes 64 --verify --warmup 0 --json"

run_one() {  # listen-uri -> one JSON line
  local log
  log=$(mktemp)
  $bin --server --listen "$1" >"$log" 2>&1 &
  local srv=$!
  for _ in $(seq 200); do grep -q "^listening on" "$log" && break; sleep 0.05; done
  $bin --target "$(sed -n 's/^listening on //p' "$log")" $args
  kill "$srv"; wait "$srv" 2>/dev/null
  rm -f "$log"
}

if [ "$inside_vm" = 1 ]; then
  run_one "rdma://$RXE_ADDR:0"
  exit 0
fi
bazel build //tools/bench:rdmarpc_bench >/dev/null 2>&1 || bazel build //tools/bench:rdmarpc_bench || exit 1

rc=0
check() {  # name json
  echo "$1: $2"
  echo "$2" | grep -q '"failed":0,' && echo "$2" | grep -q '"mismatched":0,' || { echo "$1: NOT CLEAN"; rc=1; }
}
check tcp "$(run_one tcp://127.0.0.1:0)"
rdma=$(bash tools/vm/rxe_vm.sh --timeout 900 -- bash tools/soak.sh --inside-vm "$calls" | grep '^{')
check rdma "$rdma"
exit "$rc"

#!/usr/bin/env bash
# A/B of the TCP fast path between an earlier revision and the working tree: builds REV's
# benchmark tools in a git worktree (/var/tmp/rdmarpc-ab/REV), then runs each build's
# rdmarpc_bench client against its own server, alternating A and B for ROUNDS rounds (these
# machines are noisy: medians and ratios, never one run), and counts instructions per call with
# callgrind. Prints a Markdown table; writes nothing else.
#
#   tools/bench/ab.sh REV [ROUNDS]        e.g. tools/bench/ab.sh 90517b0 3
set -euo pipefail
case "${1:-}" in
  -h|--help|"") sed -n '2,9p' "$0"; [ -n "${1:-}" ]; exit $? ;;
esac
rev=$1
rounds=${2:-3}
cd "$(dirname "$0")/../.."
root=$(pwd)
old="/var/tmp/rdmarpc-ab/$rev"
if [ ! -d "$old" ]; then
  mkdir -p /var/tmp/rdmarpc-ab
  git worktree add --detach "$old" "$rev" >/dev/null
fi
(cd "$old" && bazel build -c opt //tools/bench:rdmarpc_bench >/dev/null 2>&1) ||
  { echo "ab.sh: cannot build $rev"; exit 1; }
bazel build //tools/bench:rdmarpc_bench >/dev/null 2>&1 || { echo "ab.sh: cannot build the working tree"; exit 1; }
declare -A bin=([A]="$old/bazel-bin/tools/bench/rdmarpc_bench" [B]="$root/bazel-bin/tools/bench/rdmarpc_bench")
tmp=$(mktemp -d)
trap 'jobs -p | xargs -r kill 2>/dev/null; rm -rf "$tmp"' EXIT

serve() {  # side logfile [valgrind...] -> prints the target
  local side=$1 log=$2
  shift 2
  "$@" "${bin[$side]}" --server --listen tcp://127.0.0.1:0 >"$log" 2>&1 &
  echo $! >"$log.pid"
  for _ in $(seq 400); do grep -q "listening on" "$log" 2>/dev/null && break; sleep 0.05; done
  sed -n 's/^listening on //p' "$log"
}
field() { sed 's/.*"'"$2"'":\([0-9.]*\).*/\1/' <<<"$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

cases=("64 1" "64 32" "1048576 1")
for ((r = 1; r <= rounds; r++)); do
  for side in A B; do
    target=$(serve "$side" "$tmp/srv.$side")
    for c in "${cases[@]}"; do
      set -- $c
      out=$("${bin[$side]}" --target "$target" --request-bytes "$1" --depth "$2" --duration 3 --warmup 1 --json)
      echo "$(field "$out" p50_us) $(field "$out" calls_per_s)" >>"$tmp/$side.$1.$2"
    done
    kill "$(cat "$tmp/srv.$side.pid")"; wait 2>/dev/null || true
  done
done
# Instructions per call: two runs per side (2,000 and 12,000 calls); the difference cancels
# set-up and exit.
for side in A B; do
  for n in 2000 12000; do
    target=$(serve "$side" "$tmp/cg.$side" valgrind --tool=callgrind --callgrind-out-file="$tmp/s.$side.$n")
    # --no-latency where the binary has it (older ones time every call; compare like with like).
    nl=()
    "${bin[A]}" --help | grep -q -- --no-latency && "${bin[B]}" --help | grep -q -- --no-latency &&
      nl=(--no-latency)
    valgrind --tool=callgrind --callgrind-out-file="$tmp/c.$side.$n" "${bin[$side]}" --target "$target" \
      --calls "$n" --warmup 0 --quiet "${nl[@]}" >/dev/null 2>&1
    kill -TERM "$(cat "$tmp/cg.$side.pid")"; wait 2>/dev/null || true
  done
done
ir() { callgrind_annotate "$1" | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}'; }
echo "A = $rev, B = working tree ($(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')); $rounds rounds, medians"
echo
echo "| case | A p50 us | B p50 us | B/A | A calls/s | B calls/s | B/A |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for c in "${cases[@]}"; do
  set -- $c
  ap=$(cut -d' ' -f1 "$tmp/A.$1.$2" | median); bp=$(cut -d' ' -f1 "$tmp/B.$1.$2" | median)
  ac=$(cut -d' ' -f2 "$tmp/A.$1.$2" | median); bc=$(cut -d' ' -f2 "$tmp/B.$1.$2" | median)
  printf '| %s B, depth %s | %.1f | %.1f | %s | %.0f | %.0f | %s |\n' "$1" "$2" "$ap" "$bp" \
    "$(ratio "$bp" "$ap")" "$ac" "$bc" "$(ratio "$bc" "$ac")"
done
for s in c s; do
  name=$([ $s = c ] && echo client || echo server)
  a=$(( ($(ir "$tmp/$s.A.12000") - $(ir "$tmp/$s.A.2000")) / 10000 ))
  b=$(( ($(ir "$tmp/$s.B.12000") - $(ir "$tmp/$s.B.2000")) / 10000 ))
  printf '| instructions per call, %s | %d | %d | %s | | | |\n' "$name" "$a" "$b" "$(ratio "$b" "$a")"
done

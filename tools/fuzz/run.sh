#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a set time on its seed
# corpus (tools/fuzz/corpus/<target>/). New interesting inputs go to a scratch copy, not the repo.
# A crash stops with its input saved under $OUT (default /tmp/rdmarpc-fuzz) and exit status 1;
# add that input to the corpus once fixed, so that `bazel test //tools/fuzz:all` replays it.
#
#   bash tools/fuzz/run.sh                 # every target, 60 s each
#   bash tools/fuzz/run.sh --seconds 600 frame
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=60
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=(frame reassembler handshake record decoded)
OUT="${OUT:-${TEST_TMPDIR:-/tmp}/rdmarpc-fuzz}"
mkdir -p "$OUT"
CXX="${CXX:-clang++}"
command -v "$CXX" >/dev/null || { echo "run.sh: $CXX not found (bash tools/setup.sh installs clang)" >&2; exit 2; }
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I.)
declare -A sources=(
  [frame]="tools/fuzz/frame_fuzz.cc rpc/internal/frame.cc"
  [reassembler]="tools/fuzz/reassembler_fuzz.cc"
  [handshake]="tools/fuzz/handshake_fuzz.cc transport/handshake.cc -lcrypto"
  [record]="tools/fuzz/record_fuzz.cc"
  [decoded]="tools/fuzz/decoded_fuzz.cc rpc/internal/decoded_size.cc -lprotobuf"
)
status=0
for t in "${targets[@]}"; do
  [ -n "${sources[$t]:-}" ] || { echo "run.sh: no target '$t' (frame, reassembler, handshake, record, decoded)" >&2; exit 2; }
  bin="$OUT/${t}_fuzz"
  # shellcheck disable=SC2086
  "$CXX" "${flags[@]}" ${sources[$t]} -o "$bin"
  work="$OUT/corpus_$t"
  mkdir -p "$work"
  echo "=== $t: ${seconds} s"
  if "$bin" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$OUT/${t}_" \
      "$work" "tools/fuzz/corpus/$t" >"$OUT/$t.log" 2>&1; then
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$OUT/$t.log" | tr -s ' \n' ' '; echo
    echo "corpus now $(ls "$work" | wc -l) inputs: no crash"
  else
    status=1
    echo "$t: CRASH — see $OUT/$t.log; inputs:"; ls "$OUT/${t}_"* 2>/dev/null || true
    grep -m5 -E "ERROR|SUMMARY|runtime error" "$OUT/$t.log" || tail -20 "$OUT/$t.log"
  fi
done
exit "$status"

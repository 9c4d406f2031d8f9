#!/usr/bin/env bash
# clang-format over every C++ file in the repository (.clang-format: Google style, 100 columns).
#   tools/format.sh           rewrites the files in place
#   tools/format.sh --check   changes nothing; lists the files that are not formatted, exits 1 if any
# --check also refuses a Catch2 assertion (REQUIRE, CHECK, ...) with co_await inside it: the
# macros name their expression in places that are never evaluated, and GCC 12's coroutine
# lowering evaluates a co_await there anyway -- three awaits for one REQUIRE(co_await f()), so
# a test that did a Put or a Read that way did it three times. Await into a local first.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") git ls-files '*.cc' '*.h' | xargs clang-format --style=file -i; exit 0 ;;
  --check) ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "format.sh: unknown option $1 (see tools/format.sh --help)" >&2; exit 2 ;;
esac
bad=0
for f in $(git ls-files '*.cc' '*.h'); do
  if ! clang-format --style=file "$f" | cmp -s - "$f"; then
    echo "not formatted: $f (run tools/format.sh)"
    bad=1
  fi
done
if git ls-files '*.cc' '*.h' | xargs grep -nE \
    '\b(REQUIRE|CHECK|REQUIRE_FALSE|CHECK_FALSE|CHECK_THAT|REQUIRE_THAT|CHECKED_IF|CHECKED_ELSE)\s*\(.*\bco_await\b'; then
  echo "format.sh: co_await inside a Catch2 assertion (above) runs three times under GCC 12:"
  echo "           await into a local, then assert on it"
  bad=1
fi
[ "$bad" -eq 0 ] && echo "format.sh: every C++ file is formatted"
exit $bad

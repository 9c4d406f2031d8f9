#!/usr/bin/env bash
# clang-format over every C++ file in the repository (.clang-format: Google style, 100 columns).
#   tools/format.sh           rewrites the files in place
#   tools/format.sh --check   changes nothing; lists the files that are not formatted, exits 1 if any
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
[ "$bad" -eq 0 ] && echo "format.sh: every C++ file is formatted"
exit $bad

#!/usr/bin/env bash
# The README's complete examples are the files CI builds: every fenced block announced by
# "<!-- the whole of PATH ... -->" must equal PATH byte for byte. Run from the repository root
# (tools/test.sh does); exits non-zero naming each block that drifted.
set -uo pipefail
readme=${1:-README.md}
bad=0
found=0
while IFS= read -r path; do
  found=$((found + 1))
  # The fenced block after the marker, without its ``` lines.
  block=$(awk -v p="$path" '
    index($0, "<!-- the whole of " p " ") == 1 { want = 1; next }
    want == 1 && /^```/ { want = 2; next }
    want == 2 && /^```/ { exit }
    want == 2 { print }' "$readme")
  if [ ! -f "$path" ]; then
    echo "FAIL: README shows $path, which does not exist"
    bad=1
  elif ! diff <(printf '%s\n' "$block") "$path" >/dev/null; then
    echo "FAIL: README's copy of $path differs from the file:"
    diff <(printf '%s\n' "$block") "$path" | head -20
    bad=1
  else
    echo "ok: README shows $path as it is"
  fi
done < <(sed -n 's/^<!-- the whole of \([^ ]*\) .*/\1/p' "$readme")
if [ "$found" -lt 4 ]; then
  echo "FAIL: expected at least 4 complete examples in $readme, found $found"
  bad=1
fi
exit $bad

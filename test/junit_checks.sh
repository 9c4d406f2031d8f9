# JUnit bookkeeping for the shell tests made of named checks: one test case per check, so that
# tools/test.sh counts them. Source it, set JUNIT_SUITE, call check_result for each check and
# junit_finish at the end (its exit status is the test's).
cases=()
failures=0

# xml_text TEXT: TEXT escaped for an XML attribute value.
xml_text() {
  printf '%s' "$1" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g'
}

# run_and_match WANT_EXIT PATTERN CMD...: runs CMD (20 s at most); sets `out` to its output
# (stdout and stderr) and `why` to what is wrong: empty when it exited WANT_EXIT and its output
# matches the extended regex PATTERN.
run_and_match() {
  local want=$1 pattern=$2 rc
  shift 2
  out=$(timeout 20 "$@" 2>&1)
  rc=$?
  why=""
  if [ "$rc" -ne "$want" ]; then
    why="exit $rc, want $want"
  elif ! grep -Eq -- "$pattern" <<<"$out"; then
    why="output does not match /$pattern/"
  fi
}

# check_result NAME WHY OUTPUT: records check NAME, passed when WHY is empty; on failure prints
# WHY and the first 20 lines of OUTPUT (control characters made visible).
check_result() {
  local name=$1 why=$2 out=${3:-}
  if [ -n "$why" ]; then
    echo "FAIL: $name: $why"
    printf '%s\n' "$out" | head -20 | cat -v | sed 's/^/    /'
    failures=$((failures + 1))
    cases+=("<testcase classname=\"$JUNIT_SUITE\" name=\"$(xml_text "$name")\"><failure message=\"$(xml_text "$why")\"/></testcase>")
  else
    echo "ok: $name"
    cases+=("<testcase classname=\"$JUNIT_SUITE\" name=\"$(xml_text "$name")\"/>")
  fi
}

# junit_finish: writes $XML_OUTPUT_FILE (when Bazel asks for it), prints the tally, and fails
# when any check did.
junit_finish() {
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then
    {
      echo '<?xml version="1.0" encoding="UTF-8"?>'
      echo "<testsuites><testsuite name=\"$JUNIT_SUITE\" tests=\"${#cases[@]}\" failures=\"$failures\">"
      printf '%s\n' "${cases[@]}"
      echo '</testsuite></testsuites>'
    } >"$XML_OUTPUT_FILE"
  fi
  echo "${JUNIT_SUITE}_test: ${#cases[@]} checks, $failures failed"
  [ "$failures" -eq 0 ]
}

#!/usr/bin/env bash
# CI's short fuzz run: every libFuzzer target for 10 s (tools/fuzz/run.sh), JUnit for tools/test.sh.
set -uo pipefail
export OUT="${TEST_TMPDIR:-/tmp}/fuzz"
bash tools/fuzz/run.sh --seconds 10
rc=$?
if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  failure=""
  [ "$rc" -ne 0 ] && failure="<failure message=\"a fuzz target crashed; see the test log\"/>"
  cat >"$XML_OUTPUT_FILE" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="fuzz_smoke_test" tests="1" failures="$([ "$rc" -ne 0 ] && echo 1 || echo 0)">
<testcase classname="fuzz" name="frame, reassembler and handshake fuzzed 10 s each without a crash">$failure</testcase>
</testsuite></testsuites>
XML
fi
exit "$rc"

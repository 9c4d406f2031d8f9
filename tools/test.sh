#!/usr/bin/env bash
# Runs the whole test suite: installs what is missing, then `bazel test //...`, which includes
# the Soft-RoCE VM suite (the RDMA tests run inside a qemu guest; see tools/vm/).
# Then it builds and tests the two examples of using rdmarpc from outside: examples/consumer (a
# Bazel workspace depending on @rdmarpc) and examples/cmake (tools/install.sh + pkg-config), and
# checks that the README's complete examples are those files and that the C++ is clang-formatted.
# Prints "N passed, N failed" (Catch2 test cases, summed over every test target, plus those four)
# on a line of its own and exits non-zero on any failure. Extra arguments go to `bazel test`.
set -uo pipefail
case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."

bash tools/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

log=$(mktemp)
bazel test //... --config=ci "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}

passed=0
failed=0
skipped=0
# One line per test target in Bazel's summary: "//pkg:name   PASSED in 1.2s".
while read -r target status; do
  xml="bazel-testlogs/${target#//}"
  xml="${xml/://}/test.xml"
  cases=0
  bad=0
  skip=0
  if [ -f "$xml" ]; then
    cases=$(grep -c '<testcase ' "$xml" || true)
    bad=$(grep -c '<failure' "$xml" || true)
    skip=$(grep -c '<skipped' "$xml" || true)
    skipped=$((skipped + skip))
    cases=$((cases - skip < 0 ? 0 : cases - skip))
  fi
  if [ "$status" = PASSED ] || [ "$status" = FLAKY ]; then
    if [ "$cases" -eq 0 ]; then cases=1; fi   # a target that reports no cases counts once
    passed=$((passed + cases - bad))
    failed=$((failed + bad))
  else
    # FAILED, TIMEOUT, NO STATUS, ...: whatever the XML says, the target failed.
    [ "$bad" -eq 0 ] && bad=1
    passed=$((passed + cases - bad > 0 ? cases - bad : 0))
    failed=$((failed + bad))
    echo "test target $target: $status"
  fi
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|REMOTE FAILURE|FAILED TO BUILD)' "$log" |
         sed -E 's/\(cached\) //' | awk '{print $1, $2}')
rm -f "$log"

if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $rc (build failure?)"
  failed=1
fi

# rdmarpc used the way a user's project uses it, outside this workspace; one test each.
work=$(mktemp -d)
outside() {  # outside NAME CMD...: runs CMD, counts it as one test, shows its log if it fails
  local name=$1
  shift
  echo "== $name"
  if ( "$@" ) >"$work/$name.log" 2>&1; then
    echo "PASSED: $name"
    passed=$((passed + 1))
  else
    tail -40 "$work/$name.log"
    echo "FAILED: $name"
    failed=$((failed + 1))
  fi
}
consumer_workspace() {  # examples/consumer: a Bazel workspace that depends on @rdmarpc
  cd examples/consumer
  bazel test //... --curses=no --color=no --show_progress_rate_limit=30 --test_output=errors
  local r=$?
  bazel shutdown
  return $r
}
cmake_consumer() {  # tools/install.sh, then examples/cmake through pkg-config
  set -e
  bash tools/install.sh --prefix "$work/prefix"
  PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" cmake -S examples/cmake -B "$work/cmake"
  cmake --build "$work/cmake" -j2
  bash examples/consumer/greeter/greeter_test.sh "$work/cmake"
}
outside readme_examples bash test/readme_examples_test.sh
outside clang_format bash tools/format.sh --check
outside consumer_workspace consumer_workspace
outside install_and_cmake cmake_consumer
rm -rf "$work"
bazel shutdown >/dev/null 2>&1 || true
if [ "$skipped" -gt 0 ]; then
  echo "${passed} passed, ${failed} failed, ${skipped} skipped"
else
  echo "${passed} passed, ${failed} failed"
fi
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]

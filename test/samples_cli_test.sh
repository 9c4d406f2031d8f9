#!/usr/bin/env bash
# The sample binaries' command lines as a user meets them: -h/--help print usage and exit 0, bad
# input exits 2 with a one-line reason (never an abort or a silently ignored flag), and the log
# level follows $RDMARPC_LOG_LEVEL. One JUnit test case per check, so tools/test.sh counts them.
set -u
echo_server=examples/echo/echo_server
echo_client=examples/echo/echo_client
kv_server=examples/kv/kv_server
kv=examples/kv/kv

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cases=()
failures=0

# check NAME WANT_EXIT PATTERN CMD...: runs CMD, wants exit status WANT_EXIT and output (stdout
# and stderr) matching the extended regex PATTERN.
check() {
  local name=$1 want=$2 pattern=$3
  shift 3
  local out rc
  out=$(timeout 20 "$@" 2>&1)
  rc=$?
  local why=""
  if [ "$rc" -ne "$want" ]; then
    why="exit $rc, want $want"
  elif ! grep -Eq -- "$pattern" <<<"$out"; then
    why="output does not match /$pattern/"
  fi
  if [ -n "$why" ]; then
    echo "FAIL: $name: $why"
    echo "$out" | head -20 | sed 's/^/    /'
    failures=$((failures + 1))
    cases+=("<testcase classname=\"samples_cli\" name=\"$name\"><failure message=\"${why//\"/&quot;}\"/></testcase>")
  else
    echo "ok: $name"
    cases+=("<testcase classname=\"samples_cli\" name=\"$name\"/>")
  fi
}

for bin in "$echo_server" "$echo_client" "$kv_server" "$kv"; do
  b=$(basename "$bin")
  check "$b -h prints usage" 0 "^usage: $b" "$bin" -h
  check "$b --help prints usage" 0 "^usage: $b" "$bin" --help
  # A directory, a missing file and an empty file are clear errors (exit 2), not an abort.
  check "$b --auth-secret-file DIR is refused" 2 "not a regular file" \
    "$bin" --auth-secret-file "$tmp"
  check "$b --auth-secret-file MISSING is refused" 2 "cannot read --auth-secret-file" \
    "$bin" --auth-secret-file "$tmp/nope"
  : >"$tmp/empty"
  check "$b --auth-secret-file EMPTY is refused" 2 "is empty" "$bin" --auth-secret-file "$tmp/empty"
  check "$b unknown flag" 2 "unknown flag --frobnicate" "$bin" --frobnicate
  # One line and a pointer to --help, not the whole usage drowning the error.
  check "$b flag error points at --help" 2 "^\(see $b --help\)$" "$bin" --frobnicate
  check "$b flag error is two lines, not the usage" 0 "^ *2$" \
    bash -c "\"$bin\" --frobnicate 2>&1 | wc -l"
  check "$b --log-level loud names the valid levels" 2 \
    "unknown log level 'loud' \(valid: trace, debug, info, warn, error, off\)" \
    "$bin" --log-level loud $([ "$b" = kv ] && echo get x)
done

for bin in "$echo_server" "$kv_server"; do
  b=$(basename "$bin")
  check "$b --listen with an unresolvable host says so" 1 "cannot resolve no-such-host.invalid" \
    "$bin" --listen tcp://no-such-host.invalid:0
done

check "kv --targets '' is refused" 2 "names no server" "$kv" --targets '' get x
check "kv --targets , is refused" 2 "names no server" "$kv" --targets , get x
check "kv_server --sync without rocksdb is refused" 2 "--sync is for --engine rocksdb" \
  "$kv_server" --sync --listen tcp://127.0.0.1:0
check "kv honours RDMARPC_LOG_LEVEL" 2 "unknown log level" \
  env RDMARPC_LOG_LEVEL=loud "$kv" get x
check "kv --log-level beats RDMARPC_LOG_LEVEL" 3 "cannot connect" \
  env RDMARPC_LOG_LEVEL=loud "$kv" --log-level error --targets tcp://127.0.0.1:1 get x
check "echo_server --max-connections must be a number" 2 "^echo_server: --max-connections must be a number" \
  "$echo_server" --max-connections lots
check "kv_server --idle-timeout-ms must be a number" 2 "^kv_server: --idle-timeout-ms must be a number" \
  "$kv_server" --idle-timeout-ms soon

check "echo_server --help lists the limits" 0 "--idle-timeout-ms" "$echo_server" --help
check "kv_server --help lists the limits" 0 "--max-buffered-bytes" "$kv_server" --help

if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites><testsuite name=\"samples_cli\" tests=\"${#cases[@]}\" failures=\"$failures\">"
    printf '%s\n' "${cases[@]}"
    echo '</testsuite></testsuites>'
  } >"$XML_OUTPUT_FILE"
fi
echo "samples_cli_test: ${#cases[@]} checks, $failures failed"
[ "$failures" -eq 0 ]

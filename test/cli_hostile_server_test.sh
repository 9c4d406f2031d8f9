#!/usr/bin/env bash
# The `rdmarpc` tool against a server whose reflection service lies (hostile_reflection_server):
# descriptors that do not parse or build, files importing each other, a reply nested 100,000
# deep, and terminal escape sequences and newlines in every string the server chooses (service
# and file names, error messages, reply fields). Wanted each time: a clear error and the right
# exit status, never a crash or a hang, and nothing the server sent reaching the terminal as a
# control character (no ESC or BEL byte in the output, no line the server forged). One JUnit
# test case per check, so tools/test.sh counts them.
set -u
server=test/hostile_reflection_server
rdmarpc=tools/cli/rdmarpc

tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT
JUNIT_SUITE=cli_hostile_server
. test/junit_checks.sh

# check NAME WANT_EXIT PATTERN CMD...: runs CMD, wants exit status WANT_EXIT, output (stdout and
# stderr) matching the extended regex PATTERN, and no escape, bell or forged line in it.
check() {
  local name=$1 out why
  shift
  run_and_match "$@"
  if [ -z "$why" ] && LC_ALL=C grep -q $'[\x1b\x07]' <<<"$out"; then
    why="a control character from the server reached the output"
  elif [ -z "$why" ] && grep -q '^FORGED' <<<"$out"; then
    why="the server forged a line of the output"
  fi
  check_result "$name" "$why" "$out"
}

# start CASE: runs the lying server for CASE; sets $uri.
start() {
  "$server" --case "$1" >"$tmp/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do grep -q '^listening on ' "$tmp/$1.log" && break; sleep 0.05; done
  uri=$(sed -n 's/^listening on //p' "$tmp/$1.log")
  [ -n "$uri" ] || { echo "FAIL: hostile_reflection_server --case $1 did not start"; cat "$tmp/$1.log"; exit 1; }
}

start garbage
check "list: a service name with escapes and a newline is shown escaped" 0 \
  '^demo\.Fake\\x1b\]0;owned\\x07\\x1b\[2J\\nFORGED LINE$' "$rdmarpc" list "$uri"
check "describe: a file descriptor that does not parse" 1 \
  "INTERNAL: the server sent a file descriptor that does not parse" \
  "$rdmarpc" describe "$uri" demo.Echo
check "call: a file descriptor that does not parse" 1 "does not parse" \
  "$rdmarpc" call "$uri" demo.Echo/Say '{}'

start unbuildable
check "describe: a file using a type defined nowhere does not build" 1 \
  "INTERNAL: the server's definition of echo.proto does not build" \
  "$rdmarpc" describe "$uri" demo.Echo

start cycle
check "describe: files importing each other do not build (no hang)" 1 "does not build" \
  "$rdmarpc" describe "$uri" demo.Echo

start error
check "describe: the server's error message is shown escaped" 4 \
  'NOT_FOUND: no\\x1b\]0;owned\\x07\\x1b\[2J\\nFORGED LINE' "$rdmarpc" describe "$uri" demo.Echo

start escapes
check "describe: a file name with escapes is shown escaped" 0 \
  '^// echo\\x1b\]0;owned\\x07\\x1b\[2J\\nFORGED LINE\.proto$' "$rdmarpc" describe "$uri" demo.Echo
check "describe a method: its file name escaped too" 0 'in echo\\x1b' \
  "$rdmarpc" describe "$uri" demo.Echo.Say
check "call: escapes in a reply's string field stay JSON escapes" 0 \
  '"served_by": "a server\\u001b\]0;owned\\u0007\\u001b\[2J\\nFORGED LINE"' \
  "$rdmarpc" call "$uri" demo.Echo/Say '{"message": "hi"}'

start deep
check "call: a reply nested 100,000 deep is refused, not a stack overflow" 1 \
  "INTERNAL: .*demo\.SayReply" "$rdmarpc" call "$uri" demo.Echo/Say '{"message": "hi"}'
check "call: the same server still answers list afterwards" 0 "^demo\.Echo$" "$rdmarpc" list "$uri"

junit_finish

#!/usr/bin/env bash
# The sample binaries' command lines as a user meets them: -h/--help print usage and exit 0, bad
# input exits 2 with a one-line reason (never an abort or a silently ignored flag), and the log
# level follows $RDMARPC_LOG_LEVEL. One JUnit test case per check, so tools/test.sh counts them.
set -u
echo_server=examples/echo/echo_server
echo_client=examples/echo/echo_client
kv_server=examples/kv/kv_server
kv=examples/kv/kv
rdmarpc=tools/cli/rdmarpc

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
JUNIT_SUITE=samples_cli
. test/junit_checks.sh

# check NAME WANT_EXIT PATTERN CMD...: runs CMD, wants exit status WANT_EXIT and output (stdout
# and stderr) matching the extended regex PATTERN.
check() {
  local name=$1 out why
  shift
  run_and_match "$@"
  check_result "$name" "$why" "$out"
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
check "kv_server --max-store-bytes that is not a number is refused" 2 "--max-store-bytes must be a number" \
  "$kv_server" --max-store-bytes lots --listen tcp://127.0.0.1:0
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

# kv watch: replays the changes under a prefix after a version, then exits after --count.
"$kv_server" --listen tcp://127.0.0.1:0 >"$tmp/watch.out" 2>&1 &
watch_pid=$!
for _ in $(seq 100); do grep -q "listening on" "$tmp/watch.out" && break; sleep 0.1; done
watch_uri=$(grep -o 'tcp://[0-9.]*:[0-9]*' "$tmp/watch.out" | head -1)
"$kv" --targets "$watch_uri" put q/0 first >/dev/null 2>&1
"$kv" --targets "$watch_uri" put p/1 one >/dev/null 2>&1
"$kv" --targets "$watch_uri" delete p/1 >/dev/null 2>&1
check "kv watch replays changes after a version, then stops at --count" 0 \
  "^put[[:space:]]+p/1[[:space:]]+one[[:space:]]+\(version 2\)" \
  "$kv" --targets "$watch_uri" watch p/ --after-version 1 --count 2
check "kv watch prints deletes" 0 "^delete[[:space:]]+p/1[[:space:]]+\(version 3\)" \
  "$kv" --targets "$watch_uri" watch p/ --after-version 1 --count 2
check "kv watch takes one server" 2 "one server" \
  "$kv" --targets "$watch_uri,$watch_uri" watch p/
kill "$watch_pid" 2>/dev/null
wait "$watch_pid" 2>/dev/null

# Sharded kv with one dead server: keys on the live ones keep working, info shows each server's
# state, a key on the dead one fails with UNAVAILABLE naming it (issue 15, item 6).
start_kv() {  # start_kv NAME: starts a kv_server, sets its address in $NAME
  "$kv_server" --listen tcp://127.0.0.1:0 >"$tmp/$1.out" 2>&1 &
  echo $! >"$tmp/$1.pid"
  for _ in $(seq 200); do
    grep -q '^listening on ' "$tmp/$1.out" && break
    sleep 0.05
  done
  printf -v "$1" '%s' "$(sed -n 's/^listening on //p' "$tmp/$1.out")"
}
start_kv live1
start_kv live2
start_kv gone
kill "$(cat "$tmp/gone.pid")"
wait "$(cat "$tmp/gone.pid")" 2>/dev/null
targets="$live1,$live2,$gone"
# Keys that land on each server: put reports the owner's failure for the dead one.
live_key="" dead_key=""
for i in $(seq 200); do
  if "$kv" --targets "$targets" put "k$i" "v$i" >/dev/null 2>&1; then
    [ -z "$live_key" ] && live_key="k$i"
  else
    [ -z "$dead_key" ] && dead_key="k$i"
  fi
  [ -n "$live_key" ] && [ -n "$dead_key" ] && break
done
check "kv get: a key on a live server works with another server dead" 0 "^v${live_key#k}" \
  "$kv" --targets "$targets" get "$live_key"
check "kv get: the dead server is named in a warning" 0 "warning: $gone is down" \
  "$kv" --targets "$targets" get "$live_key"
check "kv get: a key on the dead server fails with UNAVAILABLE naming it" 1 \
  "UNAVAILABLE: server $gone is down" "$kv" --targets "$targets" get "${dead_key:-none}"
check "kv info: the dead server's line says DOWN" 1 "^$gone: DOWN: UNAVAILABLE" \
  "$kv" --targets "$targets" info
check "kv info: the live servers' lines say up" 1 "^$live2: up, engine memory" \
  "$kv" --targets "$targets" info
check "kv mget: live keys answered, the dead one marked" 1 \
  "^${dead_key:-none}	\(UNAVAILABLE" "$kv" --targets "$targets" mget "$live_key" "${dead_key:-none}"
check "kv: every server dead is 'cannot connect'" 3 "cannot connect: $gone" \
  "$kv" --targets "$gone,$gone" get x
kill "$(cat "$tmp/live1.pid")" "$(cat "$tmp/live2.pid")"
wait 2>/dev/null

# The rdmarpc tool against the sample servers' built-in health service (issue 14).
check "rdmarpc --help" 0 "rdmarpc health TARGET" "$rdmarpc" --help
check "rdmarpc without a command" 2 "no command given" "$rdmarpc"
check "rdmarpc with an unknown command" 2 "unknown command 'bogus'" "$rdmarpc" bogus x
check "rdmarpc with an unknown option" 2 "see rdmarpc --help" "$rdmarpc" health --loud x
check "rdmarpc --auth-secret-file DIR is refused" 2 "not a regular file" \
  "$rdmarpc" health tcp://127.0.0.1:1 --auth-secret-file "$tmp"
check "rdmarpc --log-level loud names the valid levels" 2 \
  "unknown log level 'loud' \(valid: trace, debug, info, warn, error, off\)" \
  "$rdmarpc" health tcp://127.0.0.1:1 --log-level loud
check "rdmarpc health: no server is 'cannot connect'" 3 "cannot connect to tcp://127.0.0.1:1" \
  "$rdmarpc" health tcp://127.0.0.1:1
"$echo_server" --listen tcp://127.0.0.1:0 --shutdown-grace-ms 3000 --access-log >"$tmp/echo.out" 2>&1 &
echo_pid=$!
for _ in $(seq 200); do grep -q '^listening on ' "$tmp/echo.out" && break; sleep 0.05; done
echo_uri=$(sed -n 's/^listening on //p' "$tmp/echo.out")
check "rdmarpc health: echo_server is SERVING" 0 "^SERVING$" "$rdmarpc" health "$echo_uri"
check "rdmarpc health: its demo.Echo is SERVING" 0 "^SERVING$" "$rdmarpc" health "$echo_uri" demo.Echo
check "rdmarpc health: an unknown service is NOT_FOUND" 4 "NOT_FOUND" \
  "$rdmarpc" health "$echo_uri" no.Such
check "rdmarpc list: echo_server's services" 0 \
  "^demo.Echo$" "$rdmarpc" list "$echo_uri"
check "rdmarpc list shows the built-in services too" 0 "^rdmarpc.reflection.v1.Reflection$" \
  "$rdmarpc" list "$echo_uri"
check "rdmarpc describe a service shows its streaming method" 0 \
  "rpc Chat\(stream \.demo\.SayRequest\) returns \(stream \.demo\.SayReply\);" \
  "$rdmarpc" describe "$echo_uri" demo.Echo
check "rdmarpc describe a message" 0 "string message = 1;" \
  "$rdmarpc" describe "$echo_uri" demo.SayRequest
check "rdmarpc describe an unknown symbol exits 4" 4 "NOT_FOUND" \
  "$rdmarpc" describe "$echo_uri" no.Such
check "rdmarpc call: a JSON request, the reply as JSON" 0 '"message": "hi from json"' \
  "$rdmarpc" call "$echo_uri" demo.Echo/Say '{"message": "hi from json"}'
check "echo_server --access-log logs each call: peer, method, status, duration" 0 \
  "access tcp://127.0.0.1:[0-9]+ /demo.Echo/Say OK [0-9.]+ ms" cat "$tmp/echo.out"
check "rdmarpc call: the request on stdin" 0 '"served_by": "tcp://' \
  bash -c "echo '{\"message\": \"piped\"}' | \"$rdmarpc\" call \"$echo_uri\" demo.Echo.Say"
check "rdmarpc call: a request that is not valid JSON for the method exits 2" 2 \
  "request 1 is not a demo.SayRequest in JSON" "$rdmarpc" call "$echo_uri" demo.Echo/Say '{"nope": 1}'
check "rdmarpc call: an unknown method exits 4" 4 "" \
  "$rdmarpc" call "$echo_uri" demo.Echo/Nope '{}'
check "rdmarpc call: a bidirectional stream, requests as JSON lines on stdin" 0 \
  '^\{"message":"two",' \
  bash -c "printf '{\"message\": \"one\"}\\n\\n{\"message\": \"two\"}\\n' | \"$rdmarpc\" call \"$echo_uri\" demo.Echo/Chat"
check "rdmarpc call: a bidirectional stream answers each line" 0 '^ *2$' \
  bash -c "printf '{\"message\": \"one\"}\\n{\"message\": \"two\"}\\n' | \"$rdmarpc\" call \"$echo_uri\" demo.Echo/Chat | wc -l"
check "rdmarpc call: a bad line of a stream exits 2 before sending" 2 \
  "request 2 is not a demo.SayRequest" \
  bash -c "printf '{\"message\": \"one\"}\\n{\"nope\": 1}\\n' | \"$rdmarpc\" call \"$echo_uri\" demo.Echo/Chat"
check "rdmarpc call --metadata without = is refused" 2 "KEY=VALUE" \
  "$rdmarpc" call "$echo_uri" demo.Echo/Say '{}' --metadata nokey
check "echo_client --chat: 10,000 messages on one bidirectional stream, all echoed in order" 0 \
  "^echo_client: 10000 ok, 0 failed .* messages/s" \
  "$echo_client" --target "$echo_uri" --chat --count 10000 --payload-bytes 100 --quiet
check "echo_client --chat prints each echo" 0 'sent "hi #2" -> got "hi #2" from tcp://.* on the stream' \
  "$echo_client" --target "$echo_uri" --chat --count 2 --message hi
kill -TERM "$echo_pid"
sleep 0.3
check "rdmarpc health: NOT_SERVING from SIGTERM, within --shutdown-grace-ms" 1 "^NOT_SERVING$" \
  "$rdmarpc" health "$echo_uri"
check "echo_client: still served within the grace" 0 "" "$echo_client" --target "$echo_uri" --count 1
wait "$echo_pid" 2>/dev/null

junit_finish

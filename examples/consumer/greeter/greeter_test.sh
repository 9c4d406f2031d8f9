#!/usr/bin/env bash
# Starts greeter_server on a free port, runs greeter_client against it, checks what came back.
# Usage: greeter_test.sh [DIR with the two binaries]   (default: Bazel's runfiles)
set -euo pipefail
dir=${1:-greeter}
out=$(mktemp)
"$dir/greeter_server" tcp://127.0.0.1:0 >"$out" &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 100); do grep -q '^listening on ' "$out" && break; sleep 0.05; done
uri=$(sed -n 's/^listening on //p' "$out")
got=$("$dir/greeter_client" "$uri" Ada)
echo "$got"
grep -q '^hello, Ada (answer 1, ' <<<"$got"
grep -q '^bonjour, Ada (answer 2, ' <<<"$got"
grep -q '^without a name: INVALID_ARGUMENT: person.name is empty' <<<"$got"
kill -TERM $server
wait $server  # exits 0 after draining
echo "greeter_test: ok"

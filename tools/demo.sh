#!/usr/bin/env bash
# Set-up, build and the echo demo in one command: installs what is missing, builds the echo
# server and client, starts the server on loopback, runs the client against it, stops the server.
# Usage: tools/demo.sh [tcp://127.0.0.1:PORT]   (default tcp://127.0.0.1:7471)
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "demo.sh: unknown option $1 (see tools/demo.sh --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "demo.sh: one URI at most (see tools/demo.sh --help)" >&2; exit 2; }
cd "$(dirname "$0")/.."
uri="${1:-tcp://127.0.0.1:7471}"

bash tools/setup.sh
bazel build //examples/echo:echo_server //examples/echo:echo_client
bin=bazel-bin/examples/echo

echo "== starting echo_server on $uri"
out=$(mktemp)
"$bin/echo_server" --listen "$uri" >"$out" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 100); do
  grep -q "^listening on" "$out" && break
  kill -0 "$server" 2>/dev/null || { cat "$out"; echo "echo_server exited"; exit 1; }
  sleep 0.1
done
cat "$out"

echo "== echo_client: three calls"
"$bin/echo_client" --target "$uri" --message "hello from the demo" --count 3
echo "== echo_client: 10000 calls, 16 in flight"
"$bin/echo_client" --target "$uri" --count 10000 --concurrency 16 --quiet

kill -TERM "$server"
wait "$server"
cat "$out" | tail -n 2
echo "== demo done"

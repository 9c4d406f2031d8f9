#!/usr/bin/env bash
# Set-up, build and the echo demo in one command: installs what is missing, builds the echo
# server and client, starts the server on loopback, runs the client against it, stops the server;
# then the same over rdma:// inside a Soft-RoCE VM, with the latency of both side by side.
# Usage: tools/demo.sh [tcp://127.0.0.1:PORT]   (default tcp://127.0.0.1:7471)
set -euo pipefail
case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
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
echo "== echo_client --chat: 100000 messages on one bidirectional stream"
"$bin/echo_client" --target "$uri" --chat --count 100000 --quiet

echo "== echo_client: 2000 calls, one at a time (latency)"
tcp_host=$("$bin/echo_client" --target "$uri" --count 2000 --quiet)
echo "$tcp_host"

kill -TERM "$server"
wait "$server"
cat "$out" | tail -n 2

# The main job: the same echo over rdma://. This machine has no RDMA NIC, so it runs where a real
# verbs stack does: a qemu VM with Soft-RoCE (rdma_rxe), the kernel fetched once. Next to it, the
# same calls over tcp:// in the same VM, so that both numbers come from the same emulated CPU.
echo "== the same over rdma:// in a Soft-RoCE VM (tools/vm/rxe_vm.sh; the kernel is fetched once)"
vm_out=$(mktemp)
trap 'kill "$server" 2>/dev/null || true; rm -f "$out" "$vm_out"' EXIT
# shellcheck disable=SC2016  # $RXE_ADDR is the guest's, expanded there
if bash tools/vm/rxe_vm.sh --timeout 300 -- bash -c '
    b=bazel-bin/examples/echo
    $b/echo_server --listen rdma://$RXE_ADDR:7471 --listen tcp://127.0.0.1:7472 > /tmp/server.log 2>&1 &
    for _ in $(seq 100); do [ "$(grep -c "^listening on" /tmp/server.log)" = 2 ] && break; sleep 0.2; done
    cat /tmp/server.log
    $b/echo_client --target rdma://$RXE_ADDR:7471 --message "hello over RDMA" --count 3 || exit 1
    echo "rdma: $($b/echo_client --target rdma://$RXE_ADDR:7471 --count 2000 --quiet)"
    echo "rdma stream: $($b/echo_client --target rdma://$RXE_ADDR:7471 --chat --count 10000 --quiet)"
    echo "tcp:  $($b/echo_client --target tcp://127.0.0.1:7472 --count 2000 --quiet)"
  ' 2>&1 | tee "$vm_out"; then
  p50() { sed -n 's/.*latency p50 \([0-9.]*\) us.*/\1/p' <<<"$1" | head -n 1; }
  echo "== round trip of one call at a time, p50:"
  echo "   tcp:// on this host:                       $(p50 "$tcp_host") us"
  echo "   tcp:// in the VM (guest loopback):         $(p50 "$(grep '^tcp:' "$vm_out")") us"
  echo "   rdma:// in the VM (Soft-RoCE, rdma_rxe):   $(p50 "$(grep '^rdma:' "$vm_out")") us"
  echo "   The VM's CPU is emulated (qemu TCG) and its RDMA device is software, so its figures say"
  echo "   nothing about RDMA hardware; compare the two VM lines with each other. On an RDMA NIC,"
  echo "   run echo_server --listen rdma://ADDR:PORT directly (docs/BENCHMARKS.md has more)."
else
  echo "== the RDMA part did not run (output above); the TCP demo did"
  exit 1
fi
echo "== demo done"

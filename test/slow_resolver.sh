#!/usr/bin/env bash
# Runs "$@" with a name server that never answers: in a private mount namespace, /etc/resolv.conf
# names 127.0.0.1, where a UDP socket takes queries and drops them, so every host-name lookup
# (not /etc/hosts, not an address) waits out the resolver's 3 s timeout and then fails. For the
# test that a slow lookup does not block an I/O thread (issue 11, item 14; reliability_test
# [resolve]). Root only (mount namespace); used inside the Soft-RoCE VM by rdma_vm_test.sh.
set -euo pipefail
if [ "${1:-}" != "--inside" ]; then
  exec unshare -m bash "$0" --inside "$@"
fi
shift
work=$(mktemp -d)
trap 'kill "$dns" 2>/dev/null || true; rm -rf "$work"' EXIT
printf 'nameserver 127.0.0.1\noptions timeout:3 attempts:1\n' >"$work/resolv.conf"
mount --bind "$work/resolv.conf" /etc/resolv.conf
python3 -c '
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 53))
open(sys.argv[1], "w").close()
time.sleep(3600)' "$work/ready" &
dns=$!
for _ in $(seq 100); do [ -e "$work/ready" ] && break; sleep 0.05; done
[ -e "$work/ready" ] || { echo "slow_resolver: the mute name server did not start" >&2; exit 1; }
export RDMARPC_TEST_SLOW_HOST=slow-lookup.rdmarpc.test
"$@"

#!/usr/bin/env bash
# The echo demo across a wire: echo_server in one Soft-RoCE guest (198.18.0.2), echo_client in
# another (198.18.0.1), joined by a virtio link (tools/vm/rxe_vm.sh --peer). Passes when every
# call completes with its own reply.
set -uo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export RDMARPC_VM_CACHE="${RDMARPC_VM_CACHE:-/var/tmp/rdmarpc-vm}"
calls=2000
out=$(mktemp)
start=$(date +%s)
bash tools/vm/rxe_vm.sh --timeout 300 \
  --peer 'ibv_devices; exec examples/echo/echo_server --listen rdma://$RXE_ADDR:7471' \
  -- bash -c "ibv_devices; examples/echo/echo_client --target rdma://\$RXE_PEER_ADDR:7471 \
      --count $calls --concurrency 8 --payload-bytes 4096 --quiet --connect-retry-ms 60000" \
  2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
echo "rdma_two_vm_test: exit status $rc after $(( $(date +%s) - start )) s"
if [ "$rc" -eq 0 ] && ! grep -q "echo_client: $calls ok, 0 failed" "$out"; then
  echo "rdma_two_vm_test: the client did not report $calls good calls"
  rc=1
fi
if ! grep -q '^\[peer\] listening on rdma://198.18.0.2:7471' "$out"; then
  echo "rdma_two_vm_test: the server in the peer VM never listened"
  rc=1
fi
rm -f "$out"
exit "$rc"

#!/usr/bin/env bash
# Dead-peer detection when a machine stops dead (issue 5): echo_server runs in a peer VM, listening
# on rdma:// and tcp://; two echo_clients in the main VM (one per transport, keepalive 200 ms /
# 1000 ms, 60 s call deadlines) make calls until the peer VM is frozen with SIGSTOP on its qemu:
# no FIN, no RST, no CM DREQ, nothing. Each client must fail its calls with UNAVAILABLE naming
# the keepalive well within its deadline, and exit 1.
set -uo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export RDMARPC_VM_CACHE="${RDMARPC_VM_CACHE:-/var/tmp/rdmarpc-vm}"
out=$(mktemp)
client="examples/echo/echo_client --count 100000000 --concurrency 4 --timeout-ms 60000"
client+=" --keepalive-ms 200 --keepalive-timeout-ms 1000 --stop-on-error --connect-retry-ms 60000"
client+=" --quiet"
main_cmd="
  $client --target rdma://\$RXE_PEER_ADDR:7471 > /tmp/rdma.out 2>&1 & r=\$!
  $client --target tcp://\$RXE_PEER_ADDR:7472 > /tmp/tcp.out 2>&1 & t=\$!
  # Freeze only once the peer serves both transports (its VM may boot later than this one on a
  # loaded machine): one call each, retried until it connects, then time for the two clients
  # above (retrying with backoff) to be connected and calling.
  for target in rdma://\$RXE_PEER_ADDR:7471 tcp://\$RXE_PEER_ADDR:7472; do
    examples/echo/echo_client --target \$target --count 1 --connect-retry-ms 120000 --quiet \
      > /dev/null 2>&1 || echo \"the peer does not answer on \$target\"
  done
  sleep 3
  echo FREEZE-PEER-NOW; frozen=\$(date +%s%N)
  wait \$r; rrc=\$?; rms=\$(( (\$(date +%s%N) - frozen) / 1000000 ))
  wait \$t; trc=\$?; tms=\$(( (\$(date +%s%N) - frozen) / 1000000 ))
  echo \"rdma client: exit \$rrc, \$rms ms after the freeze\"; grep -m2 -E 'failed|ok,' /tmp/rdma.out
  echo \"tcp client: exit \$trc, \$tms ms after the freeze\"; grep -m2 -E 'failed|ok,' /tmp/tcp.out
"
start=$(date +%s)
bash tools/vm/rxe_vm.sh --timeout 300 --freeze-peer-on FREEZE-PEER-NOW \
  --peer 'exec examples/echo/echo_server --listen rdma://$RXE_ADDR:7471 --listen tcp://$RXE_ADDR:7472' \
  -- bash -c "$main_cmd" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
echo "rdma_vm_freeze_test: runner exit status $rc after $(( $(date +%s) - start )) s"
fail=0
grep -q "peer VM frozen" "$out" || { echo "FAIL: the peer VM was never frozen"; fail=1; }
for t in rdma tcp; do
  line=$(grep "^$t client: exit" "$out")
  ms=$(echo "$line" | sed -n 's/.*exit 1, \([0-9]*\) ms.*/\1/p')
  if [ -z "$ms" ]; then
    echo "FAIL: $t client did not exit 1 after the freeze: $line"; fail=1
  elif [ "$ms" -gt 5000 ]; then
    echo "FAIL: $t client took $ms ms to notice (keepalive 200 + 1000 ms; bound 5 s)"; fail=1
  fi
  grep -A1 "^$t client: exit" "$out" | grep -q "UNAVAILABLE.*keepalive" ||
    { echo "FAIL: $t client's failure does not name the keepalive"; fail=1; }
done
rm -f "$out"
exit "$fail"

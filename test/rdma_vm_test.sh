#!/usr/bin/env bash
# The RDMA suite: boots the Soft-RoCE VM (tools/vm/rxe_vm.sh) and runs the integration suite over
# rdma:// inside it, on a real verbs stack (rdma_rxe). Not skipped when the host has no RDMA
# device: that is the point of the VM. Test cases known to fail over RDMA are listed below,
# not run, and reported as skipped in the JUnit output (and so in tools/test.sh's count).
set -uo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export RDMARPC_VM_CACHE="${RDMARPC_VM_CACHE:-/var/tmp/rdmarpc-vm}"
runner="tools/vm/rxe_vm.sh"
suite="test/rpc_integration_test"

# Known failing over RDMA, tracked in the RDMA transport issue: in about 3 of 10 runs, when one
# of the 8 clients disconnects, another client's server-side QP flushes (WR_FLUSH_ERR) and that
# client's calls fail with UNAVAILABLE. Not seen when the clients disconnect together.
known_failing=("8 clients on one server at once are all served")

filter=""
for t in "${known_failing[@]}"; do filter+="~\"$t\" "; done

out=$(mktemp)
start=$(date +%s)
RDMARPC_TEST_RDMA_HOST=198.18.0.1 RDMARPC_TEST_ONLY_SCHEME=rdma \
  bash "$runner" --timeout 600 -- bash -c "
    ibv_devices
    XML_OUTPUT_FILE=/tmp/suite.xml TEST_TARGET=rdma_vm timeout 540 $suite --durations yes $filter
    rc=\$?
    echo @@JUNIT@@
    cat /tmp/suite.xml 2>/dev/null
    exit \$rc" >"$out" 2>&1
rc=$?
sed '/^@@JUNIT@@$/,$d' "$out"
echo "rdma_vm_test: VM suite exit status $rc after $(( $(date +%s) - start )) s"
for t in "${known_failing[@]}"; do echo "rdma_vm_test: NOT RUN (known failing over RDMA): $t"; done

if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  xml=$(sed -n '/^@@JUNIT@@$/,$p' "$out" | tail -n +2)
  if [ -z "$xml" ]; then
    xml='<testsuites><testsuite name="rdma_vm" tests="1" failures="1"><testcase name="VM suite ran"><failure message="no results came back from the VM"/></testcase></testsuite></testsuites>'
  fi
  skipped=""
  for t in "${known_failing[@]}"; do
    skipped+="  <testcase classname=\"rdma_vm\" name=\"$t (over rdma)\"><skipped message=\"known failing over RDMA\"/></testcase>\n"
  done
  printf '%s\n' "$xml" | sed "s#</testsuite>#$(printf "$skipped" | sed 's/[&#]/\\&/g')</testsuite>#" >"$XML_OUTPUT_FILE"
fi
rm -f "$out"
exit "$rc"

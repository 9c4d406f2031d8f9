#!/usr/bin/env bash
# The project's scripts answer --help with their usage and refuse what they do not take, before
# doing any work (issue 15, items 5 and 7): tools/demo.sh, tools/test.sh, tools/bench/run_all.sh
# (which would otherwise rewrite docs/) and tools/vm/rxe_vm.sh (which would boot a VM).
set -uo pipefail
fail=0
check() {  # description, expected exit status, expected text, command...
  local what="$1" want_rc="$2" want_text="$3"; shift 3
  local out rc
  out=$(timeout 20 "$@" 2>&1); rc=$?
  if [ "$rc" != "$want_rc" ]; then
    echo "FAIL: $what: exit $rc, wanted $want_rc; output: $out"; fail=1
  elif ! grep -q -- "$want_text" <<<"$out"; then
    echo "FAIL: $what: output lacks '$want_text': $out"; fail=1
  else
    echo "ok: $what"
  fi
}
check "demo.sh --help" 0 "Usage: tools/demo.sh" bash tools/demo.sh --help
check "demo.sh -h" 0 "Usage: tools/demo.sh" bash tools/demo.sh -h
check "demo.sh with an unknown option" 2 "unknown option --fast (see tools/demo.sh --help)" bash tools/demo.sh --fast
check "test.sh --help" 0 "N passed, N failed" bash tools/test.sh --help
check "install.sh --help" 0 "Usage: tools/install.sh \\[--prefix DIR\\]" bash tools/install.sh --help
check "install.sh with an unknown option" 2 "unknown argument --fast (see tools/install.sh --help)" bash tools/install.sh --fast
check "format.sh --help" 0 "tools/format.sh --check" bash tools/format.sh --help
check "format.sh with an unknown option" 2 "unknown option --fix (see tools/format.sh --help)" bash tools/format.sh --fix
check "run_all.sh --help" 0 "writes docs/BENCHMARKS.md" bash tools/bench/run_all.sh --help
check "run_all.sh with an argument" 2 "takes no arguments" bash tools/bench/run_all.sh --quick
check "rxe_vm.sh --help lists every option" 0 "freeze-peer-on" bash tools/vm/rxe_vm.sh --help
check "rxe_vm.sh with an unknown option" 2 "unknown option --bogus" bash tools/vm/rxe_vm.sh --bogus true
check "rxe_vm.sh without a command: usage with every option" 2 "\[--mem SIZE\] \[--share DIR\] \[--peer" bash tools/vm/rxe_vm.sh
# A working directory under /tmp (empty in the guest) with --share naming another folder: refused
# at once, with the way out, instead of "cd: No such file or directory" inside the guest.
root=$PWD
under_tmp=$(mktemp -d /tmp/scripts_cli_test.XXXXXX)
check "rxe_vm.sh from under /tmp with another --share" 2 "run from elsewhere" \
  bash -c "cd '$under_tmp' && bash '$root/tools/vm/rxe_vm.sh' --share /var/tmp -- true"
rm -rf "$under_tmp"
exit "$fail"

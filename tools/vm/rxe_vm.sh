#!/usr/bin/env bash
# Runs a command inside a qemu VM with a real RDMA verbs stack (Soft-RoCE, rdma_rxe), on any
# Debian/Ubuntu machine without an RDMA NIC. The guest runs the host's own userspace (the host
# root is shared read-only under a tmpfs overlay), so binaries built on the host run unchanged.
#
#   tools/vm/rxe_vm.sh [--timeout SECONDS] [--mtu N] [--mem SIZE] [--share DIR]
#                      [--peer 'PEER COMMAND' [--freeze-peer-on TEXT]] [--] COMMAND [ARGS...]
#
# --mem: the guest's memory (default $RDMARPC_VM_MEM or 2G; qemu syntax, e.g. 6G). Sanitizer
# builds need more (TSan's shadow memory: --config=tsan sets RDMARPC_VM_MEM=6G).
#
# Inside the guest: rxe0 is configured on dummy0 with address $RXE_ADDR (198.18.0.1, from the
# benchmarking range; the guest has no host-facing NIC, so nothing it sends leaves the VM),
# `ulimit -l` is unlimited, and the working directory is the caller's. The host root is read-only
# in the guest; --share DIR makes DIR writable there (same path), for results. A working directory
# under /tmp, /run or /dev/shm (which the guest mounts empty) is shared that way by itself.
# The command's output is streamed here; this script exits with the command's exit status (124 on
# timeout, 125 when the VM itself failed).
#
# Two-VM mode (--peer): a second guest (198.18.0.2) runs PEER COMMAND (a shell line) while the
# main guest (198.18.0.1) runs COMMAND; the two are joined by a virtio link over a unix socket,
# and rxe0 sits on that link in each, so RDMA traffic crosses a wire between two kernels.
# $RXE_PEER_ADDR holds the other guest's address. The peer's output is prefixed "[peer] "; it is
# stopped when COMMAND ends. --freeze-peer-on TEXT: when COMMAND prints a line containing TEXT,
# the peer VM is frozen (SIGSTOP to its qemu): a machine that stops dead, sending nothing, not
# even a reset, which is what keepalive exists to notice.
#
# The kernel (Debian's linux-image-amd64 package) is fetched once with `apt-get download` into
# $RDMARPC_VM_CACHE (default ~/.cache/rdmarpc-vm) and unpacked there, never installed.
set -euo pipefail

timeout_s=600
mtu=1500
mem_opt="${RDMARPC_VM_MEM:-2G}"
share=""
peer_cmd=""
freeze_on=""
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s="$2"; shift 2 ;;
    --mtu) mtu="$2"; shift 2 ;;
    --mem) mem_opt="$2"; shift 2 ;;
    --share) share=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --peer) peer_cmd="$2"; shift 2 ;;
    --freeze-peer-on) freeze_on="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "rxe_vm: unknown option $1 (see tools/vm/rxe_vm.sh --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || {
  echo "usage: $0 [--timeout SECONDS] [--mtu N] [--mem SIZE] [--share DIR] [--peer 'PEER COMMAND' [--freeze-peer-on TEXT]] [--] COMMAND [ARGS...]" >&2
  exit 2
}
# The guest mounts fresh, empty /tmp, /run and /dev/shm: a working directory under one of them
# would not exist there. Such a directory is shared with the guest (writable) so that the
# command runs where it was asked to; with --share naming another folder, there is no second
# share to give it, so say so now rather than fail inside the guest.
case "$PWD/" in
  /tmp/*|/run/*|/dev/shm/*)
    if [ -z "$share" ]; then
      share="$PWD"
    else
      case "$PWD/" in
        "$share"/*) ;;
        *) echo "rxe_vm: the working directory $PWD is under a folder the guest replaces with its own (/tmp, /run or /dev/shm), and --share already names $share; run from elsewhere (e.g. a clone under /var/tmp or \$HOME)" >&2
           exit 2 ;;
      esac
    fi ;;
esac

cache="${RDMARPC_VM_CACHE:-$HOME/.cache/rdmarpc-vm}"
mkdir -p "$cache"
say() { echo "rxe_vm: $*" >&2; }

# --- kernel, fetched once ------------------------------------------------------------------
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$kpkg" ]; then
  # The package lists may be missing on a fresh machine.
  apt-get update -qq >/dev/null
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
[ -n "$kpkg" ] || { say "cannot resolve the linux-image-amd64 package"; exit 125; }
kver=${kpkg#linux-image-}
kroot="$cache/$kpkg"
if [ ! -f "$kroot/.unpacked" ]; then
  say "fetching kernel package $kpkg (once)"
  rm -rf "$kroot" "$cache/dl"; mkdir -p "$cache/dl" "$kroot"
  chmod 777 "$cache/dl"
  (cd "$cache/dl" && apt-get download "$kpkg" >/dev/null 2>&1)
  dpkg-deb -x "$cache"/dl/*.deb "$kroot"
  depmod -b "$kroot" "$kver"
  rm -rf "$cache/dl"
  touch "$kroot/.unpacked"
fi
vmlinuz="$kroot/boot/vmlinuz-$kver"
moddir="$kroot/lib/modules/$kver"

# --- initramfs: busybox + the modules, built once per kernel --------------------------------
modules="overlay crc32_generic virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio
virtio_pci failover net_failover virtio_net 9pnet 9pnet_virtio netfs fscache 9p veth dummy
ib_core ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe ib_cm iw_cm configfs rdma_cm rdma_ucm"
initrd="$cache/initrd-$kver.cpio.gz"
init_src="$(dirname "$0")/guest_init.sh"
if [ ! -f "$initrd" ] || [ "$init_src" -nt "$initrd" ]; then
  say "building initramfs for $kver"
  ird=$(mktemp -d)
  mkdir -p "$ird"/{bin,proc,sys,dev,mnt,modules,newroot}
  cp /bin/busybox "$ird/bin/busybox"
  for m in $modules; do
    f=$(find "$moddir" -name "$m.ko" | head -n 1)
    [ -n "$f" ] || { say "module $m not found in $kpkg"; exit 125; }
    cp "$f" "$ird/modules/"
  done
  echo "$modules" | tr '\n' ' ' > "$ird/modules/order"
  cp "$init_src" "$ird/init"
  chmod +x "$ird/init"
  (cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) > "$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$ird"
fi

# --- the run ---------------------------------------------------------------------------------
run=$(mktemp -d /tmp/rxe_vm.XXXXXX)
chmod 777 "$run"
pids=()
cleanup() {
  # CONT first: a frozen (--freeze-peer-on) qemu would otherwise never act on the TERM.
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  rm -rf "$run"
}
trap cleanup EXIT

# Prepares guest $1's shared folder: its address, the command, the shared folder's path.
prepare() {
  local dir="$run/$1" addr="$2" peer_addr="$3"; shift 3
  mkdir -p "$dir"; chmod 777 "$dir"
  printf 'RXE_ADDR=%s\nRXE_PEER_ADDR=%s\n' "$addr" "$peer_addr" > "$dir/net.env"
  [ -n "$share" ] && printf '%s' "$share" > "$dir/share_dir"
  {
    printf 'cd %q\n' "$PWD"
    printf 'export RXE_MTU=%q\n' "$mtu"
    # Carry the caller's test-related environment into the guest.
    env | grep -E '^(RDMARPC_|TEST_|XML_OUTPUT_FILE|HOME=|PATH=)' | sed 's/^/export /; s/=\(.*\)$/="\1"/' || true
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
  } > "$dir/cmd.sh"
  touch "$dir/output"
}

accel="-accel tcg,thread=multi -cpu max"
if [ "${RDMARPC_VM_KVM:-0}" = 1 ] && [ -w /dev/kvm ]; then accel="-accel kvm -cpu host"; fi

# Boots guest $1; $2.. are extra qemu arguments (its NIC in two-VM mode).
boot() {
  local name="$1"; shift
  local dir="$run/$name"
  local extra=()
  [ -n "$share" ] && extra+=(-virtfs "local,path=$share,mount_tag=outshare,security_model=none")
  # tsc=reliable: under TCG the guest kernel finds its two vCPUs' TSCs "unsynchronized" at boot
  # and falls back to the HPET clocksource, where every clock_gettime is a system call and an
  # emulated device read: 869 ns against 56-74 ns on the TSC (measured in this guest,
  # 2026-12-04). qemu derives every vCPU's TSC from the host's one counter, so they agree; and
  # a hardware RDMA host reads its clock through the vDSO too. Without it, every clock read in
  # the programs under test (deadlines, timers, the event loop's timeouts) was charged 12-15x.
  # shellcheck disable=SC2086
  qemu-system-x86_64 $accel -m "$mem" -smp 2 \
    -kernel "$vmlinuz" -initrd "$initrd" \
    -append "console=ttyS0 loglevel=4 panic=-1 nokaslr tsc=reliable" \
    -nodefaults -display none -no-reboot \
    -serial "file:$dir/console.log" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$dir,mount_tag=runshare,security_model=none" \
    "${extra[@]}" "$@" 2>>"$dir/qemu.log" &
}

if [ -z "$peer_cmd" ]; then
  prepare main 198.18.0.1 "" "$@"
  mem="$mem_opt"
  boot main -nic none
  qpid=$!; pids+=("$qpid")
else
  # Two guests joined by a point-to-point link over a unix socket on this host: rxe traffic
  # crosses a real (virtual) wire, and nothing leaves the host.
  prepare main 198.18.0.1 198.18.0.2 "$@"
  prepare peer 198.18.0.2 198.18.0.1 bash -c "$peer_cmd"
  mem=1536M
  boot peer -netdev "stream,id=link,server=on,addr.type=unix,addr.path=$run/link.sock" \
    -device virtio-net-pci,netdev=link,mac=52:54:00:12:00:02
  ppid=$!; pids+=("$ppid")
  for _ in $(seq 100); do [ -S "$run/link.sock" ] && break; sleep 0.1; done
  boot main -netdev "stream,id=link,server=off,addr.type=unix,addr.path=$run/link.sock" \
    -device virtio-net-pci,netdev=link,mac=52:54:00:12:00:01
  qpid=$!; pids+=("$qpid")
  tail -s 0.2 -n +1 -f "$run/peer/output" --pid="$ppid" 2>/dev/null | sed -u 's/^/[peer] /' &
  pids+=($!)
  if [ -n "$freeze_on" ]; then
    # A polling loop, not `tail -f | grep`: that pipeline only ends when tail does.
    ( while kill -0 "$qpid" 2>/dev/null; do
        if grep -q -F -- "$freeze_on" "$run/main/output" 2>/dev/null; then
          kill -STOP "$ppid" 2>/dev/null && say "peer VM frozen (SIGSTOP)"
          break
        fi
        sleep 0.1
      done ) </dev/null >/dev/null &
    pids+=($!)
  fi
fi
tail -s 0.2 -n +1 -f "$run/main/output" --pid="$qpid" &
tpid=$!; pids+=("$tpid")

# The watchdog must not hold our stdout: a caller reading it through a pipe would wait for the
# orphaned sleep.
( sleep "$timeout_s"; kill "$qpid" 2>/dev/null ) </dev/null >/dev/null 2>&1 &
killer=$!
wait "$qpid" || true
pkill -P "$killer" sleep 2>/dev/null || true
kill "$killer" 2>/dev/null || true
[ -n "${ppid:-}" ] && { kill -CONT "$ppid" 2>/dev/null || true; kill "$ppid" 2>/dev/null || true; }
# tail ends by itself once it has printed everything and sees qemu gone.
wait "$tpid" 2>/dev/null || true

cat "$run/main/qemu.log" >&2 2>/dev/null || true
if [ -f "$run/main/rc" ]; then
  exit "$(cat "$run/main/rc")"
fi
if ! grep -q "rxe_vm guest: ready" "$run/main/console.log" 2>/dev/null; then
  say "the VM did not come up; console log:"
  tail -n 40 "$run/main/console.log" >&2 || true
  exit 125
fi
say "timed out after ${timeout_s}s; end of the guest console:"
tail -n 20 "$run/main/console.log" >&2 || true
exit 124

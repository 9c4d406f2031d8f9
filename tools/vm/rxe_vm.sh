#!/usr/bin/env bash
# Runs a command inside a qemu VM with a real RDMA verbs stack (Soft-RoCE, rdma_rxe), on any
# Debian/Ubuntu machine without an RDMA NIC. The guest runs the host's own userspace (the host
# root is shared read-only under a tmpfs overlay), so binaries built on the host run unchanged.
#
#   tools/vm/rxe_vm.sh [--timeout SECONDS] [--mtu N] [--] COMMAND [ARGS...]
#
# Inside the guest: rxe0 is configured on dummy0 with address $RXE_ADDR (198.18.0.1, from the
# benchmarking range; the guest has no host-facing NIC, so nothing it sends leaves the VM),
# `ulimit -l` is unlimited, and the working directory is the caller's. The command's output is
# streamed here; this script exits with the command's exit status (124 on timeout, 125 when the
# VM itself failed).
#
# The kernel (Debian's linux-image-amd64 package) is fetched once with `apt-get download` into
# $RDMARPC_VM_CACHE (default ~/.cache/rdmarpc-vm) and unpacked there, never installed.
set -euo pipefail

timeout_s=600
mtu=1500
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s="$2"; shift 2 ;;
    --mtu) mtu="$2"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--timeout S] [--mtu N] [--] COMMAND..." >&2; exit 2; }

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

# --- one run -------------------------------------------------------------------------------
run=$(mktemp -d /tmp/rxe_vm.XXXXXX)
chmod 777 "$run"
cleanup() {
  [ -n "${qpid:-}" ] && kill "$qpid" 2>/dev/null || true
  [ -n "${tpid:-}" ] && kill "$tpid" 2>/dev/null || true
  rm -rf "$run"
}
trap cleanup EXIT
{
  printf 'cd %q\n' "$PWD"
  printf 'export RXE_MTU=%q\n' "$mtu"
  # Carry the caller's test-related environment into the guest.
  env | grep -E '^(RDMARPC_|TEST_|XML_OUTPUT_FILE|HOME=|PATH=)' | sed 's/^/export /; s/=\(.*\)$/="\1"/' || true
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} > "$run/cmd.sh"
touch "$run/output"

accel="-accel tcg,thread=multi -cpu max"
if [ "${RDMARPC_VM_KVM:-0}" = 1 ] && [ -w /dev/kvm ]; then accel="-accel kvm -cpu host"; fi
# shellcheck disable=SC2086
qemu-system-x86_64 $accel -m 2G -smp 2 \
  -kernel "$vmlinuz" -initrd "$initrd" \
  -append "console=ttyS0 loglevel=4 panic=-1 nokaslr" \
  -nodefaults -display none -no-reboot -nic none \
  -serial "file:$run/console.log" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$run,mount_tag=runshare,security_model=none" &
qpid=$!
tail -n +1 -f "$run/output" --pid="$qpid" &
tpid=$!

( sleep "$timeout_s"; kill "$qpid" 2>/dev/null ) &
killer=$!
wait "$qpid" || true
kill "$killer" 2>/dev/null || true
sleep 0.2
kill "$tpid" 2>/dev/null || true
wait "$tpid" 2>/dev/null || true

if [ -f "$run/rc" ]; then
  exit "$(cat "$run/rc")"
fi
if ! grep -q "rxe_vm guest: ready" "$run/console.log" 2>/dev/null; then
  say "the VM did not come up; console log:"
  tail -n 40 "$run/console.log" >&2 || true
  exit 125
fi
say "timed out after ${timeout_s}s"
exit 124

#!/bin/busybox sh
# PID 1 of the Soft-RoCE guest (see rxe_vm.sh): load modules, mount the host root read-only
# under a tmpfs overlay, configure rxe0, run /run-share/cmd.sh, record its exit code, power off.
# /run-share/net.env (written by rxe_vm.sh) says this guest's address and, in two-VM mode, the
# peer's; /run-share/share_dir names a host folder mounted writable at the same path.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do
  insmod /modules/$m.ko 2>/dev/null || echo "rxe_vm guest: insmod $m failed"
done
mkdir -p /mnt/lower /mnt/rw /mnt/share
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /mnt/lower || {
  echo "rxe_vm guest: cannot mount host root"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 runshare /mnt/share
mount -t tmpfs -o size=1G tmpfs /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work /newroot || {
  echo "rxe_vm guest: overlay failed" > /mnt/share/output; poweroff -f; }
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm /newroot/run-share
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mount -t tmpfs tmpfs /newroot/tmp
mount -t tmpfs tmpfs /newroot/run
mkdir -p /newroot/run-share
mount --bind /mnt/share /newroot/run-share
mount -t configfs configfs /newroot/sys/kernel/config 2>/dev/null
if [ -s /mnt/share/share_dir ]; then
  d=$(cat /mnt/share/share_dir)
  mkdir -p "/newroot$d"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 outshare "/newroot$d" ||
    echo "rxe_vm guest: cannot mount shared folder $d" > /dev/console
fi

cat > /newroot/run/rxe_setup.sh <<'SETUP'
set -e
# One guest: rxe0 on a dummy interface (loopback traffic only). Two guests: rxe0 on the virtio
# NIC that qemu joins to the other guest's.
dev=dummy0
[ -e /sys/class/net/eth0 ] && dev=eth0
ip link set lo up
ip link set "$dev" mtu "${RXE_MTU:-1500}"
ip addr add "$RXE_ADDR/24" dev "$dev"
ip link set "$dev" up
rdma link add rxe0 type rxe netdev "$dev"
for i in $(seq 100); do
  gid=$(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null || true)
  case "$gid" in *ffff:c612:*) break ;; esac  # the IPv4 GID of 198.18.0.x is there
  sleep 0.05
done
SETUP
echo "rxe_vm guest: ready" > /dev/console
chroot /newroot /bin/bash -c '
  . /run-share/net.env
  export RXE_ADDR RXE_PEER_ADDR
  bash /run/rxe_setup.sh >/run-share/output 2>&1 || { echo "rxe setup failed" >>/run-share/output; echo 125 >/run-share/rc; exit; }
  ulimit -l unlimited
  bash /run-share/cmd.sh >>/run-share/output 2>&1 </dev/null
  echo $? > /run-share/rc.tmp && mv /run-share/rc.tmp /run-share/rc
'
sync
poweroff -f

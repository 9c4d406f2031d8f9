#!/usr/bin/env bash
# Installs every Debian package rdmarpc needs to build, test and run its RDMA VM suite.
# Idempotent: safe to run again; apt-get skips what is already installed.
set -euo pipefail

PACKAGES=(
  # build
  bazel-bootstrap g++ default-jdk-headless
  libboost1.81-dev libboost-program-options1.81-dev
  libprotobuf-dev libprotoc-dev protobuf-compiler
  libspdlog-dev libfmt-dev
  libssl-dev
  catch2
  # using rdmarpc outside Bazel (tools/install.sh, examples/cmake)
  cmake pkgconf
  # benchmarks (tools/bench): plots, instruction counts, the report, the gRPC C++ yardstick
  gnuplot-nox valgrind python3 libgrpc++-dev protobuf-compiler-grpc
  # io_uring: the TCP transport receives through it in rdmarpc's event loop (transport/poller.h)
  liburing-dev
  # key-value sample: its persistent engine
  librocksdb-dev
  # RDMA userspace (verbs, rdma_cm, rxe provider) and its tools
  rdma-core ibverbs-providers libibverbs-dev librdmacm-dev ibverbs-utils rdmacm-utils perftest
  iproute2
  # fuzzing (tools/fuzz): clang with libFuzzer and the sanitizer runtimes
  clang libclang-rt-14-dev
  # formatting check (tools/format.sh --check, in tools/test.sh)
  clang-format
  # metrics tests: promtool checks the exposition, a real Prometheus server scrapes it
  prometheus curl
  # Soft-RoCE VM runner
  qemu-system-x86 busybox-static kmod cpio
)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"

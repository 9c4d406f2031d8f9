#!/usr/bin/env bash
# Installs rdmarpc for builds outside Bazel (CMake, Make, ...): builds it, then puts under PREFIX
#   include/rdmarpc/rpc/*.h, include/rdmarpc/transport/...   the public headers
#   include/rdmarpc/rpc/options.proto                       method options (protoc -I that dir)
#   lib/librdmarpc.a                                        the runtime (rpc and transport layers,
#                                                           the health service, metrics,
#                                                           ReadSecretFile, rpc/options.proto's
#                                                           messages)
#   bin/protoc-gen-rdmarpc                                  the protoc plugin
#   bin/rdmarpc                                             the command-line client
#   lib/pkgconfig/rdmarpc.pc                                for pkg-config / CMake's pkg_check_modules
# Usage: tools/install.sh [--prefix DIR]   (default /usr/local; run tools/setup.sh first)
# Then: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs rdmarpc, and
# protoc --plugin=protoc-gen-rdmarpc=PREFIX/bin/protoc-gen-rdmarpc --rdmarpc_out=... --cpp_out=...
# examples/cmake is a complete CMake project built this way (CI builds it).
set -euo pipefail
prefix=/usr/local
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory (see tools/install.sh --help)" >&2; exit 2; }
              prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    *) echo "install.sh: unknown argument $1 (see tools/install.sh --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in /*) ;; *) prefix="$PWD/$prefix" ;; esac
cd "$(dirname "$0")/.."

version=0.1.0
runtime="//rpc //rpc:health //rpc:metrics //rpc:options_rdmarpc //rpc:secret_file //transport"
# Every library of the two layers that the runtime's targets link, asked of Bazel, so that a
# library added later is not left out (one was, once: the fresh clone's CMake build failed to
# link). They are built here by name: building the runtime alone does not make their archives
# (its links take the object files), and an archive left from an older build would be stale.
libs=$(bazel query --noshow_progress \
  "kind('cc_library rule', deps(set($runtime)) intersect set(//rpc/... //transport/...))")
# shellcheck disable=SC2086
bazel build --config=ci $runtime $libs //tools/codegen:protoc-gen-rdmarpc //tools/cli:rdmarpc
bin=$(bazel info --config=ci bazel-bin 2>/dev/null)

mkdir -p "$prefix/include/rdmarpc" "$prefix/lib/pkgconfig" "$prefix/bin"
# Headers keep their paths: they include each other as "rpc/..." and "transport/...", and so
# does generated code.
for h in $(find rpc transport -name '*.h' | sort); do
  install -D -m 644 "$h" "$prefix/include/rdmarpc/$h"
done
# Generated: the health service's messages, and rpc/options.proto's (its extension), which the
# code protoc generates for a .proto file that imports it includes.
for h in rpc/health.pb.h rpc/health.rdmarpc.pb.h rpc/options.pb.h; do
  install -D -m 644 "$bin/$h" "$prefix/include/rdmarpc/$h"
done
# The method options (rpc/options.proto), for protoc -I PREFIX/include/rdmarpc.
install -D -m 644 rpc/options.proto "$prefix/include/rdmarpc/rpc/options.proto"
# One archive for both layers (the rpc layer needs the transport layer): the libraries above.
# Header-only libraries have no archive.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  echo "CREATE $tmp/librdmarpc.a"
  for label in $libs; do
    pkg=${label#//}
    pkg=${pkg%%:*}
    archive="$bin/$pkg/lib${label##*:}.a"
    if [ -f "$archive" ]; then echo "ADDLIB $archive"; fi
  done
  echo "SAVE"
  echo "END"
} | ar -M
install -m 644 "$tmp/librdmarpc.a" "$prefix/lib/librdmarpc.a"
install -m 755 "$bin/tools/codegen/protoc-gen-rdmarpc" "$prefix/bin/protoc-gen-rdmarpc"
install -m 755 "$bin/tools/cli/rdmarpc" "$prefix/bin/rdmarpc"
cat >"$prefix/lib/pkgconfig/rdmarpc.pc" <<EOF
prefix=$prefix
includedir=\${prefix}/include/rdmarpc
libdir=\${prefix}/lib
# The protoc plugin: protoc --plugin=protoc-gen-rdmarpc=\${protoc_plugin} --rdmarpc_out=DIR
protoc_plugin=\${prefix}/bin/protoc-gen-rdmarpc

Name: rdmarpc
Description: Asynchronous RPC on RDMA (and TCP) with C++20 coroutines
Version: $version
Requires: protobuf spdlog libibverbs librdmacm libcrypto liburing
Cflags: -std=c++20 -I\${includedir}
Libs: -L\${libdir} -lrdmarpc -pthread
EOF
echo "install.sh: rdmarpc $version installed under $prefix"
echo "  PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs rdmarpc"

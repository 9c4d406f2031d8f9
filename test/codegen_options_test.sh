#!/usr/bin/env bash
# protoc-gen-rdmarpc and rpc/options.proto, run as protoc runs them: option
# (rdmarpc.inline_handler) makes a unary method's server handler a plain function, and on a
# streaming method it is refused with an error that names the method.
set -euo pipefail
plugin=$PWD/tools/codegen/protoc-gen-rdmarpc
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/src/rpc" "$out/gen"
cp rpc/options.proto "$out/src/rpc/options.proto"
cat >"$out/src/good.proto" <<'PROTO'
syntax = "proto3";
package opt;
import "rpc/options.proto";
message M { string s = 1; }
service S {
  rpc Fast(M) returns (M) { option (rdmarpc.inline_handler) = true; }
  rpc Off(M) returns (M) { option (rdmarpc.inline_handler) = false; }
  rpc Plain(M) returns (M);
}
PROTO
protoc --plugin=protoc-gen-rdmarpc="$plugin" --rdmarpc_out="$out/gen" -I"$out/src" \
  "$out/src/good.proto"
fail() {
  echo "FAIL: $1"
  [ $# -lt 2 ] || cat "$2"
  exit 1
}
h="$out/gen/good.rdmarpc.pb.h"
cc="$out/gen/good.rdmarpc.pb.cc"
grep -q '^    virtual ::rdmarpc::Status Fast($' "$h" || fail "Fast is not a plain function" "$h"
grep -q '^    virtual ::boost::asio::awaitable<::rdmarpc::Status> Off($' "$h" ||
  fail "Off (option false) is not a coroutine" "$h"
grep -q '^    virtual ::boost::asio::awaitable<::rdmarpc::Status> Plain($' "$h" ||
  fail "Plain is not a coroutine" "$h"
grep -q 'UnaryMethodHandler<::opt::M, ::opt::M, true> kS_0_handler' "$cc" ||
  fail "Fast's handler is not inline" "$cc"
echo "ok: inline only where the option is true"

cat >"$out/src/bad.proto" <<'PROTO'
syntax = "proto3";
package opt;
import "rpc/options.proto";
message M { string s = 1; }
service S {
  rpc Watch(M) returns (stream M) { option (rdmarpc.inline_handler) = true; }
}
PROTO
if protoc --plugin=protoc-gen-rdmarpc="$plugin" --rdmarpc_out="$out/gen" -I"$out/src" \
  "$out/src/bad.proto" 2>"$out/err"; then
  fail "an inline server stream was accepted"
fi
grep -q 'opt.S.Watch: option (rdmarpc.inline_handler) is for unary methods only' "$out/err" ||
  fail "unexpected error:" "$out/err"
echo "ok: refused on a stream: $(head -1 "$out/err")"
echo "codegen_options_test: ok"

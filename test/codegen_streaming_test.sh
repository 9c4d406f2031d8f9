#!/usr/bin/env bash
# protoc with protoc-gen-rdmarpc must refuse a streaming method with an error naming it: not
# crash, not skip it silently.
set -u
plugin="tools/codegen/protoc-gen-rdmarpc"
out=$(mktemp -d)
log="$out/log"
if /usr/bin/protoc --plugin=protoc-gen-rdmarpc="$plugin" --rdmarpc_out="$out" -I. \
     test/protos/codegen/streaming.proto >"$log" 2>&1; then
  echo "FAIL: protoc accepted a streaming method"; cat "$log"; exit 1
fi
cat "$log"
grep -q "acme.stream.Uploader.Upload" "$log" || { echo "FAIL: error does not name the method"; exit 1; }
grep -q "client-streaming" "$log" || { echo "FAIL: error does not say what kind of streaming"; exit 1; }
grep -qi "segmentation\|core dumped\|terminate" "$log" && { echo "FAIL: plugin crashed"; exit 1; }
[ -z "$(ls "$out" | grep -v '^log$')" ] || { echo "FAIL: files were written"; exit 1; }
# In the JUnit sense this is one test case; write it so tools/test.sh counts it.
if [ -n "${XML_OUTPUT_FILE:-}" ]; then
  printf '<testsuites><testsuite name="codegen_streaming" tests="1" failures="0"><testcase name="streaming method is refused"/></testsuite></testsuites>\n' > "$XML_OUTPUT_FILE"
fi
echo "PASS"

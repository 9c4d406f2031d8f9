// Fuzz target: DecodedBytes (rpc/internal/decoded_size.h), which reads from a message's wire bytes
// what it will take once parsed, before anything parses it. Byte 0 picks the type the rest is read
// as: FileDescriptorProto (nesting, repeated strings and messages, enums, packed varints in its
// SourceCodeInfo), Struct (a map of messages, recursion through Value) or Empty (every field
// unknown, groups included). For any input the walk must not crash or read past the bytes; and
// whenever protobuf parses them, the estimate must be finite and at least what the parsed
// message reports it uses (SpaceUsedLong): a shape the walk undercounts is a shape a peer could
// use to make the server hold more than it counts.
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/empty.pb.h>
#include <google/protobuf/struct.pb.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <span>

#include "rpc/internal/decoded_size.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::unique_ptr<google::protobuf::Message> m;
  switch (data[0] % 3) {
    case 0:
      m = std::make_unique<google::protobuf::FileDescriptorProto>();
      break;
    case 1:
      m = std::make_unique<google::protobuf::Struct>();
      break;
    default:
      m = std::make_unique<google::protobuf::Empty>();
      break;
  }
  const auto payload = std::span(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  const size_t estimate = rdmarpc::internal::DecodedBytes(*m->GetDescriptor(), payload);
  if (estimate < payload.size()) std::abort();  // never below the wire size
  if (!m->ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  const size_t used = m->SpaceUsedLong();
  if (estimate == std::numeric_limits<size_t>::max() || estimate < used) {
    std::fprintf(stderr, "type %s: %zu wire bytes, estimate %zu, parsed message uses %zu\n",
                 m->GetTypeName().c_str(), payload.size(), estimate, used);
    std::abort();
  }
  return 0;
}

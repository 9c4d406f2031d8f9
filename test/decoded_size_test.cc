// DecodedBytes (rpc/internal/decoded_size.h): read from the wire bytes alone, it must never say
// less than what the parsed message takes (protobuf's own SpaceUsedLong, which leaves out
// malloc's headers), and not so much more that ordinary messages would be refused for it.
#include "rpc/internal/decoded_size.h"

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/struct.pb.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <string>

#include "proto/kv.pb.h"
#include "test/protos/test_service.pb.h"

namespace {

using rdmarpc::internal::DecodedBytes;

std::span<const std::byte> Bytes(const std::string& s) {
  return std::span(reinterpret_cast<const std::byte*>(s.data()), s.size());
}

// Parses `wire` as a `M`, and checks the estimate against what the parsed message uses.
template <class M>
void CheckShape(const char* shape, const std::string& wire, double at_most_times = 4) {
  M parsed;
  REQUIRE(parsed.ParseFromString(wire));
  const size_t used = parsed.SpaceUsedLong();
  const size_t estimate = DecodedBytes(*M::descriptor(), Bytes(wire));
  std::printf("%-58s wire %9zu  parsed %10zu  estimate %10zu  (%.2fx)\n", shape, wire.size(), used,
              estimate, double(estimate) / double(used));
  INFO(shape << ": wire " << wire.size() << ", parsed " << used << ", estimate " << estimate);
  CHECK(estimate >= used);
  CHECK(estimate >= wire.size());
  CHECK(double(estimate) <= at_most_times * double(used) + 512);
}

std::string Repeat(std::string_view unit, size_t n) {
  std::string s;
  s.reserve(unit.size() * n);
  for (size_t i = 0; i < n; ++i) s += unit;
  return s;
}

}  // namespace

TEST_CASE("DecodedBytes never says less than the parsed message takes", "[decoded]") {
  {
    rdmarpc::testing::EchoRequest m;
    m.set_payload(std::string(1 << 20, 'x'));
    CheckShape<rdmarpc::testing::EchoRequest>("one 1 MiB bytes field", m.SerializeAsString());
  }
  {
    kv::MultiGetRequest m;
    for (int i = 0; i < 100000; ++i) m.add_keys("");
    CheckShape<kv::MultiGetRequest>("100,000 empty repeated bytes", m.SerializeAsString());
  }
  {
    kv::MultiGetRequest m;
    for (int i = 0; i < 1000; ++i) m.add_keys(std::string(100, 'k'));
    CheckShape<kv::MultiGetRequest>("1,000 repeated bytes of 100", m.SerializeAsString());
  }
  {
    kv::ScanReply m;
    for (int i = 0; i < 10000; ++i) {
      kv::Entry* e = m.add_entries();
      e->set_key("key" + std::to_string(i));
      e->set_value(std::string(100, 'v'));
      e->set_version(uint64_t(i) << 20);
    }
    CheckShape<kv::ScanReply>("10,000 repeated messages (3 fields each)", m.SerializeAsString());
  }
  {
    kv::ScanReply m;
    for (int i = 0; i < 100000; ++i) m.add_entries();
    CheckShape<kv::ScanReply>("100,000 empty repeated messages", m.SerializeAsString());
  }
  {
    google::protobuf::SourceCodeInfo m;  // packed repeated int32 (path, span)
    for (int i = 0; i < 1000; ++i) {
      auto* l = m.add_location();
      for (int j = 0; j < 50; ++j) l->add_path(j);
      for (int j = 0; j < 4; ++j) l->add_span(1000 + j);
    }
    CheckShape<google::protobuf::SourceCodeInfo>("packed repeated varints in 1,000 messages",
                                                 m.SerializeAsString());
  }
  {
    google::protobuf::FileDescriptorProto m;  // nesting, repeated strings, enums, options
    kv::ScanReply::descriptor()->file()->CopyTo(&m);
    CheckShape<google::protobuf::FileDescriptorProto>("kv.proto's own descriptor",
                                                      m.SerializeAsString());
  }
#if !defined(__SANITIZE_THREAD__)
  // Not under ThreadSanitizer: protobuf's inline map code, built with it against Debian's
  // libprotobuf built without, crashes on the first insert (map.h's look-up of an empty table).
  {
    google::protobuf::Struct m;  // a map of messages
    for (int i = 0; i < 10000; ++i) {
      (*m.mutable_fields())["k" + std::to_string(i)].set_number_value(i);
    }
    // Maps are overcounted most: each entry's value object is counted with its node and again
    // as the entry's field.
    CheckShape<google::protobuf::Struct>("a map of 10,000 entries", m.SerializeAsString(), 6);
  }
#endif
}

TEST_CASE("DecodedBytes counts fields the message does not declare", "[decoded]") {
  using rdmarpc::testing::EchoRequest;
  // Field 15, length-delimited, empty: two bytes each.
  CheckShape<EchoRequest>("100,000 empty unknown length-delimited fields",
                          Repeat(std::string_view("\x7a\x00", 2), 100000));
  // Field 15 as a varint.
  CheckShape<EchoRequest>("100,000 unknown varints",
                          Repeat(std::string_view("\x78\x01", 2), 100000));
  // Field 15 as a group holding a varint field 1: start 0x7b, field 1 varint, end 0x7c.
  CheckShape<EchoRequest>("10,000 unknown groups",
                          Repeat(std::string_view("\x7b\x08\x01\x7c", 4), 10000));
  // The declared bytes field sent as a varint: kept as an unknown field too.
  CheckShape<EchoRequest>("100,000 of the payload field as varints",
                          Repeat(std::string_view("\x08\x01", 2), 100000));
  // 16 MiB of empty unknown fields: what the hostile test sends.
  const std::string wire = Repeat(std::string_view("\x7a\x00", 2), 8 << 20);
  CHECK(DecodedBytes(*EchoRequest::descriptor(), Bytes(wire)) > (400u << 20));
}

TEST_CASE("DecodedBytes stops where the parser would", "[decoded]") {
  const auto* type = rdmarpc::testing::EchoRequest::descriptor();
  // Malformed: a length past the end, a varint that never ends, an end group with no start.
  for (const std::string& bad : {std::string("\x0a\x05"
                                             "ab",
                                             4),
                                 std::string(12, '\xff'), std::string("\x7c", 1)}) {
    CHECK(DecodedBytes(*type, Bytes(bad)) < 1024);
  }
  // Nested past protobuf's recursion limit: unknown groups 101 deep.
  const std::string deep = Repeat("\x7b", 101) + Repeat("\x7c", 101);
  CHECK(DecodedBytes(*type, Bytes(deep)) == std::numeric_limits<size_t>::max());
  // And 100 deep is fine.
  const std::string ok = Repeat("\x7b", 100) + Repeat("\x7c", 100);
  CHECK(DecodedBytes(*type, Bytes(ok)) < 100 * 1024);
}

// The client asks DecodedExcess of the message it parses into, whatever its class: a generated
// one (its descriptor is remembered per class), or a DynamicMessage (as the rdmarpc tool's),
// whose one class serves many types: each must be read with its own descriptor.
TEST_CASE("DecodedExcess reads each message with its own type", "[decoded]") {
  using rdmarpc::internal::DecodedExcess;
  kv::MultiGetRequest keys;  // field 1: repeated bytes
  for (int i = 0; i < 1000; ++i) keys.add_keys("");
  const std::string wire = keys.SerializeAsString();
  const auto* as_keys = kv::MultiGetRequest::descriptor();
  const auto* as_echo = rdmarpc::testing::EchoRequest::descriptor();  // field 1: singular bytes
  const size_t keys_excess = DecodedBytes(*as_keys, Bytes(wire)) - wire.size();
  const size_t echo_excess = DecodedBytes(*as_echo, Bytes(wire)) - wire.size();
  REQUIRE(keys_excess != echo_excess);
  google::protobuf::DynamicMessageFactory factory;
  std::unique_ptr<google::protobuf::Message> dyn_keys(factory.GetPrototype(as_keys)->New());
  std::unique_ptr<google::protobuf::Message> dyn_echo(factory.GetPrototype(as_echo)->New());
  kv::MultiGetRequest gen_keys;
  rdmarpc::testing::EchoRequest gen_echo;
  for (int round = 0; round < 2; ++round) {
    CHECK(DecodedExcess(*dyn_keys, Bytes(wire)) == keys_excess);
    CHECK(DecodedExcess(*dyn_echo, Bytes(wire)) == echo_excess);
    CHECK(DecodedExcess(gen_keys, Bytes(wire)) == keys_excess);
    CHECK(DecodedExcess(gen_echo, Bytes(wire)) == echo_excess);
  }
  CHECK(DecodedExcess(gen_keys, Bytes(wire.substr(0, 100))) == 0);  // under 256 bytes: not walked
}

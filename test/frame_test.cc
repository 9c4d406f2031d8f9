// The frame codec: round trips, and rejection of truncated or garbled input.
#include "rpc/internal/frame.h"

#include <google/protobuf/descriptor.pb.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "rpc/internal/frame_writer.h"
#include "rpc/internal/parse.h"
#include "rpc/internal/stream_queue.h"
#include "test/protos/test_service.pb.h"
#include "transport/uri.h"

using namespace rdmarpc;

namespace {
std::vector<std::byte> Encode(const FrameHeader& h, std::string_view payload) {
  std::vector<std::byte> buf(kFrameHeaderBytes + payload.size());
  EncodeFrameHeader(h, buf.data());
  std::memcpy(buf.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return buf;
}
}  // namespace

TEST_CASE("a frame header round-trips every field", "[codec]") {
  FrameHeader h;
  h.type = FrameType::kResponse;
  h.flags = 0x5a;
  h.method_id = 0xdeadbeef;
  h.call_id = 0x0123456789abcdefull;
  h.timeout_us = 0xfedcba9876543210ull;
  h.status = 14;
  auto buf = Encode(h, "payload!");
  DecodedFrame f;
  REQUIRE(DecodeFrame(buf, &f).empty());
  CHECK(f.header.type == FrameType::kResponse);
  CHECK(f.header.flags == 0x5a);
  CHECK(f.header.method_id == 0xdeadbeef);
  CHECK(f.header.call_id == 0x0123456789abcdefull);
  CHECK(f.header.timeout_us == 0xfedcba9876543210ull);
  CHECK(f.header.status == 14);
  CHECK(f.metadata.empty());
  CHECK(std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()) ==
        "payload!");
}

TEST_CASE("the header layout is little-endian as documented", "[codec]") {
  FrameHeader h;
  h.type = FrameType::kRequest;
  h.method_id = 0x04030201;
  h.call_id = 0x0807060504030201ull;
  auto buf = Encode(h, "");
  CHECK(static_cast<uint8_t>(buf[0]) == kFrameMagic);
  CHECK(static_cast<uint8_t>(buf[1]) == kProtocolVersion);
  CHECK(static_cast<uint8_t>(buf[2]) == 1);
  CHECK(static_cast<uint8_t>(buf[4]) == 0x01);
  CHECK(static_cast<uint8_t>(buf[7]) == 0x04);
  CHECK(static_cast<uint8_t>(buf[8]) == 0x01);
  CHECK(static_cast<uint8_t>(buf[15]) == 0x08);
}

TEST_CASE("metadata round-trips, including empty and binary values", "[codec]") {
  Metadata md = {{"k", "v"}, {"", ""}, {"bin", std::string("\0\xff\x01", 3)}};
  std::vector<std::byte> buf(MetadataEncodedSize(md));
  EncodeMetadata(md, buf.data());
  Metadata out;
  REQUIRE(DecodeMetadata(buf, &out).empty());
  CHECK(out == md);
}

TEST_CASE("truncated frames are rejected", "[codec]") {
  FrameHeader h;
  auto buf = Encode(h, "abc");
  DecodedFrame f;
  for (size_t n = 0; n < kFrameHeaderBytes; ++n) {
    INFO("length " << n);
    CHECK_THAT(DecodeFrame(std::span(buf.data(), n), &f), Catch::Contains("truncated"));
  }
}

TEST_CASE("garbled headers are rejected with a reason", "[codec]") {
  FrameHeader h;
  DecodedFrame f;
  auto buf = Encode(h, "abc");
  auto bad_magic = buf;
  bad_magic[0] = std::byte{0};
  CHECK_THAT(DecodeFrame(bad_magic, &f), Catch::Contains("magic"));
  auto bad_version = buf;
  bad_version[1] = std::byte{99};
  CHECK_THAT(DecodeFrame(bad_version, &f), Catch::Contains("version 99"));
  auto bad_type = buf;
  bad_type[2] = std::byte{200};
  CHECK_THAT(DecodeFrame(bad_type, &f), Catch::Contains("unknown frame type 200"));
  auto zero_type = buf;
  zero_type[2] = std::byte{0};
  CHECK_THAT(DecodeFrame(zero_type, &f), Catch::Contains("unknown frame type 0"));
  auto long_md = buf;
  long_md[28] = std::byte{4};  // metadata length 4 > 3 bytes present
  CHECK_THAT(DecodeFrame(long_md, &f), Catch::Contains("metadata length"));
}

TEST_CASE("garbled metadata is rejected", "[codec]") {
  Metadata out;
  std::vector<std::byte> short_entry(5);
  CHECK_THAT(DecodeMetadata(short_entry, &out), Catch::Contains("truncated"));
  std::vector<std::byte> overrun(6);
  overrun[0] = std::byte{10};  // key of 10 bytes, none present
  CHECK_THAT(DecodeMetadata(overrun, &out), Catch::Contains("past the end"));
}

TEST_CASE("metadata entries are counted no further than one past the limit", "[codec]") {
  const auto encode = [](const Metadata& md) {
    std::vector<std::byte> buf(MetadataEncodedSize(md));
    EncodeMetadata(md, buf.data());
    return buf;
  };
  CHECK(CountMetadataEntries({}) == 0);
  CHECK(CountMetadataEntries(encode({{"k", "v"}, {"", ""}})) == 2);
  CHECK(CountMetadataEntries(encode(Metadata(kMaxMetadataEntries))) == kMaxMetadataEntries);
  CHECK(CountMetadataEntries(encode(Metadata(10'000))) == kMaxMetadataEntries + 1);
  // Garbled: counted as far as the entries parse.
  auto buf = encode({{"k", "v"}, {"k2", "v2"}});
  buf.pop_back();
  CHECK(CountMetadataEntries(buf) == 1);
  // A counted decode holds no more than it needs.
  Metadata out;
  const auto many = encode(Metadata(100));
  REQUIRE(DecodeMetadata(many, &out, CountMetadataEntries(many)).empty());
  CHECK(out.size() == 100);
  CHECK(out.capacity() == 100);
}

TEST_CASE("metadata a caller may send: within 64 KiB encoded and 1,024 entries", "[codec]") {
  CHECK(MetadataOverLimit({}).empty());
  CHECK(MetadataOverLimit(Metadata(kMaxMetadataEntries)).empty());
  CHECK(MetadataOverLimit({{"k", std::string(kMaxMetadataBytes - 7, 'v')}}).empty());
  CHECK(MetadataOverLimit({{"k", std::string(kMaxMetadataBytes - 6, 'v')}}) ==
        "call metadata of 65537 bytes encoded exceeds the limit of 65536");
  // A key the u16 length cannot hold is over the byte limit too, never cut short.
  CHECK_THAT(MetadataOverLimit({{std::string(70'000, 'k'), ""}}),
             Catch::Contains("70006 bytes encoded"));
  CHECK(MetadataOverLimit(Metadata(kMaxMetadataEntries + 1)) ==
        "call metadata of 1025 entries exceeds the limit of 1024");
}

TEST_CASE("a WINDOW payload round-trips as a little-endian u64 and must be 8 bytes", "[codec]") {
  std::byte buf[kWindowBytes + 1] = {};
  EncodeWindow(0x0102030405060708ull, buf);
  CHECK(buf[0] == std::byte{0x08});
  CHECK(buf[7] == std::byte{0x01});
  uint64_t back = 0;
  CHECK(DecodeWindow(std::span<const std::byte>(buf, kWindowBytes), &back).empty());
  CHECK(back == 0x0102030405060708ull);
  CHECK_FALSE(DecodeWindow(std::span<const std::byte>(buf, kWindowBytes - 1), &back).empty());
  CHECK_FALSE(DecodeWindow(std::span<const std::byte>(buf, kWindowBytes + 1), &back).empty());
}

TEST_CASE("URIs parse and reject malformed input", "[uri]") {
  using namespace rdmarpc::transport;
  auto a = ParseUri("tcp://127.0.0.1:7471");
  REQUIRE(a.ok());
  CHECK(a.value().scheme == Scheme::kTcp);
  CHECK(a.value().host == "127.0.0.1");
  CHECK(a.value().port == 7471);
  auto b = ParseUri("rdma://[::1]:0");
  REQUIRE(b.ok());
  CHECK(b.value().scheme == Scheme::kRdma);
  CHECK(b.value().host == "::1");
  CHECK(b.value().ToUri() == "rdma://[::1]:0");
  for (const char* bad : {"127.0.0.1:1", "udp://h:1", "tcp://h", "tcp://:1", "tcp://h:99999",
                          "tcp://h:x", "tcp://::1:5", "tcp://[::1:5"}) {
    INFO(bad);
    CHECK_FALSE(ParseUri(bad).ok());
  }
}

namespace {
// Records a message's pieces as FrameWriter::WritePieces hands them over.
struct RecordingSink final : transport::PieceSink {
  struct Piece {
    bool borrowed;
    const std::byte* at;  // borrowed: where it lies
    std::string bytes;
  };
  void Copy(std::span<const std::byte> b) override {
    pieces.push_back(
        {false, nullptr, std::string(reinterpret_cast<const char*>(b.data()), b.size())});
  }
  void Borrow(std::span<const std::byte> b) override {
    pieces.push_back(
        {true, b.data(), std::string(reinterpret_cast<const char*>(b.data()), b.size())});
  }
  std::string All() const {
    std::string out;
    for (const auto& p : pieces) out += p.bytes;
    return out;
  }
  size_t BorrowedBytes() const {
    size_t n = 0;
    for (const auto& p : pieces) n += p.borrowed ? p.bytes.size() : 0;
    return n;
  }
  std::vector<Piece> pieces;
};

std::string WrittenWhole(const transport::MessageWriter& w) {
  std::string out(w.size(), '\0');
  w.WriteTo(reinterpret_cast<std::byte*>(out.data()));
  return out;
}
}  // namespace

// TCP sends large messages as pieces (transport/tcp: SendGathered): the bytes must be exactly
// WriteTo's, and a large payload must be handed over where it lies, not copied.
TEST_CASE("a frame written as pieces is byte for byte the frame WriteTo writes", "[codec]") {
  const size_t payload_bytes = GENERATE(size_t(0), size_t(100), size_t(4079), size_t(4096),
                                        size_t(5000), size_t(70000), size_t(1) << 20);
  const size_t meta_bytes = GENERATE(size_t(0), size_t(10), size_t(9000));
  const bool with_metadata = GENERATE(false, true);
  INFO("payload " << payload_bytes << ", meta " << meta_bytes << ", metadata " << with_metadata);
  testing::EchoReply reply;
  reply.set_payload(std::string(payload_bytes, 'p'));
  for (size_t i = 0; i < payload_bytes; i += 997) (*reply.mutable_payload())[i] = char(i);
  reply.set_seq(123456789);
  reply.set_meta(std::string(meta_bytes, 'm'));
  reply.set_budget_ms(-1);
  Metadata md;
  if (with_metadata) md.emplace_back("key", "value");
  FrameHeader h;
  h.type = FrameType::kResponse;
  h.call_id = 77;
  internal::FrameWriter w(h, with_metadata ? &md : nullptr, &reply);
  RecordingSink sink;
  REQUIRE(w.WritePieces(sink));
  const std::string whole = WrittenWhole(w);
  REQUIRE(sink.All().size() == w.size());
  CHECK(sink.All() == whole);
  if (payload_bytes >= 8192) {
    // Handed over where it lies: one borrowed piece is the message's own payload string.
    bool found = false;
    for (const auto& p : sink.pieces) {
      found |= p.borrowed && p.at == reinterpret_cast<const std::byte*>(reply.payload().data()) &&
               p.bytes.size() == payload_bytes;
    }
    CHECK(found);
  }
  // Whatever it copies is small: at most a chunk (4 KiB) of each field, headers and tags.
  CHECK(w.size() - sink.BorrowedBytes() <= kFrameHeaderBytes + 64 + 3 * 4096);
}

TEST_CASE("a raw frame (no message) offers no pieces; WriteTo writes it", "[codec]") {
  FrameHeader h;
  h.type = FrameType::kPing;
  internal::FrameWriter w(h, std::string_view("raw"));
  RecordingSink sink;
  CHECK_FALSE(w.WritePieces(sink));
  CHECK(sink.pieces.empty());
}

TEST_CASE("stream credit from WINDOW frames is capped, never overflows", "[codec][stream]") {
  // An ordinary WINDOW adds what it says, to a credit that may be negative (after a message
  // larger than what was left).
  CHECK(AddStreamCredit(-1000, 4096) == 3096);
  CHECK(AddStreamCredit(0, kStreamWindowBytes / 2) == int64_t(kStreamWindowBytes / 2));
  // One frame counts for at most 2^40, however much it claims.
  CHECK(AddStreamCredit(0, ~uint64_t{0}) == int64_t{1} << 40);
  // A peer repeating the largest WINDOW (2^23 frames would pass 2^63) stops at 2^62.
  int64_t credit = 0;
  for (int i = 0; i < (1 << 23) + 10; ++i) credit = AddStreamCredit(credit, ~uint64_t{0});
  CHECK(credit == int64_t{1} << 62);
  CHECK(AddStreamCredit(credit, 1) == int64_t{1} << 62);
  CHECK(AddStreamCredit((int64_t{1} << 62) - 5, 3) == (int64_t{1} << 62) - 2);
}

TEST_CASE("status text is cut at 4 KiB, never inside a UTF-8 character", "[codec]") {
  const std::string a(kMaxStatusMessageBytes, 'a');
  CHECK(StatusTextCut(a) == a);  // at the limit: whole
  CHECK(StatusTextCut(a + "b") == a);
  // A two-, three- and four-byte character that would straddle the limit is left out whole.
  for (const std::string ch : {"\xc3\xa9", "\xe2\x80\xa8", "\xf0\x9f\x98\x80"}) {
    const std::string head(kMaxStatusMessageBytes - 1, 'h');
    INFO("character of " << ch.size() << " bytes");
    CHECK(StatusTextCut(head + ch + "tail") == head);
    // Ending exactly at the limit, it stays.
    const std::string fits(kMaxStatusMessageBytes - ch.size(), 'f');
    CHECK(StatusTextCut(fits + ch + "tail") == fits + ch);
  }
  // Bytes that are not UTF-8 (continuation bytes all along) lose at most three bytes more.
  const std::string junk(kMaxStatusMessageBytes + 10, '\x80');
  CHECK(StatusTextCut(junk).size() == kMaxStatusMessageBytes - 3);
}

// ParsePayload (rpc/internal/parse.h) parses in place and lets protobuf read the
// transport::kMessageSlopBytes that follow a payload. What those bytes hold must never change
// the outcome: for every prefix of a rich message (nested messages, repeated and packed fields,
// strings, proto2 required fields), followed by the rest of the real message (which would
// complete a cut field), by 0x00s, by 0xffs (varint continuation bytes) or by a valid tag, the
// result is ParseFromArray's on the prefix alone: the same success or failure, the same message.
TEST_CASE("a payload parses in place exactly as ParseFromArray, whatever follows it", "[codec]") {
  google::protobuf::FileDescriptorProto rich;
  google::protobuf::FileDescriptorProto::descriptor()->file()->CopyTo(&rich);
  // A message with required fields, set and unset (IsInitialized must decide as before).
  auto* option = rich.mutable_options()->add_uninterpreted_option();
  option->add_name()->set_name_part("part");
  option->mutable_name(0)->set_is_extension(true);
  option->set_string_value(std::string(40, 'x'));
  option->add_name()->set_name_part("missing is_extension");
  const std::string wire = rich.SerializePartialAsString();
  REQUIRE(wire.size() > 1000);

  const std::string fills[] = {std::string(transport::kMessageSlopBytes, '\0'),
                               std::string(transport::kMessageSlopBytes, '\xff'),
                               std::string(transport::kMessageSlopBytes, '\x0a')};
  size_t parsed = 0, refused = 0;
  for (size_t k = 0; k <= wire.size(); ++k) {
    google::protobuf::FileDescriptorProto expected;
    const bool expected_ok = expected.ParseFromArray(wire.data(), static_cast<int>(k));
    expected_ok ? ++parsed : ++refused;
    std::vector<std::string> buffers;
    buffers.push_back(wire.substr(0, k) +
                      (wire.substr(k) + std::string(transport::kMessageSlopBytes, '\0'))
                          .substr(0, transport::kMessageSlopBytes));
    for (const auto& fill : fills) buffers.push_back(wire.substr(0, k) + fill);
    for (const std::string& buf : buffers) {
      google::protobuf::FileDescriptorProto got;
      got.set_name("left over from before: the parse replaces it");
      const bool ok = internal::ParsePayload(
          got, std::span<const std::byte>(reinterpret_cast<const std::byte*>(buf.data()), k));
      INFO("prefix " << k << " of " << wire.size() << ", next byte "
                     << static_cast<int>(static_cast<unsigned char>(buf[k])));
      REQUIRE(ok == expected_ok);
      if (ok) REQUIRE(got.SerializePartialAsString() == expected.SerializePartialAsString());
    }
  }
  // Both outcomes were exercised (most cuts fall inside a field; some between two).
  CHECK(parsed > 10);
  CHECK(refused > 100);
  // The whole message, with its one missing required field, is refused; set, it parses.
  google::protobuf::FileDescriptorProto whole;
  const std::string padded = wire + std::string(transport::kMessageSlopBytes, '\0');
  const auto span = [](const std::string& s, size_t n) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), n);
  };
  CHECK_FALSE(internal::ParsePayload(whole, span(padded, wire.size())));
  option->mutable_name(1)->set_is_extension(false);
  const std::string complete =
      rich.SerializePartialAsString() + std::string(transport::kMessageSlopBytes, '\0');
  REQUIRE(internal::ParsePayload(whole,
                                 span(complete, complete.size() - transport::kMessageSlopBytes)));
  CHECK(whole.SerializePartialAsString() == rich.SerializePartialAsString());
}

TEST_CASE("a stream queue gives back each message intact, in order, whatever buffer it reused",
          "[codec][stream]") {
  using rdmarpc::testing::EchoRequest;
  internal::StreamQueue q;
  auto bytes = [](const std::string& s) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size());
  };
  // Sizes that shrink and grow around the pool's buffers; several rounds, so that later
  // messages land in buffers earlier ones left (larger and smaller, with stale bytes in them).
  const std::vector<size_t> sizes = {0, 5, 3000, 100, 70'000, 1, 64, 300'000, 15, 16, 17};
  uint64_t seq = 0;
  for (int round = 0; round < 3; ++round) {
    for (size_t burst : {1, 4, 11}) {
      std::vector<std::string> sent;
      for (size_t i = 0; i < burst; ++i) {
        EchoRequest m;
        m.set_seq(seq++);
        m.set_payload(
            std::string(sizes[(seq * 7) % sizes.size()], static_cast<char>('a' + seq % 26)));
        sent.push_back(m.SerializeAsString());
        q.Push(bytes(sent.back()));
      }
      CHECK(q.size() == burst);
      for (const std::string& s : sent) {
        REQUIRE_FALSE(q.empty());
        CHECK(q.FrontSize() == s.size());
        EchoRequest got, want;
        REQUIRE(want.ParseFromString(s));
        size_t excess = 0;
        REQUIRE(q.PopInto(got, SIZE_MAX, &excess) == internal::StreamQueue::Popped::kParsed);
        CHECK(got.seq() == want.seq());
        CHECK(got.payload() == want.payload());
      }
      CHECK(q.empty());
    }
  }
  // One that does not parse is dropped, and the next is unharmed.
  q.Push(bytes(std::string("\xff\xff\xff", 3)));
  EchoRequest ok;
  ok.set_seq(7);
  const std::string good = ok.SerializeAsString();
  q.Push(bytes(good));
  EchoRequest got;
  size_t excess = 0;
  CHECK(q.PopInto(got, SIZE_MAX, &excess) == internal::StreamQueue::Popped::kMalformed);
  CHECK(q.size() == 1);
  REQUIRE(q.PopInto(got, SIZE_MAX, &excess) == internal::StreamQueue::Popped::kParsed);
  CHECK(got.seq() == 7);
  // One that would take more parsed beyond its bytes than allowed (512 empty unknown fields,
  // ~40 KiB parsed) is dropped unparsed, and says what it would have taken; the next is unharmed.
  std::string fields;
  for (int i = 0; i < 512; ++i) fields += std::string("\x7a\x00", 2);
  q.Push(bytes(fields));
  q.Push(bytes(good));
  CHECK(q.PopInto(got, 1024, &excess) == internal::StreamQueue::Popped::kTooLarge);
  CHECK(excess > 16 * fields.size());
  CHECK(q.size() == 1);
  REQUIRE(q.PopInto(got, 1024, &excess) == internal::StreamQueue::Popped::kParsed);
  CHECK(got.seq() == 7);
  CHECK(excess == 0);  // under kDecodedCheckFromBytes: not walked
  // Dropped unread.
  q.Push(bytes(good));
  q.Pop();
  CHECK(q.empty());
}

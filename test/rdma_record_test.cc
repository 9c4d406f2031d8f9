// Records back into messages (transport/rdma/record.h), without a NIC: what a receiver does with
// the bytes a peer wrote into its ring. The same code runs on the verbs path in the VM suite;
// tools/fuzz/record_fuzz.cc throws arbitrary records at it.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "transport/rdma/record.h"

using namespace rdmarpc::transport::rdma;
using Result = RecordAssembler::Result;

namespace {
// A record: header (total, kind) and body.
std::vector<std::byte> Record(uint32_t total, uint32_t kind, const std::string& body) {
  std::vector<std::byte> r(kRecordHeaderBytes + body.size());
  StoreRecordHeader(r.data(), total, kind);
  std::memcpy(r.data() + kRecordHeaderBytes, body.data(), body.size());
  return r;
}
std::string Text(std::span<const std::byte> s) {
  return std::string(reinterpret_cast<const char*>(s.data()), s.size());
}
}  // namespace

TEST_CASE("a whole message in one record is handed out in place", "[record]") {
  RecordAssembler a(1024);
  auto rec = Record(5, kRecordData, "hello");
  Result r = a.Add(rec);
  REQUIRE(r.kind == Result::kMessage);
  CHECK(Text(r.message) == "hello");
  CHECK(r.message.data() == rec.data() + kRecordHeaderBytes);  // no copy
  CHECK_FALSE(a.assembling());
  // An empty message is a record of just a header.
  Result e = a.Add(Record(0, kRecordData, ""));
  REQUIRE(e.kind == Result::kMessage);
  CHECK(e.message.empty());
}

TEST_CASE("chunks are reassembled in order, and the buffer is freed after delivery", "[record]") {
  RecordAssembler a(1024);
  const std::string msg = "the quick brown fox jumps over the lazy dog";
  size_t at = 0;
  Result r;
  for (size_t chunk : {10u, 1u, 0u, 20u}) {
    r = a.Add(Record(static_cast<uint32_t>(msg.size()), kRecordData, msg.substr(at, chunk)));
    at += chunk;
    REQUIRE(r.kind == Result::kNeedMore);
    CHECK(a.assembling());
    CHECK(a.buffered() == at);  // grows with what arrived, not with what was announced
  }
  r = a.Add(Record(static_cast<uint32_t>(msg.size()), kRecordData, msg.substr(at)));
  REQUIRE(r.kind == Result::kMessage);
  CHECK(Text(r.message) == msg);
  a.Release();
  CHECK(a.buffered() == 0);
  // The next message starts afresh (handed out in place: the record must outlive the result).
  auto ok = Record(2, kRecordData, "ok");
  r = a.Add(ok);
  REQUIRE(r.kind == Result::kMessage);
  CHECK(Text(r.message) == "ok");
}

TEST_CASE("a rendezvous record says where to read the message", "[record]") {
  RecordAssembler a(1 << 20);
  std::vector<std::byte> rec(kRecordHeaderBytes + kRendezvousBodyBytes);
  StoreRecordHeader(rec.data(), 300000, kRecordRendezvous);
  StoreRendezvous(rec.data() + kRecordHeaderBytes, Rendezvous{0x1122334455667788ull, 0xabcd, 3});
  Result r = a.Add(rec);
  REQUIRE(r.kind == Result::kRendezvous);
  CHECK(r.total == 300000);
  CHECK(r.rendezvous.addr == 0x1122334455667788ull);
  CHECK(r.rendezvous.rkey == 0xabcd);
  CHECK(r.rendezvous.slot == 3);
}

TEST_CASE("records that break the protocol are errors that name the fault", "[record]") {
  RecordAssembler a(100);
  auto error = [&](std::span<const std::byte> rec) {
    Result r = a.Add(rec);
    CHECK(r.kind == Result::kError);
    return r.error;
  };
  std::vector<std::byte> tiny(kRecordHeaderBytes - 1);
  CHECK(error(tiny) == "protocol error: record shorter than its header");
  CHECK(error(Record(101, kRecordData, "x")) ==
        "peer sent a message of 101 bytes, over the limit of 100");
  CHECK(error(Record(4, 7, "abcd")) == "protocol error: unknown record kind 7");
  CHECK(error(Record(2, kRecordData, "abc")) == "protocol error: record longer than its message");
  CHECK(error(Record(0, kRecordRendezvous, std::string(kRendezvousBodyBytes, '\0'))) ==
        "protocol error: malformed rendezvous record");
  CHECK(error(Record(50, kRecordRendezvous, "short")) ==
        "protocol error: malformed rendezvous record");

  // Mid-message: a chunk announcing another total, one overrunning it, or a rendezvous.
  REQUIRE(a.Add(Record(10, kRecordData, "abcd")).kind == Result::kNeedMore);
  CHECK(error(Record(11, kRecordData, "e")) ==
        "protocol error: inconsistent chunk of a large message");
  RecordAssembler b(100);
  REQUIRE(b.Add(Record(10, kRecordData, "abcd")).kind == Result::kNeedMore);
  Result over = b.Add(Record(10, kRecordData, "efghijk"));
  CHECK(over.error == "protocol error: inconsistent chunk of a large message");
  RecordAssembler c(100);
  REQUIRE(c.Add(Record(10, kRecordData, "abcd")).kind == Result::kNeedMore);
  Result rdv = c.Add(Record(10, kRecordRendezvous, std::string(kRendezvousBodyBytes, '\0')));
  CHECK(rdv.error == "protocol error: malformed rendezvous record");
  // Reset (the connection closed) drops the half message.
  c.Reset();
  CHECK_FALSE(c.assembling());
  CHECK(c.buffered() == 0);
}

TEST_CASE("Whole hands out exactly the whole messages Add hands out in place, nothing else",
          "[record]") {
  // The connection tries the inline Whole first and falls back to Add: together they must hand
  // out the same messages, at the same addresses, and leave the assembler in the same state.
  RecordAssembler fast(100), plain(100);
  const std::vector<std::vector<std::byte>> records = {
      Record(5, kRecordData, "hello"),
      Record(0, kRecordData, ""),
      Record(100, kRecordData, std::string(100, 'm')),  // at the limit
      Record(101, kRecordData, std::string(101, 'o')),  // over it
      Record(10, kRecordData, "abcd"),                  // the first chunk of 10 bytes
      Record(10, kRecordData, "efghij"),                // the rest
      Record(2, kRecordData, "abc"),                    // longer than its message
      Record(4, 7, "abcd"),                             // unknown kind
      Record(40, kRecordRendezvous, std::string(kRendezvousBodyBytes, '\0')),
      std::vector<std::byte>(kRecordHeaderBytes - 1),  // shorter than a header
  };
  int whole = 0, added = 0;
  // Every order of two records, so that each one is also seen mid-message.
  for (const auto& first : records) {
    for (const auto& second : records) {
      for (const auto* rec : {&first, &second}) {
        std::span<const std::byte> message;
        const bool was_assembling = fast.assembling();
        const bool is_whole = fast.Whole(*rec, &message);
        Result p = plain.Add(*rec);
        if (is_whole) {
          ++whole;
          REQUIRE_FALSE(was_assembling);
          REQUIRE(p.kind == Result::kMessage);
          REQUIRE(p.message.data() == message.data());
          REQUIRE(p.message.size() == message.size());
          REQUIRE(message.data() == rec->data() + kRecordHeaderBytes);
        } else {
          ++added;
          Result f = fast.Add(*rec);
          REQUIRE(f.kind == p.kind);
          REQUIRE(f.error == p.error);
          REQUIRE(Text(f.message) == Text(p.message));
          if (p.kind == Result::kMessage) {
            // A whole message in one record always goes the inline way; only a reassembled
            // one comes from Add.
            REQUIRE(p.message.data() != rec->data() + kRecordHeaderBytes);
          }
        }
        REQUIRE(fast.assembling() == plain.assembling());
        REQUIRE(fast.buffered() == plain.buffered());
        if (p.kind == Result::kMessage) {
          fast.Release();
          plain.Release();
        }
        if (p.kind == Result::kError) {
          fast.Reset();
          plain.Reset();
        }
      }
      fast.Reset();
      plain.Reset();
    }
  }
  CHECK(whole > 0);
  CHECK(added > 0);
}

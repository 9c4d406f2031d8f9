// The TCP stream reassembler's memory bound (transport/tcp/reassembler.h), read pattern by read
// pattern: what a peer announces costs nothing until it arrives, and reads that stop inside a
// length prefix never make the buffer grow (they used to double it without end).
#include "transport/tcp/reassembler.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

using rdmarpc::transport::tcp::StreamReassembler;

namespace {

constexpr size_t kInitial = 64 * 1024;
constexpr size_t kMaxMessage = (64u << 20) + 4096;

std::string Message(size_t body) {
  std::string m(4 + body, 'm');
  const uint32_t len = htole32(static_cast<uint32_t>(body));
  std::memcpy(m.data(), &len, 4);
  return m;
}

// Feeds `bytes` as one read (or several, if the buffer offers less room), taking every complete
// message out after each; returns how many came out.
size_t Feed(StreamReassembler& r, const std::string& bytes) {
  size_t at = 0, got = 0;
  while (at < bytes.size()) {
    auto room = r.Writable();
    const size_t n = std::min(room.size(), bytes.size() - at);
    std::memcpy(room.data(), bytes.data() + at, n);
    r.Commit(n);
    at += n;
    std::span<const std::byte> m;
    while (r.Next(&m) == StreamReassembler::Result::kMessage) ++got;
    r.Settle(1 << 20);
  }
  return got;
}

}  // namespace

TEST_CASE("a length prefix alone allocates nothing; the buffer grows with what arrives",
          "[reassembler]") {
  StreamReassembler r(kInitial, kMaxMessage);
  const uint32_t len = htole32(64u << 20);
  CHECK(Feed(r, std::string(reinterpret_cast<const char*>(&len), 4)) == 0);
  CHECK(r.capacity() == kInitial);  // it used to be 64 MiB, zeroed, at once
  CHECK(Feed(r, std::string(1 << 20, 'x')) == 0);
  CHECK(r.capacity() <= 2u << 20);  // about what arrived, not what was announced
  CHECK(Feed(r, std::string((64u << 20) - (1 << 20), 'x')) == 1);
  CHECK(r.capacity() <= 4 + (64u << 20));
  // And it shrinks back once only small messages come for a while.
  for (int i = 0; i < StreamReassembler::kQuietSettles; ++i) CHECK(Feed(r, Message(10)) == 1);
  CHECK(r.capacity() == kInitial);
}

TEST_CASE("back-to-back large messages reuse the grown buffer instead of regrowing it",
          "[reassembler]") {
  StreamReassembler r(kInitial, kMaxMessage);
  const std::string big = Message(1 << 20);
  CHECK(Feed(r, big) == 1);
  const size_t grown = r.reallocations();
  CHECK(grown > 0);
  CHECK(r.capacity() >= big.size());
  // In reads of 64 KiB, as a socket would deliver them, with a small message in between.
  for (int i = 0; i < 20; ++i) {
    for (size_t at = 0; at < big.size(); at += 65536)
      CHECK(Feed(r, big.substr(at, 65536)) == (at + 65536 >= big.size() ? 1u : 0u));
    CHECK(Feed(r, Message(100)) == 1);
  }
  CHECK(r.reallocations() == grown);  // it used to shrink and regrow (copying) for every one
  for (int i = 0; i < StreamReassembler::kQuietSettles; ++i) CHECK(Feed(r, Message(10)) == 1);
  CHECK(r.capacity() == kInitial);
}

TEST_CASE("reads that end inside a length prefix never grow the buffer", "[reassembler]") {
  StreamReassembler r(kInitial, kMaxMessage);
  const std::string m = Message(32 * 1024);
  size_t got = 0;
  // Each read: the rest of a message and the first 2 bytes of the next one's length prefix.
  got += Feed(r, m + m.substr(0, 2));
  for (int i = 0; i < 20000; ++i) got += Feed(r, m.substr(2) + m.substr(0, 2));
  CHECK(got == 20001);
  CHECK(r.capacity() == kInitial);  // it used to double to 1 GiB and on
}

TEST_CASE("any read pattern keeps the buffer within one message", "[reassembler]") {
  StreamReassembler r(kInitial, kMaxMessage);
  std::string stream;
  for (size_t body : {0u, 1u, 100u, 70000u, 5u, 300000u, 64u}) stream += Message(body);
  size_t cut = 1, at = 0, got = 0;
  while (at < stream.size()) {
    const size_t n = std::min(cut, stream.size() - at);
    got += Feed(r, stream.substr(at, n));
    at += n;
    cut = cut * 7 % 65537 + 1;
    CHECK(r.capacity() <= std::max<size_t>(kInitial, 4 + 300000));
  }
  CHECK(got == 7);
}

// What the transport tells the server a peer's large messages hold (held, unfinished_large),
// which a server bounds across connections: known before the buffer grows for them, so that a
// server can decline the growth; nothing for small messages; a grown buffer kept for the next
// large message counts until it is given back (Shrink).
TEST_CASE("what a large message holds is known before the buffer grows for it, and after",
          "[reassembler]") {
  StreamReassembler r(kInitial, kMaxMessage);
  const std::string big = Message(1 << 20);
  // The first read fills the initial buffer with the message's start.
  CHECK(Feed(r, big.substr(0, kInitial)) == 0);
  CHECK(r.capacity() == kInitial);
  CHECK(r.full());
  CHECK(r.unfinished_large());
  CHECK(r.held() == 2 * kInitial);  // what the next read's room grows it to
  r.Writable();
  CHECK(r.capacity() == 2 * kInitial);
  CHECK(r.held() == 2 * kInitial);
  // Grown as it arrives, never past the message (plus its prefix).
  CHECK(Feed(r, big.substr(kInitial, (1 << 20) - kInitial)) == 0);
  CHECK(r.held() >= r.capacity());  // (more when it is full: the next growth)
  CHECK(r.held() <= big.size());
  CHECK(Feed(r, big.substr(1 << 20)) == 1);
  // Arrived: the grown buffer is kept for the next one, and counts.
  CHECK_FALSE(r.unfinished_large());
  CHECK(r.capacity() > kInitial);
  CHECK(r.held() == r.capacity());
  // A small message in pieces is no large message arriving.
  const std::string small = Message(1000);
  CHECK(Feed(r, small.substr(0, 500)) == 0);
  CHECK_FALSE(r.unfinished_large());
  // Given back, keeping the bytes it holds.
  CHECK(r.Shrink());
  CHECK(r.capacity() == kInitial);
  CHECK(r.held() == 0);
  CHECK(Feed(r, small.substr(500)) == 1);
  CHECK_FALSE(r.Shrink());  // nothing to give back
  // A fresh buffer: a small message holds nothing beyond it.
  StreamReassembler fresh(kInitial, kMaxMessage);
  CHECK(Feed(fresh, small.substr(0, 500)) == 0);
  CHECK(fresh.held() == 0);
}

// The ring protocol's bookkeeping (credits, skips at the end, bounds checks), without a NIC.
// The same rules run on the real verbs path in the Soft-RoCE VM suite.
#include <catch2/catch.hpp>
#include <deque>
#include <random>

#include "test/expected_text.h"
#include "transport/rdma/ring.h"
#include "transport/rdma/start_gate.h"

using namespace rdmarpc::transport::rdma;
using rdmarpc::testing::ErrorOf;

TEST_CASE("a sender never gets more than the ring's size without credits", "[ring]") {
  SendRing s(4096);
  int records = 0;
  while (s.Reserve(100)) ++records;  // 100 B -> 128 B records
  CHECK(records == 4096 / 128);
  CHECK_FALSE(s.Reserve(1).has_value());
  REQUIRE(s.OnCredit(128));
  CHECK(s.Reserve(100).has_value());
  CHECK_FALSE(s.OnCredit(1 << 20));  // more credit than ever written is a violation
}

TEST_CASE("sender and receiver agree on offsets through many wrap-arounds", "[ring]") {
  const uint32_t kRing = 64 * 1024;
  SendRing s(kRing);
  ReceiveRing r(kRing);
  std::mt19937 rng(42);
  std::uniform_int_distribution<uint32_t> size(1, s.max_record_bytes());
  std::deque<std::pair<uint32_t, uint32_t>> in_flight;
  uint64_t total = 0;
  int wraps = 0;
  uint32_t last = 0;
  for (int i = 0; i < 20000; ++i) {
    uint32_t n = size(rng);
    auto at = s.Reserve(n);
    while (!at) {
      // Deliver everything in flight, then return the credits.
      REQUIRE_FALSE(in_flight.empty());
      while (!in_flight.empty()) {
        auto [o, len] = in_flight.front();
        in_flight.pop_front();
        REQUIRE(r.Accept(o, len).ok());
      }
      REQUIRE(s.OnCredit(r.TakeCredits(0)));
      at = s.Reserve(n);
    }
    if (*at < last) ++wraps;
    last = *at;
    REQUIRE(*at % kRecordAlignBytes == 0);
    REQUIRE(*at + n <= kRing);
    in_flight.emplace_back(*at, n);
    total += n;
  }
  CHECK(wraps > 100);
  CHECK(total > 100u * kRing);
}

TEST_CASE("the receiver rejects records outside the ring or out of order", "[ring]") {
  ReceiveRing r(4096);
  CHECK_THAT(ErrorOf(r.Accept(4096, 1)), Catch::Contains("outside"));
  CHECK_THAT(ErrorOf(r.Accept(4000, 200)), Catch::Contains("outside"));
  CHECK_THAT(ErrorOf(r.Accept(128, 10)), Catch::Contains("expected 0"));
  CHECK_THAT(ErrorOf(r.Accept(0, 0)), Catch::Contains("empty"));
  REQUIRE(r.Accept(0, 10).ok());
  CHECK(r.head() == 64);
  CHECK_THAT(ErrorOf(r.Accept(192, 10)), Catch::Contains("expected 64"));
  CHECK(r.TakeCredits(0) == 64);
  // A skip back to 0 frees the tail that was skipped.
  REQUIRE(r.Accept(0, 64).ok());
  CHECK(r.TakeCredits(0) == (4096 - 64) + 64);
}

TEST_CASE("a connection starts without credit until the receiver grants its whole ring", "[ring]") {
  SendRing s(4096, /*granted=*/false);
  CHECK_FALSE(s.Reserve(64).has_value());
  SendRing partial(4096, false);
  CHECK_FALSE(partial.OnCredit(1024));  // a first credit must be the whole ring
  REQUIRE(s.OnCredit(4096));
  CHECK(s.Reserve(64).has_value());
  CHECK(s.used() == 64);
  CHECK_FALSE(s.OnCredit(128));  // then only what was written may come back
}

TEST_CASE("a sender that writes past its credits is caught", "[ring]") {
  // While the receiver withholds credit (a paused connection), the sender may fill the ring
  // exactly once; one more record is a protocol violation, not an overwrite.
  ReceiveRing r(4096);
  for (int i = 0; i < 4096 / 64; ++i) REQUIRE(r.Accept((i * 64) % 4096, 64).ok());
  CHECK_THAT(ErrorOf(r.Accept(0, 64)), Catch::Contains("past its credits"));
  // Once the credit is returned, the same record is fine.
  ReceiveRing r2(4096);
  for (int i = 0; i < 4096 / 64; ++i) REQUIRE(r2.Accept((i * 64) % 4096, 64).ok());
  CHECK(r2.TakeCredits(0) == 4096);
  CHECK(r2.Accept(0, 64).ok());
}

TEST_CASE("credits are returned only past the threshold", "[ring]") {
  ReceiveRing r(4096);
  REQUIRE(r.Accept(0, 64).ok());
  CHECK(r.TakeCredits(1024) == 0);
  CHECK(r.unreported() == 64);
  for (int i = 1; i < 16; ++i) REQUIRE(r.Accept(i * 64, 64).ok());
  CHECK(r.TakeCredits(1024) == 1024);
  CHECK(r.unreported() == 0);
}

TEST_CASE("completions polled around a connection's start are processed in ring order",
          "[ring][start]") {
  // The connection's sequence (issue 11, item 11): records 1 and 2 complete before Start; Start
  // posts their replay; records 3 and 4 are polled before the replay runs (busy-poll, or a
  // server that sends SETTINGS and GOAWAY back to back); then 5 after it.
  StartGate<int> gate;
  std::vector<int> processed;
  auto arrive = [&](int record) {
    if (gate.Pass(record)) processed.push_back(record);
  };
  arrive(1);
  arrive(2);
  CHECK(processed.empty());
  REQUIRE(gate.Start());  // a replay is due
  arrive(3);              // polled before the replay ran: must wait behind 1 and 2
  arrive(4);
  CHECK(processed.empty());
  for (int r : gate.TakeHeld()) processed.push_back(r);  // the posted replay
  arrive(5);
  CHECK(processed == std::vector<int>{1, 2, 3, 4, 5});
  CHECK(gate.held() == 0);
}

TEST_CASE("a connection started with nothing held processes completions at once", "[ring][start]") {
  StartGate<int> gate;
  CHECK_FALSE(gate.Start());
  CHECK(gate.Pass(1));
  CHECK(gate.held() == 0);
}

TEST_CASE("AcceptAtHead takes exactly the records at the head that Accept takes, nothing else",
          "[ring]") {
  // The connection tries the inline AcceptAtHead first and falls back to Accept: together they
  // must decide every record as Accept alone does, and leave the ring in the same state.
  const uint32_t kRing = 4096;
  ReceiveRing fast(kRing), plain(kRing);
  std::mt19937 rng(7);
  int took_fast = 0, fell_back_ok = 0, refused = 0;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t head = plain.head();
    uint64_t offset = head, bytes = 1 + rng() % 1100;
    switch (rng() % 8) {
      case 0:
        offset = 0;
        break;  // a skip back to 0 (or the head)
      case 1:
        offset = (head + 64 * (1 + rng() % 8)) % kRing;
        break;  // out of order
      case 2:
        bytes = 0;
        break;  // empty
      case 3:
        bytes = kRing - head + 1 + rng() % 64;
        break;  // past the ring's end
      case 4:
        offset = kRing + rng() % 128;
        break;  // outside
      default:
        break;  // at the head
    }
    const bool taken_fast = fast.AcceptAtHead(offset, bytes);
    const bool ok_fast = taken_fast || fast.Accept(offset, bytes).ok();
    const bool ok_plain = plain.Accept(offset, bytes).ok();
    REQUIRE(ok_fast == ok_plain);
    if (taken_fast) REQUIRE(offset == head);
    REQUIRE(fast.head() == plain.head());
    REQUIRE(fast.unreported() == plain.unreported());
    took_fast += taken_fast;
    fell_back_ok += ok_fast && !taken_fast;
    refused += !ok_fast;
    // Return credit now and then, as the connection does, so that records keep fitting (and
    // sometimes let the ring fill, so that "past its credits" is met too).
    if (rng() % 4 == 0) REQUIRE(fast.TakeCredits(0) == plain.TakeCredits(0));
  }
  // Every kind of outcome was met.
  CHECK(took_fast > 10000);
  CHECK(fell_back_ok > 100);
  CHECK(refused > 10000);
}

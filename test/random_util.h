// Randomness for the randomized hostile tests (hostile_random_test: clients that send what no
// client should; hostile_server_test's random case: a server that answers what no server should).
// Each run prints its seed; RDMARPC_TEST_SEED=N replays one run's choices.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "rpc/internal/frame.h"
#include "rpc/metadata.h"
#include "rpc/method_id.h"
#include "rpc/rdmarpc.h"
#include "test/protos/test_service.pb.h"
#include "test/test_util.h"

namespace rdmarpc::testing {

using Rng = std::mt19937_64;

// RDMARPC_TEST_SEED when set, else a fresh one; printed (with `what`, the test and transport)
// before the run, so that a run that crashes can be replayed too.
inline uint64_t TestSeed(const std::string& what) {
  const char* given = std::getenv("RDMARPC_TEST_SEED");
  const uint64_t seed = given ? std::strtoull(given, nullptr, 10) : std::random_device{}();
  std::printf("%s: RDMARPC_TEST_SEED=%llu\n", what.c_str(), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  return seed;
}

inline size_t Below(Rng& rng, size_t n) {
  return std::uniform_int_distribution<size_t>(0, n - 1)(rng);
}
inline bool Chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// Up to `max` random bytes.
inline std::string RandomBytes(Rng& rng, size_t max) {
  std::string s(Below(rng, max + 1), '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A frame's metadata: usually none, sometimes a "mode" entry (what the test service reads to
// stall or stop a stream) or an entry of random text, sometimes bytes that are not metadata.
inline std::string RandomMetadata(Rng& rng) {
  const size_t pick = Below(rng, 10);
  if (pick < 5) return {};
  Metadata md;
  if (pick < 7) {
    md.emplace_back("mode",
                    Chance(rng, 0.5) ? "stall" : "stop-after:" + std::to_string(Below(rng, 5)));
  } else if (pick < 9) {
    md.emplace_back(RandomBytes(rng, 20), RandomBytes(rng, 40));
  } else {
    return RandomBytes(rng, 40);
  }
  std::string raw(MetadataEncodedSize(md), '\0');
  EncodeMetadata(md, reinterpret_cast<std::byte*>(raw.data()));
  return raw;
}

// Whether a server may send a frame of this type (what the random hostile-client tests check
// of every frame that comes back; any status code may come, a handler chooses it).
inline bool ServerMaySend(FrameType type) {
  switch (type) {
    case FrameType::kResponse:
    case FrameType::kStreamMessage:
    case FrameType::kWindow:
    case FrameType::kPing:
    case FrameType::kPong:
    case FrameType::kGoAway:
    case FrameType::kSettings:
      return true;
    default:
      return false;
  }
}

// Whether `ch` still gets an Echo answered within `timeout` (the well-behaved client beside
// the attackers); says why not on stdout.
inline bool StillServed(const std::shared_ptr<Channel>& ch, std::chrono::milliseconds timeout) {
  EchoRequest req;
  req.set_payload("still here");
  auto r = TestService::BlockingStub(ch).Echo(req, {.timeout = timeout});
  if (!r.ok()) std::printf("the well-behaved client's call: %s\n", r.status().ToString().c_str());
  return r.ok() && r->payload() == "still here";
}

// The test service's methods (and one no server hosts) as a hostile client sees them.
struct RandomMethod {
  uint32_t id;
  uint8_t kind_flags;                        // what the method is (a request may claim otherwise)
  std::function<std::string(Rng&)> request;  // a request message that parses
};

inline std::vector<RandomMethod> RandomMethods() {
  auto echo = [](Rng& rng) {
    EchoRequest m;
    m.set_seq(Below(rng, 4));
    m.set_payload(std::string(Below(rng, 300), 'e'));
    return m.SerializeAsString();
  };
  return {
      {MethodId("/rdmarpc.testing.TestService/Echo"), 0, echo},
      {MethodId("/rdmarpc.testing.TestService/Fail"), 0,
       [](Rng& rng) {
         FailRequest m;
         m.set_code(static_cast<uint32_t>(Below(rng, 20)));  // past the last code too
         m.set_message(std::string(Below(rng, 100), 'f'));
         return m.SerializeAsString();
       }},
      {MethodId("/rdmarpc.testing.TestService/Throw"), 0, [](Rng&) { return std::string(); }},
      {MethodId("/rdmarpc.testing.TestService/Sleep"), 0,
       [](Rng& rng) {
         SleepRequest m;
         m.set_ms(static_cast<uint32_t>(Below(rng, 30)));
         m.set_ignore_cancel(Chance(rng, 0.3));
         return m.SerializeAsString();
       }},
      {MethodId("/rdmarpc.testing.TestService/Count"), kRequestFlagServerStream,
       [](Rng& rng) {
         CountRequest m;
         m.set_count(Chance(rng, 0.1) ? 1'000'000 : Below(rng, 50));
         m.set_payload_bytes(static_cast<uint32_t>(Chance(rng, 0.2) ? 20'000 : Below(rng, 100)));
         m.set_fail_code(Chance(rng, 0.2) ? static_cast<uint32_t>(Below(rng, 17)) : 0);
         m.set_block_after(Chance(rng, 0.3));
         return m.SerializeAsString();
       }},
      {MethodId("/rdmarpc.testing.TestService/Upload"), kRequestFlagClientStream,
       [](Rng&) { return std::string(); }},
      {MethodId("/rdmarpc.testing.TestService/Chat"),
       kRequestFlagClientStream | kRequestFlagServerStream, [](Rng&) { return std::string(); }},
      {MethodId("/rdmarpc.testing.Unserved/Nothing"), 0, [](Rng&) { return std::string(); }},
  };
}

// A frame a hostile client might send (header, metadata, payload; no transport framing). Call
// ids come mostly from {1, 2, 3}, so that frames meet calls that exist, have ended, or are of
// another kind.
inline std::string RandomClientFrame(Rng& rng, const std::vector<RandomMethod>& methods) {
  FrameHeader h;
  h.call_id = Chance(rng, 0.9) ? 1 + Below(rng, 3) : rng();
  std::string metadata, payload;
  const size_t pick = Below(rng, 100);
  if (pick < 35) {
    h.type = FrameType::kRequest;
    const RandomMethod& m = methods[Below(rng, methods.size())];
    h.method_id = Chance(rng, 0.95) ? m.id : static_cast<uint32_t>(rng());
    h.flags = Chance(rng, 0.8) ? m.kind_flags : static_cast<uint8_t>(rng());
    if (Chance(rng, 0.3)) h.timeout_us = Chance(rng, 0.5) ? Below(rng, 100'000) : rng();
    metadata = RandomMetadata(rng);
    payload = Chance(rng, 0.85) ? m.request(rng) : RandomBytes(rng, 64);
  } else if (pick < 65) {
    h.type = FrameType::kStreamMessage;
    const size_t what = Below(rng, 10);
    if (what < 2) {
      h.flags = kStreamFlagEnd;  // the half-close
    } else {
      if (what == 2) h.flags = static_cast<uint8_t>(rng());
      EchoRequest m;
      m.set_seq(Below(rng, 5));
      m.set_payload(Chance(rng, 0.1) ? std::string(60'000, 's')
                                     : Pattern(Below(rng, 200), m.seq()));
      payload = Chance(rng, 0.9) ? m.SerializeAsString() : RandomBytes(rng, 32);
    }
  } else if (pick < 75) {
    h.type = FrameType::kWindow;
    std::string w(kWindowBytes, '\0');
    const uint64_t credit = Chance(rng, 0.5) ? Below(rng, 1 << 20) : rng();
    EncodeWindow(credit, reinterpret_cast<std::byte*>(w.data()));
    payload = Chance(rng, 0.9) ? w : RandomBytes(rng, 16);
  } else if (pick < 83) {
    h.type = FrameType::kCancel;
  } else if (pick < 88) {
    h.type = FrameType::kPing;
    payload = RandomBytes(rng, 16);
  } else {
    // What only a server sends, and (rarely: the connection ends there) types nobody defined.
    const FrameType others[] = {FrameType::kResponse, FrameType::kPong, FrameType::kGoAway,
                                FrameType::kSettings};
    h.type = Chance(rng, 0.95)
                 ? others[Below(rng, 4)]
                 : static_cast<FrameType>(Chance(rng, 0.5) ? 0 : 10 + Below(rng, 246));
    h.status = static_cast<uint32_t>(Below(rng, 20));
    payload = RandomBytes(rng, 32);
  }
  h.metadata_bytes = static_cast<uint32_t>(metadata.size());
  if (Chance(rng, 0.005)) h.metadata_bytes = static_cast<uint32_t>(rng());  // past the frame
  std::string f(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(h, reinterpret_cast<std::byte*>(f.data()));
  return f + metadata + payload;
}

}  // namespace rdmarpc::testing

// Random frame sequences from hostile peers against an in-process server (TCP): the targeted
// attacks of hostile_tcp_test and hostile_test, mixed. Each connection sends a few dozen frames
// drawn from the protocol's own vocabulary -- requests of every method kind (matching flags or
// not), stream messages and half-closes, WINDOWs, CANCELs, PINGs, frames only a server may send,
// unknown types, bad metadata, payloads that parse and payloads that do not, call ids that
// collide -- then reads for a while or not at all, and hangs up in one of several ways.
//
// What must hold whatever they send: every frame the server sends back decodes and is one a
// server may send; a well-behaved client is served all along; and once the attackers are gone no
// call is left running. Run under AddressSanitizer too (bazel test --config=asan), where a
// memory error anywhere on those paths fails it.
//
// The seed is printed; RDMARPC_TEST_SEED=N replays one run's sequences (the server's timing is
// not replayed, so a failure may take a few runs to show again).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "rpc/internal/frame.h"
#include "rpc/method_id.h"
#include "rpc/rdmarpc.h"
#include "test/random_util.h"
#include "test/raw_tcp.h"
#include "test/test_util.h"
#include "transport/handshake.h"

using namespace rdmarpc;
using namespace rdmarpc::testing;
using namespace std::chrono_literals;

namespace {

struct Method {
  uint32_t id;
  uint8_t kind_flags;                        // what the method is (a request may claim otherwise)
  std::function<std::string(Rng&)> request;  // a request message that parses
};

std::vector<Method> Methods() {
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

// One frame of the attack. Call ids come mostly from {1, 2, 3}, so that frames meet calls that
// exist, have ended, or are of another kind.
std::string RandomFrame(Rng& rng, const std::vector<Method>& methods) {
  FrameHeader h;
  h.call_id = Chance(rng, 0.9) ? 1 + Below(rng, 3) : rng();
  std::string metadata, payload;
  const size_t pick = Below(rng, 100);
  if (pick < 35) {
    h.type = FrameType::kRequest;
    const Method& m = methods[Below(rng, methods.size())];
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
  std::string f = FrameBytes(h, metadata + payload);
  if (Chance(rng, 0.005)) {
    // A length prefix shorter than a header.
    const uint32_t len = htole32(static_cast<uint32_t>(Below(rng, kFrameHeaderBytes)));
    std::memcpy(f.data(), &len, 4);
    f.resize(4 + le32toh(len));
  }
  return f;
}

// What came back on one connection.
struct Seen {
  size_t frames = 0;
  std::string bad;  // the first thing no server may send, if any
  FrameReader reader;
};

// Reads until the server closes or `within` passes (0: only what is waiting), checking each
// frame as it comes.
void ReadBack(int fd, std::chrono::milliseconds within, Seen& seen) {
  const auto until = std::chrono::steady_clock::now() + within;
  DecodedFrame f;
  for (;;) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   until - std::chrono::steady_clock::now()));
    switch (seen.reader.Next(fd, left, &f)) {
      case FrameReader::Got::kFrame:
        break;
      case FrameReader::Got::kBad:
        seen.bad = seen.reader.error();
        return;
      default:  // nothing more within `within`, or closed
        return;
    }
    // (Any status code may come: a handler chooses it, here the test service's Fail.)
    switch (f.header.type) {
      case FrameType::kResponse:
      case FrameType::kStreamMessage:
      case FrameType::kWindow:
      case FrameType::kPing:
      case FrameType::kPong:
      case FrameType::kGoAway:
      case FrameType::kSettings:
        ++seen.frames;
        break;
      default:
        seen.bad = "frame type " + std::to_string(static_cast<int>(f.header.type));
        return;
    }
  }
}

bool Served(const std::shared_ptr<Channel>& ch) {
  EchoRequest req;
  req.set_payload("still here");
  auto r = TestService::BlockingStub(ch).Echo(req, {.timeout = 5s});
  return r.ok() && r->payload() == "still here";
}

}  // namespace

TEST_CASE(
    "random frame sequences from hostile clients: the server answers in protocol, serves "
    "others and leaves no call behind",
    "[hostile][tcp][random]") {
  const uint64_t seed = TestSeed();
  std::printf("hostile_random_test: RDMARPC_TEST_SEED=%llu\n",
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  INFO("RDMARPC_TEST_SEED=" << seed);
  Rng rng(seed);
  TestServer ts("tcp://127.0.0.1:0");
  const uint16_t port = static_cast<uint16_t>(std::stoi(ts.uri.substr(ts.uri.rfind(':') + 1)));
  auto good = Channel::ConnectBlocking(ts.uri);
  REQUIRE(good.ok());
  const auto methods = Methods();
  constexpr int kConnections = 300;
  size_t frames_sent = 0, frames_back = 0;
  for (int c = 0; c < kConnections; ++c) {
    INFO("connection " << c);
    int fd = RawClient(port);
    std::string bytes;
    const size_t frames = 1 + Below(rng, 40);
    for (size_t i = 0; i < frames; ++i) bytes += RandomFrame(rng, methods);
    frames_sent += frames;
    Seen seen;
    if (Chance(rng, 0.3)) {
      // In pieces, reading in between: the server answers while later frames arrive.
      for (size_t at = 0; at < bytes.size();) {
        const size_t n = std::min(bytes.size() - at, 1 + Below(rng, 2000));
        (void)SendAll(fd, std::string_view(bytes).substr(at, n), 500ms);
        at += n;
        ReadBack(fd, 0ms, seen);
      }
    } else {
      (void)SendAll(fd, bytes, 1000ms);  // a server that stopped reading us may not take it all
    }
    switch (Below(rng, 4)) {
      case 0:  // hang up at once, without reading
        break;
      case 1:  // read a while, then hang up
        ReadBack(fd, std::chrono::milliseconds(Below(rng, 100)), seen);
        break;
      case 2:  // half-close, then read until the server closes (or 300 ms)
        shutdown(fd, SHUT_WR);
        ReadBack(fd, 300ms, seen);
        break;
      default: {  // reset
        linger l{1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        break;
      }
    }
    close(fd);
    frames_back += seen.frames;
    if (!seen.bad.empty()) FAIL_CHECK("the server sent " << seen.bad);
    if (c % 25 == 24) REQUIRE(Served(*good));
  }
  std::printf("hostile_random_test: %d connections sent %zu frames, read back %zu\n", kConnections,
              frames_sent, frames_back);
  CHECK(Served(*good));
  // Every attacker's calls end with its connection (handlers that wait see the cancel).
  CHECK(Eventually([&] { return ts.server.in_flight_calls() == 0; }, 15000ms));
  CHECK(Eventually([&] { return ts.server.connections() == 1; }, 15000ms));  // the good one
  CHECK(Served(*good));
}

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

// One frame of the attack, with the TCP transport's length prefix; rarely a prefix shorter
// than a header, which only a byte stream can carry.
std::string RandomFrame(Rng& rng, const std::vector<RandomMethod>& methods) {
  const std::string body = RandomClientFrame(rng, methods);
  if (Chance(rng, 0.005)) return LengthPrefixed(body.substr(0, Below(rng, kFrameHeaderBytes)));
  return LengthPrefixed(body);
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
    if (!ServerMaySend(f.header.type)) {
      seen.bad = "frame type " + std::to_string(static_cast<int>(f.header.type));
      return;
    }
    ++seen.frames;
  }
}

bool Served(const std::shared_ptr<Channel>& ch) { return StillServed(ch, 5s); }

}  // namespace

TEST_CASE(
    "random frame sequences from hostile clients: the server answers in protocol, serves "
    "others and leaves no call behind",
    "[hostile][tcp][random]") {
  const uint64_t seed = TestSeed("hostile_random_test");
  INFO("RDMARPC_TEST_SEED=" << seed);
  Rng rng(seed);
  TestServer ts("tcp://127.0.0.1:0");
  const uint16_t port = static_cast<uint16_t>(std::stoi(ts.uri.substr(ts.uri.rfind(':') + 1)));
  auto good = Channel::ConnectBlocking(ts.uri);
  REQUIRE(good.ok());
  const auto methods = RandomMethods();
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

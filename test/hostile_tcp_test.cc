// Raw-socket attacks on a real echo_server process, measuring its resident memory (issue 11,
// items 1-4): clients that send and never read (PINGs, unknown methods, 1 MiB requests), length
// prefixes announcing 64 MiB that never arrive, frames whose reads end inside the next length
// prefix, a trickle of one byte, and a flood of idle connections past the descriptor limit. The
// server must stay under 64 MiB plus its configured per-connection budget, keep serving a
// well-behaved client throughout, and refuse rather than stall. Each case prints a line
// "RSS <attack>: start S MiB, peak P MiB" (the figures in docs/RELIABILITY.md).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>

#include "proto/echo.rdmarpc.pb.h"
#include "rpc/internal/frame.h"
#include "rpc/rdmarpc.h"
#include "test/process_util.h"
#include "test/raw_tcp.h"
#include "test/test_util.h"
#include "transport/handshake.h"
#include "transport/log_limit.h"
#include "transport/stats.h"

using namespace rdmarpc;
using namespace rdmarpc::testing;
using namespace std::chrono_literals;

namespace {

// The target: 64 MiB plus the configured limits, here ServerOptions::
// max_buffered_bytes_per_connection (16 MiB) for each of the (up to two) attacking connections.
// Under a sanitizer (see kRssMeaningful) the attacks run and the server must survive them and
// keep serving, but the figure is only printed.
constexpr double kAllowedMiB = kRssMeaningful ? 64 + 2 * 16 : 1e9;

// Samples a process's resident memory every 20 ms while it lives.
class RssWatch {
 public:
  explicit RssWatch(pid_t pid) : pid_(pid), start_(RssMiB(pid)) {
    thread_ = std::thread([this] {
      while (!stop_) {
        const double now = RssMiB(pid_);
        double seen = peak_.load();
        while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(20ms);
      }
    });
  }
  ~RssWatch() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  double start() const { return start_; }
  double peak() const { return peak_.load(); }
  void Report(const std::string& attack) {
    Stop();
    std::printf("RSS %s: start %.1f MiB, peak %.1f MiB\n", attack.c_str(), start_, peak());
    std::fflush(stdout);
  }

 private:
  pid_t pid_;
  double start_;
  std::atomic<double> peak_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The code of the handshake ANSWER on `fd` (a RawClient's), read within 2 s; nullopt if none
// came whole.
std::optional<transport::Refusal> AnswerCode(int fd) {
  uint8_t answer[transport::kAnswerBytes];
  size_t got = 0;
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (got < sizeof answer && std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) != 1) continue;
    const ssize_t n = read(fd, answer + got, sizeof answer - got);
    if (n <= 0) break;
    got += size_t(n);
  }
  auto decoded = transport::DecodeAnswer(answer, got);
  if (!decoded.ok()) return std::nullopt;
  return decoded.value().code;
}

// The descriptors process `pid` has open.
int Descriptors(pid_t pid) {
  int n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    ++n;
  }
  return n;
}

std::string Ping(uint64_t id, size_t payload = 0) {
  FrameHeader h;
  h.type = FrameType::kPing;
  h.call_id = id;
  return FrameBytes(h, std::string(payload, 'p'));
}

std::string SayRequest(uint64_t id, uint32_t method, size_t payload) {
  FrameHeader h;
  h.type = FrameType::kRequest;
  h.method_id = method;
  h.call_id = id;
  demo::SayRequest req;
  req.set_payload(std::string(payload, 'e'));
  return FrameBytes(h, req.SerializeAsString());
}

// A frame being written and how much of it the kernel has taken, kept between Flood calls on
// one connection so that a flood in turns never leaves a frame half-written.
struct FloodState {
  std::string frame;
  size_t at = 0;
};

// Writes `unit()` over and over for `duration` without ever reading; returns the bytes the
// kernel took (it stops taking them when the server stops reading). With `state`, a frame left
// part-written is finished by the next call first.
template <class Unit>
size_t Flood(int fd, std::chrono::milliseconds duration, Unit unit, FloodState& state) {
  const auto until = std::chrono::steady_clock::now() + duration;
  size_t sent = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (state.at == state.frame.size()) {
      state.frame = unit();
      state.at = 0;
    }
    ssize_t n =
        send(fd, state.frame.data() + state.at, state.frame.size() - state.at, MSG_NOSIGNAL);
    if (n > 0) {
      state.at += n;
      sent += n;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 50);
    } else {
      break;  // the server closed us
    }
  }
  return sent;
}
template <class Unit>
size_t Flood(int fd, std::chrono::milliseconds duration, Unit unit) {
  FloodState state;
  return Flood(fd, duration, unit, state);
}

uint16_t PortOf(const std::string& uri) {
  return static_cast<uint16_t>(std::stoi(uri.substr(uri.rfind(':') + 1)));
}

// A call from a well-behaved client while the attack goes on.
bool Served(const std::string& uri) {
  ChannelOptions co;
  co.transport.connect_timeout_ms = 5000;
  auto ch = Channel::ConnectBlocking(uri, co);
  if (!ch.ok()) return false;
  demo::Echo::BlockingStub stub(*ch);
  demo::SayRequest req;
  req.set_message("still here");
  auto r = stub.Say(req, {.timeout = 5s});
  return r.ok() && r->message() == "still here";
}

bool ClosedByServer(int fd, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  char buf[65536];
  while (std::chrono::steady_clock::now() < until) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    if (n < 0) {
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, 50);
    }
  }
  return false;
}

const std::string kServer = "examples/echo/echo_server";

// A REQUEST opening a client or bidirectional stream (no message; `md` as metadata).
std::string OpenStream(uint64_t id, uint32_t method, uint8_t kind_flags, const Metadata& md = {}) {
  FrameHeader h;
  h.type = FrameType::kRequest;
  h.flags = kind_flags;
  h.method_id = method;
  h.call_id = id;
  h.metadata_bytes = static_cast<uint32_t>(MetadataEncodedSize(md));
  std::string raw(h.metadata_bytes, '\0');
  EncodeMetadata(md, reinterpret_cast<std::byte*>(raw.data()));
  return FrameBytes(h, raw);
}

std::string StreamMessage(uint64_t id, const std::string& payload, uint8_t flags = 0) {
  FrameHeader h;
  h.type = FrameType::kStreamMessage;
  h.flags = flags;
  h.call_id = id;
  return FrameBytes(h, payload);
}

// Reads what the server sends until it closes the connection, `within` passes, or `enough`
// returns true for a frame (called for each).
void ReadFrames(int fd, std::chrono::milliseconds within,
                const std::function<bool(const DecodedFrame&)>& enough) {
  FrameReader reader;
  const auto until = std::chrono::steady_clock::now() + within;
  DecodedFrame f;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0 || reader.Next(fd, left, &f) != FrameReader::Got::kFrame) return;
    if (enough(f)) return;
  }
}

std::string PayloadOf(const DecodedFrame& f) {
  return std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size());
}

// Reads what the server sends until it closes the connection (or `within` passes) and returns
// the message of the GOAWAY among it ("" if none came).
std::string GoAwayBeforeClose(int fd, std::chrono::milliseconds within) {
  std::string goaway;
  ReadFrames(fd, within, [&](const DecodedFrame& f) {
    if (f.header.type == FrameType::kGoAway) goaway = PayloadOf(f);
    return false;
  });
  return goaway;
}

// The memory attacks' common course: `clients` raw connections to the server at `uri` (process
// `pid`) each write unit(1), unit(2), ... for 3 s and read nothing, while a well-behaved client
// is served in the middle of it. Prints the figures under `name`; returns the server's peak
// resident memory in MiB.
double FloodNeverReading(pid_t pid, const std::string& uri, int clients, const std::string& name,
                         const std::function<std::string(uint64_t)>& unit) {
  RssWatch rss(pid);
  std::vector<int> fds;
  std::vector<std::thread> flooders;
  std::atomic<size_t> sent{0};
  for (int c = 0; c < clients; ++c) {
    fds.push_back(RawClient(PortOf(uri)));
    flooders.emplace_back([&, fd = fds.back()] {
      uint64_t i = 0;
      sent += Flood(fd, 3000ms, [&] { return unit(++i); });
    });
  }
  std::this_thread::sleep_for(1500ms);
  CHECK(Served(uri));  // in the middle of the attack
  for (auto& t : flooders) t.join();
  rss.Report(name);
  std::printf("  the attackers wrote %.1f MiB\n", sent.load() / 1048576.0);
  for (int fd : fds) close(fd);
  return rss.peak();
}

}  // namespace

TEST_CASE("clients that send and never read cannot grow the server past its budget",
          "[hostile][tcp][memory]") {
  const uint32_t say = MethodId("/demo.Echo/Say");
  struct Attack {
    std::string name;
    std::function<std::string(uint64_t)> unit;
  };
  const std::vector<Attack> attacks = {
      {"PINGs, replies never read", [](uint64_t i) { return Ping(i); }},
      {"unknown methods, errors never read",
       [](uint64_t i) { return SayRequest(i, 0xdeadbeef, 16); }},
      {"1 MiB echo requests, replies never read",
       [say](uint64_t i) { return SayRequest(i, say, 1 << 20); }},
  };
  for (const auto& a : attacks) {
    INFO(a.name);
    // A fresh server each time, so that each figure is this attack's alone.
    auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
    CHECK(FloodNeverReading(server->pid(), uri, 2, a.name, a.unit) < kAllowedMiB);
  }
}

// Each connection is bounded (the case above), but many of them used to add up: ten clients that
// never read their replies made the server hold about 10 x 16 MiB. The server-wide bound
// (ServerOptions::max_buffered_bytes) stops reading the connections over their share.
TEST_CASE("many clients that never read cannot add up past the server-wide budget",
          "[hostile][tcp][memory]") {
  const uint32_t say = MethodId("/demo.Echo/Say");
  constexpr int kClients = 10;
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0",
                                    "--max-buffered-bytes-total", std::to_string(32 << 20)});
  const double peak =
      FloodNeverReading(server->pid(), uri, kClients,
                        "10 clients, 1 MiB echo requests, replies never read, 32 MiB server-wide",
                        [say](uint64_t i) { return SayRequest(i, say, 1 << 20); });
  // 64 MiB plus the server-wide 32 MiB (each connection stops at its share, 3.2 MiB, plus the
  // message it was reading and the one it was answering), not 64 + 10 x 16.
  CHECK(peak < kAllowedMiB);
}

TEST_CASE("what connections hold is counted server-wide, and given back when they go",
          "[hostile][tcp][memory]") {
  TestServer ts("tcp://127.0.0.1:0");
  const uint32_t echo = MethodId("/rdmarpc.testing.TestService/Echo");
  REQUIRE(ts.server.buffered_bytes() == 0);
  const auto request = [echo](uint64_t id) {
    FrameHeader h;
    h.type = FrameType::kRequest;
    h.method_id = echo;
    h.call_id = id;
    EchoRequest req;
    req.set_payload(std::string(1 << 20, 'e'));
    return FrameBytes(h, req.SerializeAsString());
  };
  // Three clients send 1 MiB echo requests whose replies they never read: held until they read.
  // The kernel's socket buffers take the first several MiB of replies, so each client sends in
  // turns until the server holds more than 3 MiB (on a loaded machine, or under TSan, 300 ms
  // each was not always enough). A turn that ends mid-request finishes it in the next one.
  struct Client {
    int fd;
    uint64_t id = 0;
    FloodState flood;
  };
  std::vector<Client> clients;
  for (int c = 0; c < 3; ++c) clients.push_back({RawClient(PortOf(ts.uri))});
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (ts.server.buffered_bytes() <= 3 << 20 && std::chrono::steady_clock::now() < give_up) {
    for (Client& c : clients)
      Flood(
          c.fd, 200ms, [&] { return request(++c.id); }, c.flood);
  }
  // rdmarpc_server_buffered_bytes: at least a reply per client, at most each one's budget.
  CHECK(Eventually([&] { return ts.server.buffered_bytes() > 3 << 20; }, 5000ms));
  CHECK(ts.server.buffered_bytes() <= 3 * (int64_t{16} << 20) + (3 << 20));
  for (const Client& c : clients) close(c.fd);
  CHECK(Eventually([&] { return ts.server.buffered_bytes() == 0; }, 5000ms));
}

TEST_CASE("a client that never reads its replies holds a shutdown up for a bounded time",
          "[hostile][tcp][shutdown]") {
  // Shutdown lets each connection's queued replies leave before closing it, so that calls that
  // finished during the drain are not lost; a client that reads nothing must not turn that into
  // a server that never exits (the bound: 2 s, then the connection is closed anyway).
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
  const uint32_t say = MethodId("/demo.Echo/Say");
  int fd = RawClient(PortOf(uri));
  uint64_t i = 0;
  const size_t sent = Flood(fd, 1500ms, [&] { return SayRequest(++i, say, 256 << 10); });
  REQUIRE(sent > (4u << 20));  // replies piled up on the server's side
  const auto t0 = std::chrono::steady_clock::now();
  server->Signal(SIGTERM);
  while (server->running() && std::chrono::steady_clock::now() - t0 < 30s) {
    std::this_thread::sleep_for(20ms);
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("shutdown with a client that does not read: %.2f s\n", took);
  const bool exited = !server->running();
  if (!exited) server->Kill();
  CHECK(exited);
  CHECK(took < 10.0);  // the 2 s flush bound plus start-up slack on a loaded machine
  close(fd);
}

TEST_CASE("length prefixes that announce 64 MiB allocate nothing until the bytes arrive",
          "[hostile][tcp][memory]") {
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
  RssWatch rss(server->pid());
  std::vector<int> fds;
  for (int c = 0; c < 40; ++c) {
    fds.push_back(RawClient(PortOf(uri)));
    const uint32_t len = htole32(64u << 20);
    REQUIRE(send(fds.back(), &len, 4, MSG_NOSIGNAL) == 4);
    REQUIRE(send(fds.back(), "abcd", 4, MSG_NOSIGNAL) == 4);  // and a little of the body
  }
  std::this_thread::sleep_for(1000ms);
  CHECK(Served(uri));
  rss.Report("40 connections announcing 64 MiB each");
  CHECK(rss.peak() < kAllowedMiB);  // it used to be 40 x 64 MiB = 2.6 GB
  for (int fd : fds) close(fd);
}

// `clients` raw connections to `port` that each announce a message of `message` bytes and send
// as much of it as the server takes within `duration`, never its last byte, then nothing more;
// `each_round()` after every round of sends. Returns the connections and the bytes they sent.
std::pair<std::vector<int>, size_t> SendAllButTheLastByte(uint16_t port, int clients,
                                                          uint32_t message,
                                                          std::chrono::milliseconds duration,
                                                          const std::function<void()>& each_round) {
  std::vector<int> fds;
  std::vector<size_t> sent(clients, 0);  // of each message's body
  for (int c = 0; c < clients; ++c) {
    fds.push_back(RawClient(port));
    const uint32_t len = htole32(message);
    REQUIRE(SendAll(fds.back(), std::string_view(reinterpret_cast<const char*>(&len), 4)));
  }
  const std::string chunk(256 << 10, 'm');
  const auto until = std::chrono::steady_clock::now() + duration;
  while (std::chrono::steady_clock::now() < until) {
    bool any = false;
    for (int c = 0; c < clients; ++c) {
      const size_t n = std::min(chunk.size(), size_t{message} - 1 - sent[c]);
      const ssize_t w = n == 0 ? 0 : send(fds[c], chunk.data(), n, MSG_NOSIGNAL);
      if (w > 0) {
        sent[c] += size_t(w);
        any = true;
      }
    }
    each_round();
    if (!any) std::this_thread::sleep_for(2ms);
  }
  size_t total = 0;
  for (size_t n : sent) total += n;
  return {fds, total};
}

// Each connection's read buffer grows for a large message only as its bytes arrive, and never
// past one message (above); but a peer may send most of a message and stop, and many peers
// together then held that many unfinished messages (here 8 x 16 MiB) until the idle timeout,
// whatever max_buffered_bytes said. Now what they hold for unfinished messages is held to
// that bound as well: past it, a connection whose message needs more is not read, except one
// at a time (so that large calls that together exceed the bound still arrive).
TEST_CASE(
    "clients that send most of a large message and stop cannot add up past the "
    "server-wide budget",
    "[hostile][tcp][memory]") {
  constexpr size_t kBound = 8 << 20;
  constexpr uint32_t kMessage = 16 << 20;
  constexpr int kClients = 8;
  ServerOptions so{.io_threads = 2};
  so.max_buffered_bytes = kBound;
  TestServer ts("tcp://127.0.0.1:0", so);
  auto good = Channel::ConnectBlocking(ts.uri);
  REQUIRE(good.ok());
  int64_t peak = 0;
  RssWatch rss(getpid());  // the server is in this process
  const auto [fds, sent] = SendAllButTheLastByte(PortOf(ts.uri), kClients, kMessage, 4s, [&] {
    peak = std::max(peak, ts.server.receiving_bytes());
  });
  std::this_thread::sleep_for(200ms);
  peak = std::max(peak, ts.server.receiving_bytes());
  std::printf(
      "%d clients each sending most of a %u MiB message, %zu MiB server-wide: %zu MiB sent, "
      "the server counted at most %lld MiB for them\n",
      kClients, kMessage >> 20, kBound >> 20, sent >> 20, static_cast<long long>(peak >> 20));
  rss.Report("while they sent");
  // Counted: the bound, plus the one message let through whatever (its buffer: the message and
  // its length prefix). Resident: that (a buffer grows only once its growth is counted), plus
  // the old buffer while a growth copies it, plus what the allocator keeps (in this process,
  // after the cases before this one: 24-28 MiB alone, 44-51 after them). Without the bound:
  // 8 x 16 MiB.
  CHECK(peak <= int64_t(kBound + kMessage + 4096));
  if (kRssMeaningful) {
    CHECK(rss.peak() - rss.start() < double(80));
  }
  CHECK(ts.server.throttle_events() > 0);
  // Calls still go through meanwhile.
  EchoRequest req;
  req.set_payload("served");
  CHECK(TestService::BlockingStub(*good).Echo(req, {.timeout = 10s}).ok());
  for (int fd : fds) close(fd);
  CHECK(Eventually([&] { return ts.server.receiving_bytes() == 0; }, 10000ms));
  // And large calls once the room is back.
  req.set_payload(std::string(12 << 20, 'l'));
  CHECK(TestService::BlockingStub(*good).Echo(req, {.timeout = 20s}).ok());
}

// The same with messages that arrive whole: a connection keeps the buffer that grew for a large
// message, for the next one, and that kept buffer was counted nowhere: a peer that sent one
// large call, read its reply and went quiet held it until the idle timeout, and many such peers
// added up. Now a kept buffer counts as well, and is given back once the server is over its
// bound.
TEST_CASE(
    "clients that send one large call each and go quiet cannot keep their read buffers "
    "past the server-wide budget",
    "[hostile][tcp][memory]") {
  constexpr size_t kBound = 8 << 20;
  constexpr size_t kPayload = 12 << 20;
  constexpr int kClients = 8;
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0",
                                    "--max-buffered-bytes-total", std::to_string(kBound)});
  const uint32_t say = MethodId("/demo.Echo/Say");
  const double start = RssMiB(server->pid());
  std::vector<int> fds;
  for (int c = 0; c < kClients; ++c) {
    fds.push_back(RawClient(PortOf(uri)));
    REQUIRE(SendAll(fds.back(), SayRequest(1, say, kPayload), 20s));
    // Its reply, read and let go of (the server holds no reply for it).
    size_t got = 0;
    std::string buf(1 << 20, '\0');
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (got < kPayload && std::chrono::steady_clock::now() < until) {
      pollfd p{fds.back(), POLLIN, 0};
      poll(&p, 1, 100);
      const ssize_t n = recv(fds.back(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n > 0) got += size_t(n);
      if (n == 0) break;
    }
    REQUIRE(got >= kPayload);
  }
  std::this_thread::sleep_for(300ms);
  const double now = RssMiB(server->pid());
  std::printf(
      "%d clients, one %zu MiB call each, then quiet (%zu MiB server-wide): server RSS "
      "%.1f -> %.1f MiB\n",
      kClients, kPayload >> 20, kBound >> 20, start, now);
  CHECK(Served(uri));
  // Each kept buffer (16 MiB) goes back as soon as the server is over its bound: +40 MiB in one
  // run (what the allocator keeps of the calls' buffers once freed); without that, 8 x 16 MiB
  // kept: +124 MiB.
  if (kRssMeaningful) CHECK(now - start < 80);
  for (int fd : fds) close(fd);
}

// Held to the bound, such peers still held the receive token (the one message let through
// past it) and their part of the bound until the idle timeout, and every other large message
// waited for them. While others wait for room, a large message that stops arriving is given up
// and its connection closed (ServerOptions::stalled_message_timeout).
TEST_CASE(
    "clients whose large messages stop arriving while others wait for room are closed, so "
    "that other large calls go on",
    "[hostile][tcp][memory]") {
  constexpr size_t kBound = 8 << 20;
  constexpr uint32_t kMessage = 16 << 20;
  constexpr int kClients = 4;
  ServerOptions so{.io_threads = 2};
  so.max_buffered_bytes = kBound;
  so.stalled_message_timeout = 500ms;
  TestServer ts("tcp://127.0.0.1:0", so);
  auto good = Channel::ConnectBlocking(ts.uri);
  REQUIRE(good.ok());
  // As much of their messages as the server takes in 1.5 s, then nothing more.
  const auto [fds, sent] = SendAllButTheLastByte(PortOf(ts.uri), kClients, kMessage, 1500ms, [] {});
  // A large call from a well-behaved client: it needs room, or the token, and gets them once
  // stalled messages are given up (without that, only at the attackers' idle timeout, 5 min).
  EchoRequest req;
  req.set_payload(std::string(6 << 20, 'l'));
  const auto start = std::chrono::steady_clock::now();
  const auto r = TestService::BlockingStub(*good).Echo(req, {.timeout = 15s});
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%d clients each sending part of a %u MiB message, then nothing (%zu MiB server-wide, "
      "stalled_message_timeout %lld ms): a 6 MiB call took %.2f s; %lld connections closed as "
      "stalled\n",
      kClients, kMessage >> 20, kBound >> 20,
      static_cast<long long>(so.stalled_message_timeout.count()), took,
      static_cast<long long>(ts.server.stalled_messages()));
  INFO(r.status().ToString());
  CHECK(r.ok());
  CHECK(ts.server.stalled_messages() >= 1);
  // The stalled ones were told why.
  int told = 0;
  for (int fd : fds) {
    const std::string goaway = GoAwayBeforeClose(fd, 300ms);
    if (goaway.find("stopped arriving") != std::string::npos) ++told;
    close(fd);
  }
  CHECK(told == ts.server.stalled_messages());
  // What is left is the well-behaved client's read buffer, kept for its next large message.
  CHECK(Eventually([&] { return ts.server.receiving_bytes() <= int64_t(kBound); }, 10000ms));
}

// The other side of it: with no one waiting for room, a slow (or stalled) large message harms
// no one, and is left to arrive.
TEST_CASE("a large message that stops arriving while no one waits for room is left to arrive",
          "[hostile][tcp][memory]") {
  constexpr size_t kPayload = 8 << 20;
  auto [server, uri] = StartServer(
      {Runfile(kServer), "--listen", "tcp://127.0.0.1:0", "--stalled-message-timeout-ms", "200"});
  const uint32_t say = MethodId("/demo.Echo/Say");
  const int fd = RawClient(PortOf(uri));
  const std::string request = SayRequest(1, say, kPayload);
  const size_t half = request.size() / 2;
  REQUIRE(SendAll(fd, std::string_view(request).substr(0, half), 20s));
  // Five times the timeout without a byte; then the rest, and the reply comes on the same
  // connection.
  std::this_thread::sleep_for(1000ms);
  REQUIRE(SendAll(fd, std::string_view(request).substr(half), 20s));
  bool replied = false;
  ReadFrames(fd, 20000ms, [&](const DecodedFrame& f) {
    replied =
        f.header.type == FrameType::kResponse && f.header.call_id == 1 && f.header.status == 0;
    return replied;
  });
  CHECK(replied);
  close(fd);
}

TEST_CASE("reads that end inside a length prefix do not grow the read buffer",
          "[hostile][tcp][memory]") {
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
  RssWatch rss(server->pid());
  int fd = RawClient(PortOf(uri));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  // 4,000 valid 32 KiB PINGs (125 MiB), each write ending 2 bytes into the next length prefix,
  // with a pause so that the server's read ends there too. The replies are read, so that only
  // the read buffer is at stake.
  std::atomic<bool> done{false};
  std::thread reader([&] {
    char buf[65536];
    while (!done) {
      if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0) std::this_thread::sleep_for(1ms);
    }
  });
  const std::string frame = Ping(1, 32 * 1024);
  size_t sent_of_frame = 0;  // the first bytes of the next frame already went out
  for (int i = 0; i < 4000; ++i) {
    std::string out = frame.substr(sent_of_frame) + frame.substr(0, 2);
    sent_of_frame = 2;
    const ssize_t n = send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    INFO("send: " << std::strerror(errno));
    REQUIRE(n == ssize_t(out.size()));
    if (i % 8 == 0) std::this_thread::sleep_for(200us);
  }
  done = true;
  reader.join();
  CHECK(Served(uri));
  rss.Report("32 KiB frames, reads ending inside a length prefix");
  CHECK(rss.peak() < kAllowedMiB);  // it used to double up to 1 GiB and keep going
  close(fd);
}

TEST_CASE("a connection that trickles one byte and never completes a frame is closed",
          "[hostile][tcp][idle]") {
  auto [server, uri] =
      StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0", "--idle-timeout-ms", "500"});
  int fd = RawClient(PortOf(uri));
  REQUIRE(send(fd, "\x40", 1, MSG_NOSIGNAL) == 1);  // the first byte of a length prefix
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(ClosedByServer(fd, 5000ms));
  const auto took = std::chrono::steady_clock::now() - t0;
  std::printf("trickling connection closed after %.0f ms (idle timeout 500 ms)\n",
              std::chrono::duration<double, std::milli>(took).count());
  CHECK(took < 2s);  // within 1.5 x the idle timeout, plus a little
  close(fd);
}

TEST_CASE("out of descriptors, new clients are refused at once with RESOURCE_EXHAUSTED",
          "[hostile][tcp][limits]") {
  if (const char* ub = std::getenv("UBSAN_OPTIONS"); ub && *ub) {
    // UBSan's vptr check probes memory through a pipe; in a process out of descriptors the probe
    // fails and every virtual call is reported as an "invalid vptr", so the server dies of the
    // checker, not of a bug. Run by every other configuration.
    WARN("not run under UBSan (--config=ubsan): its vptr check needs free descriptors");
    return;
  }
  // 48 descriptors for the whole server process, and idle connections holding most of them.
  auto [server, uri] = StartServer({"/usr/bin/prlimit", "--nofile=48:48", Runfile(kServer),
                                    "--listen", "tcp://127.0.0.1:0", "--idle-timeout-ms", "3000"});
  // A client connected before the flood keeps being served through it.
  auto early = Channel::ConnectBlocking(uri);
  REQUIRE(early.ok());
  demo::Echo::BlockingStub early_stub(*early);
  std::vector<int> fds;
  for (int c = 0; c < 60; ++c) fds.push_back(RawClient(PortOf(uri)));
  std::this_thread::sleep_for(300ms);
  ChannelOptions co;
  co.reconnect = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto late = Channel::ConnectBlocking(uri, co);
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(late.ok());
  INFO(late.status().ToString());
  std::printf("refused with %s after %.0f ms\n", late.status().ToString().c_str(),
              std::chrono::duration<double, std::milli>(took).count());
  CHECK(late.status().code() == StatusCode::kResourceExhausted);
  CHECK(took < 1s);  // not a stall until the 5 s connect timeout (it took 1 ms here)
  demo::SayRequest req;
  req.set_message("early");
  CHECK(early_stub.Say(req, {.timeout = 5s}).ok());
  // The idle ones are reclaimed (GOAWAY after 3-4.5 s; they ignore it, so they are closed 1.5 s
  // later), and then newcomers get in. (Those of the 60 left in the listen backlog are taken in
  // as the first ones go and must be reclaimed in turn: up to twice that, and more on a loaded
  // machine -- 12 s was once too short beside the VM suite.)
  std::string last;
  CHECK(Eventually(
      [&] {
        auto later = Channel::ConnectBlocking(uri, co);
        last = later.status().ToString();
        return later.ok();
      },
      25000ms));
  INFO(last);
  for (int fd : fds) close(fd);
}

// A TCP connection that never sends its HELLO holds a descriptor on the server until the connect
// timeout (5 s). Unbounded, a few hundred of them every 5 s -- one peer, no secret needed -- kept
// the server out of descriptors and every new client refused. With max_handshakes the oldest
// handshake gives up for each new connection past the bound, so the silent ones hold at most
// about twice the bound and a real client, whose HELLO comes at once, gets in.
TEST_CASE(
    "clients that connect and never send a HELLO hold at most max_handshakes handshakes, "
    "and cannot keep a real client out",
    "[hostile][tcp][limits]") {
  if (const char* ub = std::getenv("UBSAN_OPTIONS"); ub && *ub) {
    WARN("not run under UBSan (--config=ubsan): its vptr check needs free descriptors");
    return;
  }
  constexpr int kMax = 8;
  auto [server, uri] =
      StartServer({"/usr/bin/prlimit", "--nofile=64:64", Runfile(kServer), "--listen",
                   "tcp://127.0.0.1:0", "--max-handshakes", std::to_string(kMax)});
  const auto descriptors = [pid = server->pid()] { return Descriptors(pid); };
  const int baseline = descriptors();
  const uint16_t port = PortOf(uri);
  std::vector<int> fds;
  int peak = baseline;
  const auto flood = [&](int n) {
    for (int i = 0; i < n; ++i) {
      fds.push_back(RawConnect(port));  // and sends nothing
      std::this_thread::sleep_for(2ms);
      peak = std::max(peak, descriptors());
    }
  };
  flood(100);  // more than the server's 64 descriptors
  // A real client in the middle of the flood: connected and served at once.
  ChannelOptions co;
  co.reconnect = false;
  auto ch = Channel::ConnectBlocking(uri, co);
  REQUIRE(ch.ok());
  demo::SayRequest req;
  req.set_message("through the flood");
  auto reply = demo::Echo::BlockingStub(*ch).Say(req, {.timeout = 5s});
  INFO(reply.status().ToString());
  CHECK(reply.ok());
  flood(100);
  std::printf("silent TCP connections: %zu, server descriptors %d before, peak %d\n", fds.size(),
              baseline, peak);
  // The connection above holds one; the handshakes at most twice the bound (evictions take
  // effect on the handshake's thread, a moment after the accept that asked for them).
  // (And a few the server opens lazily: `baseline` was 10 in one run and 13 in another.)
  CHECK(peak <= baseline + 1 + 2 * kMax + 4);
  // The silent connections given up are closed at once, not at the 5 s connect timeout: within
  // 2 s all but the last few have seen their end.
  const auto until = std::chrono::steady_clock::now() + 2s;
  size_t ended = 0;
  std::vector<bool> seen(fds.size(), false);
  while (std::chrono::steady_clock::now() < until && ended + kMax < fds.size()) {
    for (size_t i = 0; i < fds.size(); ++i) {
      if (seen[i]) continue;
      pollfd p{fds[i], POLLIN, 0};
      if (poll(&p, 1, 0) == 1) {
        seen[i] = true;
        ++ended;
      }
    }
    std::this_thread::sleep_for(10ms);
  }
  std::printf("silent TCP connections closed by the server within 2 s: %zu of %zu\n", ended,
              fds.size());
  CHECK(ended + kMax >= fds.size());
  for (int fd : fds) close(fd);
  // And the server still serves.
  CHECK(demo::Echo::BlockingStub(*ch).Say(req, {.timeout = 5s}).ok());
}

TEST_CASE("handshakes given up for newer ones are counted for monitoring", "[hostile][tcp]") {
  ServerOptions so{.io_threads = 1};
  so.transport.max_handshakes = 2;
  TestServer ts("tcp://127.0.0.1:0", so);
  const auto given_up = [] {
    return transport::Get(transport::Snapshot(), transport::Stat::kHandshakesGivenUp);
  };
  const uint64_t before = given_up();
  std::vector<int> fds;
  for (int i = 0; i < 6; ++i) fds.push_back(RawConnect(PortOf(ts.uri)));
  // rdmarpc_transport_handshakes_given_up_total: one for each silent connection past the 2.
  CHECK(Eventually([&] { return given_up() >= before + 4; }, 5000ms));
  // Those given up have gone; the newest two still wait for their HELLO, until they hang up.
  CHECK(Eventually([&] { return ts.server.connections_in_setup() == 2; }, 5000ms));
  for (int fd : fds) close(fd);
  CHECK(Eventually([&] { return ts.server.connections_in_setup() == 0; }, 5000ms));
}

// Over max_connections a client used to be set up in full, told GOAWAY and held up to a second:
// a flood of connects kept as many connections (descriptors; over RDMA, pinned rings) as it
// made in a second. Now the handshake refuses it as busy before anything is set up.
TEST_CASE("a client that makes the server warn on every connection cannot flood its log",
          "[hostile][tcp][log]") {
  // A connection that sends garbage instead of a handshake is refused with a warning. One client
  // making 2,000 such connections made the server write 2,000 lines in 0.09 s: hours of that fill
  // a disk, and a slow log sink blocks the I/O thread writing each. Each warning a peer can cause
  // is now logged at most kLogBurst times per kLogInterval (transport/log_limit.h).
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2000; ++i) {
    const int fd = RawConnect(PortOf(uri));
    SendAll(fd, std::string(64, '\x42'));
    close(fd);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int refused = 0, other = 0;
  std::string last;
  for (std::string line; !(line = server->ReadLine(1500ms)).empty();) {
    (line.find("refusing connection") != std::string::npos ? refused : other)++;
    last = line;
  }
  std::printf(
      "2,000 garbage connections in %.2f s: %d lines logged for them, %d others; last: %s\n",
      seconds, refused, other, last.c_str());
  const int windows = 1 + int(seconds / std::chrono::seconds(transport::kLogInterval).count());
  CHECK(refused >= 1);
  CHECK(refused <= int(transport::kLogBurst) * windows);
  // (Other warnings the flood might cause, an accept error say, are limited as well.)
  CHECK(other <= 2 * int(transport::kLogBurst) * windows);
  // A line after some were left out says how many.
  std::this_thread::sleep_for(transport::kLogInterval);
  const int fd = RawConnect(PortOf(uri));
  SendAll(fd, std::string(64, '\x42'));
  close(fd);
  const std::string line = server->ReadLine(5000ms);
  INFO(line);
  CHECK(line.find("refusing connection") != std::string::npos);
  CHECK(line.find("more like this not logged") != std::string::npos);
  // The server serves on.
  auto ch = Channel::ConnectBlocking(uri);
  REQUIRE(ch.ok());
  demo::SayRequest req;
  req.set_message("still served");
  CHECK(demo::Echo::BlockingStub(*ch).Say(req, {.timeout = 5s}).ok());
}

TEST_CASE("clients over max_connections are refused in the handshake and hold nothing",
          "[hostile][tcp][limits]") {
  if (const char* ub = std::getenv("UBSAN_OPTIONS"); ub && *ub) {
    WARN("not run under UBSan (--config=ubsan): its vptr check needs free descriptors");
    return;
  }
  auto [server, uri] = StartServer({"/usr/bin/prlimit", "--nofile=64:64", Runfile(kServer),
                                    "--listen", "tcp://127.0.0.1:0", "--max-connections", "2"});
  ChannelOptions co;
  co.reconnect = false;
  auto a = Channel::ConnectBlocking(uri, co);
  auto b = Channel::ConnectBlocking(uri, co);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const int baseline = Descriptors(server->pid());
  int peak = baseline, busy = 0, other = 0;
  std::vector<int> fds;
  for (int i = 0; i < 200; ++i) {
    fds.push_back(RawClient(PortOf(uri)));  // HELLO sent, answer unread, never closed by us
    std::this_thread::sleep_for(2ms);
    peak = std::max(peak, Descriptors(server->pid()));
  }
  for (int fd : fds) {
    (AnswerCode(fd) == transport::Refusal::kBusy ? busy : other)++;
    close(fd);
  }
  std::printf(
      "200 connects over max_connections 2: %d answered busy, %d otherwise; server "
      "descriptors %d before, peak %d\n",
      busy, other, baseline, peak);
  CHECK(busy == 200);
  // A few handshakes in progress at a time (more when this machine is loaded), not one
  // descriptor per connection made (the old code reached the limit, 64).
  CHECK(peak <= baseline + 16);
  demo::SayRequest req;
  req.set_message("still served");
  CHECK(demo::Echo::BlockingStub(*a).Say(req, {.timeout = 5s}).ok());
  CHECK(demo::Echo::BlockingStub(*b).Say(req, {.timeout = 5s}).ok());
}

// Opens `n` raw connections from 127.0.0.1 to `port`, each with a HELLO, and keeps them in
// `fds`: how many were accepted and how many answered busy.
std::pair<int, int> ConnectFromOneAddress(uint16_t port, int n, std::vector<int>& fds) {
  int accepted = 0, busy = 0;
  for (int i = 0; i < n; ++i) {
    fds.push_back(RawClient(port));
    const auto code = AnswerCode(fds.back());
    accepted += code == transport::Refusal::kNone;
    busy += code == transport::Refusal::kBusy;
    if (code == transport::Refusal::kNone) {
      // The server counts a connection just after its ANSWER and then sends SETTINGS: wait for
      // that, so that the next connection finds this one counted.
      pollfd p{fds.back(), POLLIN, 0};
      CHECK(poll(&p, 1, 5000) == 1);
    }
  }
  return {accepted, busy};
}

TEST_CASE("one client address cannot take every connection (max_connections_per_peer)",
          "[hostile][tcp][limits]") {
  auto [server, uri] = StartServer(
      {Runfile(kServer), "--listen", "tcp://127.0.0.1:0", "--max-connections-per-peer", "4"});
  const uint16_t port = PortOf(uri);
  std::vector<int> fds;
  const auto [accepted, busy] = ConnectFromOneAddress(port, 20, fds);
  std::printf("20 connections from 127.0.0.1, at most 4 per address: %d accepted, %d busy\n",
              accepted, busy);
  CHECK(accepted == 4);
  CHECK(busy == 16);
  // A client from another address is not kept out by them.
  const int other = RawClient(port, "127.0.0.2");
  CHECK(AnswerCode(other) == transport::Refusal::kNone);
  close(other);
  for (int fd : fds) close(fd);
}

// Without the option set at all: a server as its operator starts it, with no limit in mind,
// must still not let one address take every connection and descriptor (before the default it
// accepted all 300 here, and as many as its descriptors allowed).
TEST_CASE("by default one client address holds at most 256 connections", "[hostile][tcp][limits]") {
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
  const uint16_t port = PortOf(uri);
  std::vector<int> fds;
  const auto [accepted, busy] = ConnectFromOneAddress(port, 300, fds);
  std::printf("300 connections from 127.0.0.1, default limit: %d accepted, %d busy\n", accepted,
              busy);
  CHECK(accepted == 256);
  CHECK(busy == 44);
  // A client from another address is not kept out by them.
  const int other = RawClient(port, "127.0.0.2");
  CHECK(AnswerCode(other) == transport::Refusal::kNone);
  close(other);
  for (int fd : fds) close(fd);
}

TEST_CASE(
    "a client stream sent past its window, after its end or to a call that takes none "
    "costs the sender its connection, and no one else anything",
    "[hostile][tcp][stream]") {
  TestServer ts("tcp://127.0.0.1:0");
  const uint32_t upload = MethodId("/rdmarpc.testing.TestService/Upload");
  const uint32_t count = MethodId("/rdmarpc.testing.TestService/Count");
  const Metadata stall = {{"mode", "stall"}};
  const std::string kib(1024, 'k');
  struct Attack {
    std::string name, expect;
    std::function<std::string()> bytes;
  };
  const std::vector<Attack> attacks = {
      {"past the window", "flow-control window",
       [&] {
         // The handler reads nothing; 300 KiB of messages is more than the 256 KiB window.
         std::string b = OpenStream(1, upload, kRequestFlagClientStream, stall);
         for (int i = 0; i < 300; ++i) b += StreamMessage(1, kib);
         return b;
       }},
      {"after the half-close", "after the caller's half-close",
       [&] {
         return OpenStream(1, upload, kRequestFlagClientStream, stall) + StreamMessage(1, kib) +
                StreamMessage(1, "", kStreamFlagEnd) + StreamMessage(1, kib);
       }},
      {"to a server stream", "takes none",
       [&] {
         CountRequest req;
         req.set_count(1);
         req.set_block_after(true);
         FrameHeader h;
         h.type = FrameType::kRequest;
         h.flags = kRequestFlagServerStream;
         h.method_id = count;
         h.call_id = 1;
         return FrameBytes(h, req.SerializeAsString()) + StreamMessage(1, kib);
       }},
  };
  for (const auto& a : attacks) {
    INFO(a.name);
    int fd = RawClient(PortOf(ts.uri));
    REQUIRE(SendAll(fd, a.bytes()));
    const std::string goaway = GoAwayBeforeClose(fd, 10000ms);
    CHECK_THAT(goaway, Catch::Contains(a.expect));
    close(fd);
    // The stalled handler saw its connection go; nothing is left running.
    CHECK(Eventually([&] { return ts.server.in_flight_calls() == 0; }, 10000ms));
  }
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  CHECK(TestService::BlockingStub(*ch).Echo(EchoRequest(), {.timeout = 5s}).ok());
}

TEST_CASE("a client whose frame and reset arrive together, while the server is busy, is let go",
          "[hostile][tcp]") {
  // Both reach the socket before the server reads it: the read returns the frame with TCP_INQ
  // saying nothing is left (the kernel does not count a reset there, as it does a FIN), and the
  // reset's event was the one that woke the read. Trusting TCP_INQ, the server waited for an
  // event that never came and kept the connection until its idle timeout (found by
  // hostile_random_test); it must read on to the reset. (Whether the reset lands before that
  // read is the kernel's timing: this failed on the old code in one form of the test and not
  // in this one; hostile_random_test's sequences reproduced it in about 1 run in 15.)
  TestServer ts("tcp://127.0.0.1:0", {.io_threads = 1});
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    int fd = RawClient(PortOf(ts.uri));
    REQUIRE(Eventually([&] { return ts.server.connections() == 2; }, 5000ms));
    // A dozen PINGs, one at a time: the server stops reading on past a read that found the
    // socket empty (after 8 that found nothing more), as on any quiet connection.
    FrameReader reader;
    for (uint64_t id = 1; id <= 12; ++id) {
      REQUIRE(SendAll(fd, Ping(id)));
      bool pong = false;
      DecodedFrame f;
      while (!pong && reader.Next(fd, 5000ms, &f) == FrameReader::Got::kFrame) {
        pong = f.header.type == FrameType::kPong && f.header.call_id == id;
      }
      REQUIRE(pong);
    }
    // Block holds the server's only I/O thread for 2 s (a margin for a loaded machine); the frame
    // and the reset go while it does (the call counts from the moment its handler starts).
    std::thread blocker([&] {
      SleepRequest req;
      req.set_ms(2000);
      (void)TestService::BlockingStub(*ch).Block(req, {.timeout = 10s});
    });
    REQUIRE(Eventually([&] { return ts.server.in_flight_calls() == 1; }, 5000ms));
    FrameHeader h;
    h.type = FrameType::kCancel;  // of a call that does not exist: nothing answers it
    h.call_id = 7;
    REQUIRE(SendAll(fd, FrameBytes(h, "")));
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
    blocker.join();
    CHECK(Eventually([&] { return ts.server.connections() == 1; }, 3000ms));
  }
}

TEST_CASE(
    "a client that breaks the protocol and hangs up is let go at once, not after the grace "
    "period",
    "[hostile][tcp][stream]") {
  // After a protocol error the server reads nothing more from the connection and gives its
  // running calls a grace period (5 s) to deliver their replies. A peer that hangs up meanwhile
  // will take none: its calls are cancelled and the connection goes as soon as it is gone,
  // whether it half-closes (FIN, unread data before it) or resets.
  TestServer ts("tcp://127.0.0.1:0");
  const uint32_t count = MethodId("/rdmarpc.testing.TestService/Count");
  for (const bool reset : {false, true}) {
    INFO((reset ? "reset" : "half-close"));
    int fd = RawClient(PortOf(ts.uri));
    CountRequest req;
    req.set_count(1);
    req.set_block_after(true);  // then waits for its caller: a call that never ends by itself
    FrameHeader h;
    h.type = FrameType::kRequest;
    h.flags = kRequestFlagServerStream;
    h.method_id = count;
    h.call_id = 1;
    REQUIRE(SendAll(fd, FrameBytes(h, req.SerializeAsString())));
    REQUIRE(Eventually([&] { return ts.server.in_flight_calls() == 1; }, 5000ms));
    // A stream message on a server stream: GOAWAY, and the grace period begins.
    REQUIRE(SendAll(fd, StreamMessage(1, "x")));
    std::string goaway;
    ReadFrames(fd, 5000ms, [&](const DecodedFrame& f) {
      if (f.header.type == FrameType::kGoAway) goaway = PayloadOf(f);
      return !goaway.empty();
    });
    REQUIRE_THAT(goaway, Catch::Contains("takes none"));
    if (reset) {
      linger l{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      close(fd);
    } else {
      shutdown(fd, SHUT_WR);
    }
    CHECK(Eventually([&] { return ts.server.in_flight_calls() == 0; }, 2000ms));
    CHECK(Eventually([&] { return ts.server.connections() == 0; }, 2000ms));
    if (!reset) close(fd);
  }
}

TEST_CASE(
    "a client stream message that does not parse ends that call with INVALID_ARGUMENT; the "
    "connection serves on",
    "[hostile][tcp][stream]") {
  TestServer ts("tcp://127.0.0.1:0");
  const uint32_t upload = MethodId("/rdmarpc.testing.TestService/Upload");
  const uint32_t echo = MethodId("/rdmarpc.testing.TestService/Echo");
  auto numbered = [](uint64_t seq) {
    EchoRequest m;
    m.set_seq(seq);
    return m.SerializeAsString();
  };
  FrameHeader call;
  call.type = FrameType::kRequest;
  call.method_id = echo;
  call.call_id = 3;
  EchoRequest hello;
  hello.set_payload("hello");
  // Two good messages, one whose first tag is cut short, one more, the half-close; then a unary
  // call on the same connection.
  const std::string bytes = OpenStream(1, upload, kRequestFlagClientStream) +
                            StreamMessage(1, numbered(0)) + StreamMessage(1, numbered(1)) +
                            StreamMessage(1, std::string("\xff\xff\xff\xff", 4)) +
                            StreamMessage(1, numbered(2)) + StreamMessage(1, "", kStreamFlagEnd) +
                            FrameBytes(call, hello.SerializeAsString());
  int fd = RawClient(PortOf(ts.uri));
  REQUIRE(SendAll(fd, bytes));
  std::optional<std::pair<StatusCode, std::string>> upload_end, echo_end;
  ReadFrames(fd, 10000ms, [&](const DecodedFrame& f) {
    if (f.header.type == FrameType::kResponse) {
      auto& end = f.header.call_id == 1 ? upload_end : echo_end;
      end.emplace(static_cast<StatusCode>(f.header.status), PayloadOf(f));
    }
    return upload_end && echo_end;
  });
  close(fd);
  REQUIRE(upload_end);
  CHECK(upload_end->first == StatusCode::kInvalidArgument);
  CHECK_THAT(upload_end->second, Catch::Contains("does not parse as rdmarpc.testing.EchoRequest"));
  REQUIRE(echo_end);
  CHECK(echo_end->first == StatusCode::kOk);
  EchoReply reply;
  CHECK(reply.ParseFromString(echo_end->second));
  CHECK(reply.payload() == "hello");
  CHECK(Eventually([&] { return ts.server.in_flight_calls() == 0; }, 10000ms));
}

TEST_CASE(
    "bidirectional streams fed by a client that never reads cannot grow the server past "
    "its budget",
    "[hostile][tcp][stream][memory]") {
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
  const uint32_t chat = MethodId("/demo.Echo/Chat");
  // A new Chat every 3 messages of 64 KiB (within each stream's window), echoes never read: the
  // server's writers wait for window, and the connection's budget stops its reading.
  demo::SayRequest req;
  req.set_payload(std::string(64 << 10, 'c'));
  const std::string message = req.SerializeAsString();
  const double peak = FloodNeverReading(
      server->pid(), uri, 2, "bidirectional streams fed, echoes never read", [&](uint64_t n) {
        const uint64_t i = n - 1;  // messages sent before this one
        const uint64_t call = 1 + i / 3;
        std::string unit = i % 3 == 0 ? OpenStream(call, chat, 3) : std::string();
        return unit + StreamMessage(call, message);
      });
  CHECK(peak < kAllowedMiB);
}

// A CANCEL costs the server a look through the connection's running calls (up to
// max_concurrent_calls_per_connection of them), and the peer only a frame header: with 1,000
// calls kept running, a flood of CANCELs for calls that do not exist held the server's I/O
// thread at ~6 us a frame (a well-behaved client on the same thread: p50 8.5 ms instead of
// 23 us). A caller cancels only what it requested: more CANCELs than REQUESTs (past a slack of
// 64) is a breach of protocol.
TEST_CASE(
    "a client that sends more CANCELs than requests is closed; one that cancels its calls is not",
    "[hostile][tcp]") {
  TestServer ts("tcp://127.0.0.1:0", ServerOptions{.io_threads = 1});
  const uint32_t sleep = MethodId("/rdmarpc.testing.TestService/Sleep");
  auto request = [&](uint64_t id) {
    FrameHeader h;
    h.type = FrameType::kRequest;
    h.method_id = sleep;
    h.call_id = id;
    SleepRequest r;
    r.set_ms(60000);
    return FrameBytes(h, r.SerializeAsString());
  };
  auto cancel = [](uint64_t id) {
    FrameHeader h;
    h.type = FrameType::kCancel;
    h.call_id = id;
    return FrameBytes(h, "");
  };
  {  // 200 calls, each cancelled, and 64 CANCELs that cross nothing: all answered CANCELLED
    const int fd = RawClient(PortOf(ts.uri));
    std::string out;
    for (uint64_t id = 1; id <= 200; ++id) out += request(id) + cancel(id);
    for (uint64_t id = 1000; id < 1064; ++id) out += cancel(id);
    REQUIRE(SendAll(fd, out));
    int cancelled = 0;
    bool goaway = false;
    ReadFrames(fd, 10000ms, [&](const DecodedFrame& f) {
      if (f.header.type == FrameType::kResponse &&
          f.header.status == uint32_t(StatusCode::kCancelled)) {
        ++cancelled;
      }
      goaway |= f.header.type == FrameType::kGoAway;
      return cancelled == 200;
    });
    CHECK(cancelled == 200);
    CHECK_FALSE(goaway);
    close(fd);
  }
  {  // 100 calls kept running, then CANCELs for calls never made
    const int fd = RawClient(PortOf(ts.uri));
    std::string out;
    for (uint64_t id = 1; id <= 100; ++id) out += request(id);
    for (uint64_t id = 1000; id < 1200; ++id) out += cancel(id);
    REQUIRE(SendAll(fd, out));
    CHECK_THAT(GoAwayBeforeClose(fd, 10000ms),
               Catch::Contains("more CANCEL frames (165) than requests (100)"));
    close(fd);
  }
  CHECK(Eventually([&] { return ts.server.in_flight_calls() == 0; }, 10000ms));
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  CHECK(TestService::BlockingStub(*ch).Echo(EchoRequest(), {.timeout = 5s}).ok());
}

// A call's metadata is decoded into two strings per entry, held while the call runs. Before,
// only its bytes were counted: two clients opening bidirectional streams, each with 64 KiB of
// empty entries (10,922, ~700 KiB decoded), held 357 MiB of a server bounded at 2 x 16 MiB. Now
// a request with more than kMaxMetadataEntries is refused, and the entries of running calls
// count against the budget (hostile_test checks both directly).
TEST_CASE("streams opened with many metadata entries cannot grow the server past its budget",
          "[hostile][tcp][memory]") {
  const uint32_t chat = MethodId("/demo.Echo/Chat");
  for (const size_t entries : {kMaxMetadataBytes / 6, kMaxMetadataEntries}) {
    const Metadata md(entries);
    const std::string name =
        "streams opened with " + std::to_string(entries) + " empty metadata entries each";
    INFO(name);
    auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
    CHECK(FloodNeverReading(server->pid(), uri, 2, name, [&](uint64_t i) {
            return OpenStream(i, chat, kRequestFlagClientStream | kRequestFlagServerStream, md);
          }) < kAllowedMiB);
  }
}

// A running call costs the server ~3 KiB of its own (context, call state, coroutine frames)
// beside its request, and a REQUEST opening a stream is 48 bytes: before, only those 48 counted,
// so that connections each keeping max_concurrent_calls_per_connection streams open (and never
// using them) grew the server far past its server-wide bound. Now each call counts
// kCallHeldBytes.
TEST_CASE("streams opened and never used are held to the server-wide budget",
          "[hostile][tcp][memory]") {
  const uint32_t chat = MethodId("/demo.Echo/Chat");
  constexpr int kClients = 8;
  constexpr size_t kBound = 8 << 20;
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0",
                                    "--max-buffered-bytes-total", std::to_string(kBound)});
  const double start = RssMiB(server->pid());
  const double peak = FloodNeverReading(
      server->pid(), uri, kClients, "8 clients open bidirectional streams, 8 MiB server-wide",
      [&](uint64_t i) {
        return OpenStream(i, chat, kRequestFlagClientStream | kRequestFlagServerStream);
      });
  // The bound and 12 MiB for what it does not see (read buffers, what each connection holds
  // below the 32 KiB grain it reports in, the share one connection may pass before it is
  // paused). Measured: +13.4 MiB; +32 MiB when a call counted only its request's bytes.
  if (kRssMeaningful) CHECK(peak - start < double(kBound >> 20) + 12);
}

// Stream frames (STREAM_MESSAGE, WINDOW) find their call by the id the client chose. In a hash
// table keyed by those ids (std::unordered_map's hash of an integer is the integer), a client
// that knows the table's size picks ids that all land in one bucket: with 1,024 streams open
// (the default limit), each frame for an id in that bucket walked all of them. Measured before
// the fix (a tree now): 5.4 us a frame against 0.045 us for ordinary ids, so that ~8 MB/s of
// 44-byte WINDOW frames kept an I/O thread busy. Where the server's look-ups go must not be
// the peer's choice.
// What is compared is time per frame, colliding ids against ordinary ones on the same server
// (the best of five rounds each, rounds alternating): a ratio, not a figure of this machine.
TEST_CASE("stream ids chosen to collide cost the server no more per frame than others",
          "[hostile][tcp]") {
  constexpr uint64_t kStreams = 1024;
  TestServer ts("tcp://127.0.0.1:0", ServerOptions{.io_threads = 1});
  const uint32_t chat = MethodId("/rdmarpc.testing.TestService/Chat");
  // The attacker's arithmetic: the bucket count a table of 1,024 entries has.
  uint64_t buckets = 0;
  {
    std::unordered_map<uint64_t, int> probe;
    for (uint64_t i = 1; i <= kStreams; ++i) probe[i] = 0;
    buckets = probe.bucket_count();
  }
  struct Arm {
    const char* name;
    uint64_t step;  // stream ids are step, 2 step, ...; the flood's ids follow them
    int fd = -1;
    double best_us = 1e18;
    FrameReader reader;
  };
  Arm arms[2] = {{"ids in one bucket", buckets}, {"ordinary ids", 1}};
  for (Arm& a : arms) {
    a.fd = RawClient(PortOf(ts.uri));
    std::string out;
    for (uint64_t i = 1; i <= kStreams; ++i) {
      out += OpenStream(i * a.step, chat, kRequestFlagClientStream | kRequestFlagServerStream);
    }
    REQUIRE(SendAll(a.fd, out));
  }
  REQUIRE(
      Eventually([&] { return ts.server.in_flight_calls() == int64_t{2 * kStreams}; }, 20000ms));
  constexpr int kFrames = 200000;
  std::string credit(kWindowBytes, '\0');
  EncodeWindow(1, reinterpret_cast<std::byte*>(credit.data()));
  for (int round = 0; round < 5; ++round) {
    for (Arm& a : arms) {
      std::string flood;
      for (int j = 0; j < kFrames; ++j) {  // calls that do not exist: each look-up is a miss
        FrameHeader w;
        w.type = FrameType::kWindow;
        w.call_id = (kStreams + 1 + uint64_t(j % 64)) * a.step;
        flood += FrameBytes(w, credit);
      }
      flood += Ping(7);
      const auto t0 = std::chrono::steady_clock::now();
      REQUIRE(SendAll(a.fd, flood, 60000ms));
      bool pong = false;
      // One reader per connection for the whole case: the first bytes are the handshake's.
      DecodedFrame f;
      while (!pong && a.reader.Next(a.fd, 60000ms, &f) == FrameReader::Got::kFrame) {
        pong = f.header.type == FrameType::kPong && f.header.call_id == 7;
      }
      REQUIRE(pong);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          kFrames;
      a.best_us = std::min(a.best_us, us);
    }
  }
  std::printf("%d WINDOW frames over %llu open streams, best of 5: %s %.3f us per frame, %s %.3f\n",
              kFrames, static_cast<unsigned long long>(kStreams), arms[0].name, arms[0].best_us,
              arms[1].name, arms[1].best_us);
  CHECK(arms[0].best_us < 4 * arms[1].best_us);
  for (Arm& a : arms) close(a.fd);
  CHECK(Eventually([&] { return ts.server.in_flight_calls() == 0; }, 20000ms));
}

// A message's wire size is not what it takes once parsed: protobuf keeps every field it does not
// know (so that a message can be passed on whole), each an entry of its own, a length-delimited
// one with a string of its own besides, for the two bytes it took on the wire; a repeated string
// or message field likewise. Before, two requests of 16 MiB of empty unknown fields (echo's
// Say) took the server from 11.9 to 556 MiB: it counted 16 MiB each. Now a request is counted
// at what it will take parsed (rpc/internal/decoded_size.h), and one that would hold more beyond
// its bytes than a connection may hold is refused before it is parsed.
TEST_CASE("requests made of many small fields are counted and bounded as what they take parsed",
          "[hostile][tcp][memory]") {
  auto [server, uri] = StartServer({Runfile(kServer), "--listen", "tcp://127.0.0.1:0"});
  RssWatch rss(server->pid());
  const uint32_t say = MethodId("/demo.Echo/Say");
  // Empty unknown length-delimited fields (number 15: tag 0x7a, length 0), two bytes each.
  auto request = [&](uint64_t id, size_t bytes) {
    std::string fields;
    fields.reserve(bytes);
    while (fields.size() < bytes) fields += std::string_view("\x7a\x00", 2);
    FrameHeader h;
    h.type = FrameType::kRequest;
    h.method_id = say;
    h.call_id = id;
    return FrameBytes(h, fields);
  };
  // What the server answers call `id` on `fd`: its status code and error text. One reader per
  // connection: the first bytes it reads are the handshake's.
  std::vector<int> fds;
  std::vector<FrameReader> readers(2);
  auto answer = [&](size_t c, uint64_t id) {
    std::pair<int, std::string> got{-1, ""};
    DecodedFrame f;
    while (readers[c].Next(fds[c], 60000ms, &f) == FrameReader::Got::kFrame) {
      if (f.header.type != FrameType::kResponse || f.header.call_id != id) continue;
      got = {int(f.header.status), f.header.status == 0 ? "" : PayloadOf(f)};
      break;
    }
    return got;
  };
  for (int c = 0; c < 2; ++c) {
    fds.push_back(RawClient(PortOf(uri)));
    REQUIRE(SendAll(fds.back(), request(1, 16u << 20), 60000ms));
  }
  for (size_t c = 0; c < 2; ++c) {
    const auto [code, text] = answer(c, 1);
    CHECK(code == int(StatusCode::kResourceExhausted));
    CHECK_THAT(text, Catch::Contains("request of 16777216 bytes would take about") &&
                         Catch::Contains("once parsed"));
  }
  // One of 64 KiB (~2.6 MiB parsed, within the 16 MiB a connection may hold) is served, on the
  // same connection.
  REQUIRE(SendAll(fds[0], request(2, 64u << 10), 60000ms));
  CHECK(answer(0, 2).first == 0);
  CHECK(Served(uri));
  rss.Report("2 requests of 16 MiB of empty unknown fields");
  CHECK(rss.peak() < kAllowedMiB);
  for (int fd : fds) close(fd);
}

// The same fields in client-stream messages, which the handler's Read parses (each within the
// stream's 256 KiB window, so ~10 MiB parsed at most): the message a handler read last is
// counted at what it takes parsed, until its next read or the call's end, and one that would
// take more beyond its bytes than a connection may hold ends the stream with
// RESOURCE_EXHAUSTED instead of being parsed.
TEST_CASE("client-stream messages of many small fields count what they take parsed",
          "[hostile][tcp][memory]") {
  const uint32_t upload = MethodId("/rdmarpc.testing.TestService/Upload");
  std::string fields;  // 200 KiB of empty unknown fields: ~8 MiB parsed
  while (fields.size() < (200u << 10)) fields += std::string_view("\x7a\x00", 2);
  SECTION("counted while the handler holds it") {
    TestServer ts("tcp://127.0.0.1:0", ServerOptions{.io_threads = 1});
    const int fd = RawClient(PortOf(ts.uri));
    REQUIRE(
        SendAll(fd, OpenStream(1, upload, kRequestFlagClientStream) + StreamMessage(1, fields)));
    // Read, and held parsed while the handler waits for the next message.
    CHECK(Eventually([&] { return ts.server.buffered_bytes() > (4 << 20); }, 10000ms));
    REQUIRE(SendAll(fd, StreamMessage(1, "", kStreamFlagEnd)));  // half-close: the call ends
    int code = -1;
    ReadFrames(fd, 10000ms, [&](const DecodedFrame& f) {
      if (f.header.type == FrameType::kResponse) code = int(f.header.status);
      return f.header.type == FrameType::kResponse;
    });
    CHECK(code == 0);
    // Given back with the call (the server-wide figure follows each connection to within 32 KiB).
    CHECK(Eventually([&] { return ts.server.buffered_bytes() < (64 << 10); }, 10000ms));
    close(fd);
  }
  SECTION("refused over the connection's budget") {
    ServerOptions o{.io_threads = 1};
    o.max_buffered_bytes_per_connection = 1u << 20;
    TestServer ts("tcp://127.0.0.1:0", o);
    const int fd = RawClient(PortOf(ts.uri));
    REQUIRE(SendAll(fd, OpenStream(1, upload, kRequestFlagClientStream) + StreamMessage(1, fields) +
                            StreamMessage(1, "", kStreamFlagEnd)));
    int code = -1;
    std::string text;
    ReadFrames(fd, 10000ms, [&](const DecodedFrame& f) {
      if (f.header.type != FrameType::kResponse) return false;
      code = int(f.header.status);
      text = PayloadOf(f);
      return true;
    });
    CHECK(code == int(StatusCode::kResourceExhausted));
    CHECK_THAT(text, Catch::Contains("stream message of 204800 bytes would take about"));
    close(fd);
    CHECK(Eventually([&] { return ts.server.buffered_bytes() == 0; }, 10000ms));
  }
  // Each handler holds the message it read last, so a client with many streams could make the
  // server hold one such message per stream at once, each within the allowance: messages that
  // queued while their handlers were busy (reading from the client pauses only at the budget,
  // counted in wire bytes, ~60 such messages here) are parsed as the handlers come to read
  // them. The allowance is the connection's, shared by its streams.
  SECTION("many streams together hold no more than one may") {
    ServerOptions o{.io_threads = 1};
    o.max_buffered_bytes_per_connection = 12u << 20;
    TestServer ts("tcp://127.0.0.1:0", o);
    const int fd = RawClient(PortOf(ts.uri));
    constexpr uint64_t kStreams = 6;
    std::string opening;
    for (uint64_t id = 1; id <= kStreams; ++id) {
      opening += OpenStream(id, upload, kRequestFlagClientStream, {{"mode", "delay:300"}}) +
                 StreamMessage(id, fields);
    }
    REQUIRE(SendAll(fd, opening));
    std::map<uint64_t, int> codes;
    std::string refusal;
    size_t held_at_refusals = 0;
    ReadFrames(fd, 20000ms, [&](const DecodedFrame& f) {
      if (f.header.type != FrameType::kResponse) return false;
      codes[f.header.call_id] = int(f.header.status);
      if (f.header.status != 0) refusal = PayloadOf(f);
      if (codes.size() == kStreams - 1) {
        // The one left is the stream whose handler holds its message: it ends when it
        // half-closes.
        held_at_refusals = ts.server.buffered_bytes();
        for (uint64_t id = 1; id <= kStreams; ++id) {
          if (!codes.count(id)) SendAll(fd, StreamMessage(id, "", kStreamFlagEnd));
        }
      }
      return codes.size() == kStreams;
    });
    // (Without refusals no stream ends: what the server holds with every handler holding.)
    if (codes.size() < kStreams - 1) held_at_refusals = ts.server.buffered_bytes();
    int ok = 0, exhausted = 0;
    for (const auto& [id, code] : codes) {
      ok += code == 0;
      exhausted += code == int(StatusCode::kResourceExhausted);
    }
    std::printf(
        "%d client streams of ~8 MiB parsed each, 12 MiB budget: %d read, %d refused; "
        "the server held %zu KiB meanwhile\n",
        int(kStreams), ok, exhausted, held_at_refusals >> 10);
    INFO(refusal);
    CHECK(ok == 1);
    CHECK(exhausted == int(kStreams) - 1);
    CHECK_THAT(refusal, Catch::Contains("stream message of 204800 bytes would take about") &&
                            Catch::Contains("besides what messages its other streams"));
    CHECK(held_at_refusals > (4u << 20));
    CHECK(held_at_refusals < (12u << 20) + (1u << 20));
    close(fd);
    CHECK(Eventually([&] { return ts.server.buffered_bytes() == 0; }, 10000ms));
  }
}

// The RPC protocol under faults injected at an exact frame, over the in-process transport
// (transport/inproc/): a lost request, a reply that comes back after its call gave up, a
// connection that breaks under a call, a client (or a server) whose keepalive answers are lost,
// admission at the server's limit, a call crossing GOAWAY, an idle close. Each case
// says which frame the fault hits and waits on what the protocol does about it, not on sleeps.
// The same behaviours over tcp:// and rdma:// are in reliability_test and rpc_integration_test.
#include <catch2/catch.hpp>
#include <mutex>
#include <set>

#include "rpc/internal/frame.h"
#include "test/test_util.h"
#include "transport/inproc/inproc_transport.h"

using namespace rdmarpc;
using namespace rdmarpc::testing;
using namespace std::chrono_literals;
namespace inproc = rdmarpc::transport::inproc;
using inproc::Direction;
using inproc::Fault;
namespace asio = boost::asio;

namespace {

FrameType TypeOf(std::span<const std::byte> message) {
  DecodedFrame f;
  if (!DecodeFrame(message, &f).empty()) return static_cast<FrameType>(0);
  return f.header.type;
}

// Installs a hook for listener `name` for the scope of a test case.
struct Faults {
  Faults(std::string name, inproc::FaultHook hook) : name(std::move(name)) {
    inproc::SetFaultHook(this->name, std::move(hook));
  }
  ~Faults() { inproc::SetFaultHook(name, nullptr); }
  std::string name;
};

EchoRequest Payload(std::string text) {
  EchoRequest req;
  req.set_payload(std::move(text));
  return req;
}

}  // namespace

TEST_CASE("a request lost on the way ends at its deadline; the next call is served",
          "[inproc][faults]") {
  TestServer ts("inproc://lost-request:0", ServerOptions{.io_threads = 1});
  std::atomic<int> requests{0};
  Faults faults("lost-request", [&](Direction d, std::span<const std::byte> m) {
    if (d == Direction::kToServer && TypeOf(m) == FrameType::kRequest && requests++ == 0) {
      return Fault::kDrop;  // the first request only
    }
    return Fault::kDeliver;
  });
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  auto lost = stub.Echo(Payload("lost"), {.timeout = 300ms});
  CHECK(lost.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(requests == 1);
  auto next = stub.Echo(Payload("next"), {.timeout = 5s});
  REQUIRE(next.ok());
  CHECK(next->payload() == "next");
}

TEST_CASE("a reply that comes back after its call gave up is dropped; later calls get their own",
          "[inproc][faults]") {
  TestServer ts("inproc://late-reply:0", ServerOptions{.io_threads = 1});
  std::atomic<bool> held{false};
  Faults faults("late-reply", [&](Direction d, std::span<const std::byte> m) {
    if (d == Direction::kToClient && TypeOf(m) == FrameType::kResponse && !held.exchange(true)) {
      return Fault::kHold;  // the first reply waits until the test lets it go
    }
    return Fault::kDeliver;
  });
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  auto first = stub.Echo(Payload("first"), {.timeout = 300ms});
  CHECK(first.status().code() == StatusCode::kDeadlineExceeded);
  // The server did answer; the answer is held. Let it through now that its call is over:
  // the call's slot has been freed and may already serve the next call.
  REQUIRE(inproc::HeldCount("late-reply") == 1);
  CHECK(inproc::ReleaseHeld("late-reply") == 1);
  for (int i = 0; i < 20; ++i) {
    const std::string text = "call " + std::to_string(i);
    auto r = stub.Echo(Payload(text), {.timeout = 5s});
    REQUIRE(r.ok());
    CHECK(r->payload() == text);
  }
}

TEST_CASE("a connection that breaks under a call fails it with UNAVAILABLE; the channel reconnects",
          "[inproc][faults]") {
  TestServer ts("inproc://reset:0", ServerOptions{.io_threads = 1});
  std::atomic<bool> reset{false};
  Faults faults("reset", [&](Direction d, std::span<const std::byte> m) {
    if (d == Direction::kToClient && TypeOf(m) == FrameType::kResponse && !reset.exchange(true)) {
      return Fault::kReset;  // the connection breaks as the first reply is sent
    }
    return Fault::kDeliver;
  });
  ChannelOptions co;
  co.reconnect_backoff_initial = 20ms;
  auto ch = Channel::ConnectBlocking(ts.uri, co);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  const auto t0 = std::chrono::steady_clock::now();
  auto broken = stub.Echo(Payload("broken"), {.timeout = 10s});
  CHECK(broken.status().code() == StatusCode::kUnavailable);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // at once, not at the deadline
  INFO(broken.status().ToString());
  auto again = stub.Echo(Payload("again"), {.timeout = 10s, .wait_for_ready = true});
  REQUIRE(again.ok());
  CHECK(again->payload() == "again");
  CHECK(Eventually([&] { return ts.server.connections() == 1; }, 5000ms));
}

// The transport closes a connection at once but tells the channel later (OnClose is posted): a
// call made in between finds the channel still ready and the transport refusing its request.
// Nothing of that call went out, so it is as if the connection had gone just before it: a
// wait_for_ready call waits for the reconnect, a fail-fast one fails saying the connection was
// lost. (Seen over rdma:// in hostile_server_test: a wait_for_ready call failed at once.)
TEST_CASE(
    "a call made after the transport closed the connection, before the channel heard, "
    "waits for the reconnect when wait_for_ready",
    "[inproc][faults]") {
  TestServer ts("inproc://unheard-close:0", ServerOptions{.io_threads = 1});
  std::atomic<bool> reset{false};
  Faults faults("unheard-close", [&](Direction d, std::span<const std::byte> m) {
    if (d == Direction::kToServer && TypeOf(m) == FrameType::kRequest && !reset.exchange(true)) {
      return Fault::kReset;  // the first request breaks the connection as it is sent
    }
    return Fault::kDeliver;
  });
  ChannelOptions co;
  co.reconnect_backoff_initial = 20ms;
  auto ch = Channel::ConnectBlocking(ts.uri, co);
  REQUIRE(ch.ok());
  const bool wait_for_ready = GENERATE(true, false);
  INFO("wait_for_ready " << wait_for_ready);
  std::atomic<StatusCode> first{StatusCode::kOk};
  Status second;
  std::string second_payload;
  (*ch)->Run([&]() -> asio::awaitable<void> {
    TestService::Stub stub(*ch);
    // Both start in this turn of the channel's thread, before the connection's OnClose: the
    // first one's request resets the connection, the second finds it closed.
    auto ex = co_await asio::this_coro::executor;
    asio::co_spawn(
        ex,
        [&]() -> asio::awaitable<void> {
          auto r = co_await stub.Echo(Payload("first"), {.timeout = 10s});
          first = r.status().code();
        },
        asio::detached);
    auto r =
        co_await stub.Echo(Payload("second"), {.timeout = 10s, .wait_for_ready = wait_for_ready});
    second = r.status();
    if (r.ok()) second_payload = r->payload();
  }());
  CHECK(reset);
  CHECK(Eventually([&] { return first == StatusCode::kUnavailable; }, 5000ms));
  INFO("second: " << second.ToString());
  if (wait_for_ready) {
    REQUIRE(second.ok());
    CHECK(second_payload == "second");
  } else {
    CHECK(second.code() == StatusCode::kUnavailable);
    CHECK_THAT(second.message(), Catch::Contains("lost") && Catch::Contains("reset"));
  }
}

TEST_CASE("server keepalive drops a client whose answers to its pings are lost",
          "[inproc][faults][keepalive]") {
  ServerOptions so{.io_threads = 1};
  so.keepalive_interval = 100ms;
  so.keepalive_timeout = 300ms;
  TestServer ts("inproc://keepalive:0", so);
  std::atomic<int> pings{0}, pongs_lost{0};
  Faults faults("keepalive", [&](Direction d, std::span<const std::byte> m) {
    const FrameType t = TypeOf(m);
    if (d == Direction::kToClient && t == FrameType::kPing) ++pings;
    if (d == Direction::kToServer && t == FrameType::kPong) {
      ++pongs_lost;
      return Fault::kDrop;
    }
    return Fault::kDeliver;
  });
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  SleepRequest req;
  req.set_ms(60'000);
  auto r = stub.Sleep(req, {.timeout = 30s});
  // The server gave up on the silent client: its call failed, and the server cancelled the
  // handler that was working for it.
  CHECK(r.status().code() == StatusCode::kUnavailable);
  INFO(r.status().ToString());
  CHECK(pings >= 1);
  CHECK(pongs_lost >= 1);
  CHECK(Eventually([&] { return ts.service.cancelled_seen.load() == 1; }, 5000ms));
}

TEST_CASE("held messages keep their order: a held frame holds back the frames after it",
          "[inproc][faults]") {
  TestServer ts("inproc://order:0", ServerOptions{.io_threads = 1});
  std::atomic<int> requests{0};
  Faults faults("order", [&](Direction d, std::span<const std::byte> m) {
    if (d == Direction::kToServer && TypeOf(m) == FrameType::kRequest && requests++ == 0) {
      return Fault::kHold;
    }
    return Fault::kDeliver;
  });
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  // Three calls at once: the first request is held, the two after it queue behind it, so no
  // handler runs until the test releases them; then all three are answered, each its own.
  std::vector<std::thread> callers;
  std::mutex mu;
  std::set<std::string> answered;
  for (int i = 0; i < 3; ++i) {
    callers.emplace_back([&, i] {
      TestService::BlockingStub stub(*ch);
      auto r = stub.Echo(Payload("c" + std::to_string(i)), {.timeout = 10s});
      std::lock_guard lock(mu);
      answered.insert(r.ok() ? r->payload() : r.status().ToString());
    });
  }
  REQUIRE(Eventually([&] { return inproc::HeldCount("order") == 3; }, 5000ms));
  {
    std::lock_guard lock(mu);
    CHECK(answered.empty());
  }
  CHECK(inproc::ReleaseHeld("order") == 3);
  for (auto& t : callers) t.join();
  CHECK(answered == std::set<std::string>{"c0", "c1", "c2"});
}

TEST_CASE("admission: a channel holds calls over the server's limit until a reply makes room",
          "[inproc][faults][limits]") {
  ServerOptions so{.io_threads = 1};
  so.max_concurrent_calls_per_connection = 2;
  TestServer ts("inproc://admission:0", so);
  std::atomic<bool> holding{true};
  std::atomic<int> requests{0};
  Faults faults("admission", [&](Direction d, std::span<const std::byte> m) {
    const FrameType t = TypeOf(m);
    if (d == Direction::kToServer && t == FrameType::kRequest) ++requests;
    if (d == Direction::kToClient && t == FrameType::kResponse && holding) return Fault::kHold;
    return Fault::kDeliver;
  });
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 5; ++i) {
    callers.emplace_back([&, i] {
      TestService::BlockingStub stub(*ch);
      const std::string text = "c" + std::to_string(i);
      auto r = stub.Echo(Payload(text), {.timeout = 10s});
      if (r.ok() && r->payload() == text) ++ok;
    });
  }
  // Two requests went out and were answered; the answers are held, so the channel still counts
  // two calls on the server and sends none of the other three.
  REQUIRE(Eventually([&] { return inproc::HeldCount("admission") == 2; }, 5000ms));
  CHECK(requests == 2);
  holding = false;
  inproc::ReleaseHeld("admission");
  for (auto& t : callers) t.join();
  CHECK(ok == 5);  // queued, never failed
  CHECK(requests == 5);
  CHECK(ts.service.max_sleeping.load() == 0);
}

TEST_CASE("a call that crosses the server's GOAWAY fails with UNAVAILABLE; running calls finish",
          "[inproc][faults][shutdown]") {
  auto ts = std::make_unique<TestServer>("inproc://goaway:0",
                                         ServerOptions{.io_threads = 1, .drain_timeout = 10s});
  std::atomic<bool> hold_goaway{true};
  Faults faults("goaway", [&](Direction d, std::span<const std::byte> m) {
    if (d == Direction::kToClient && TypeOf(m) == FrameType::kGoAway && hold_goaway) {
      return Fault::kHold;  // the client does not know yet that the server is draining
    }
    return Fault::kDeliver;
  });
  auto ch = Channel::ConnectBlocking(ts->uri);
  REQUIRE(ch.ok());
  // A call the server is running when it begins to shut down.
  Status running;
  std::thread sleeper([&] {
    TestService::BlockingStub stub(*ch);
    SleepRequest req;
    req.set_ms(300);
    running = stub.Sleep(req, {.timeout = 10s}).status();
  });
  REQUIRE(Eventually([&] { return ts->service.sleeping.load() == 1; }, 5000ms));
  std::thread stopper([&] { ts->server.Shutdown(); });
  REQUIRE(Eventually([&] { return inproc::HeldCount("goaway") == 1; }, 5000ms));
  // This call is sent before the client hears the GOAWAY: the draining server refuses it.
  Status crossed;
  std::thread crossing([&] {
    TestService::BlockingStub stub(*ch);
    crossed = stub.Echo(Payload("crossing"), {.timeout = 10s}).status();
  });
  // Its refusal queues behind the held GOAWAY (order is kept): two frames held.
  REQUIRE(Eventually([&] { return inproc::HeldCount("goaway") == 2; }, 5000ms));
  hold_goaway = false;
  CHECK(inproc::ReleaseHeld("goaway") == 2);
  crossing.join();
  CHECK(crossed.code() == StatusCode::kUnavailable);
  INFO(crossed.ToString());
  // Now the channel knows: a new call fails at once, without reaching the server.
  TestService::BlockingStub stub(*ch);
  const auto t0 = std::chrono::steady_clock::now();
  auto after = stub.Echo(Payload("after"), {.timeout = 10s});
  CHECK(after.status().code() == StatusCode::kUnavailable);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  sleeper.join();
  stopper.join();
  CHECK(running.ok());  // the call that was running when shutdown began finished normally
}

TEST_CASE("client keepalive takes a server whose answers are lost for dead; the channel reconnects",
          "[inproc][faults][keepalive]") {
  TestServer ts("inproc://client-keepalive:0", ServerOptions{.io_threads = 1});
  std::atomic<bool> losing{true};
  std::atomic<int> pongs_lost{0};
  Faults faults("client-keepalive", [&](Direction d, std::span<const std::byte> m) {
    if (losing && d == Direction::kToClient && TypeOf(m) == FrameType::kPong) {
      ++pongs_lost;
      return Fault::kDrop;  // the server hears the client's pings; its answers never arrive
    }
    return Fault::kDeliver;
  });
  ChannelOptions co;
  co.keepalive_interval = 100ms;
  co.keepalive_timeout = 300ms;
  co.reconnect_backoff_initial = 20ms;
  auto ch = Channel::ConnectBlocking(ts.uri, co);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  SleepRequest req;
  req.set_ms(60'000);  // the server says nothing while it runs
  auto r = stub.Sleep(req, {.timeout = 30s});
  // The channel gave up on the silent server: the call failed at once, saying why...
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::Contains("keepalive"));
  CHECK(pongs_lost >= 1);
  // ...and closed the connection, so the server cancelled the handler working for it.
  CHECK(Eventually([&] { return ts.service.cancelled_seen.load() == 1; }, 5000ms));
  losing = false;
  auto again = stub.Echo(Payload("again"), {.timeout = 10s, .wait_for_ready = true});
  REQUIRE(again.ok());
  CHECK(again->payload() == "again");
}

TEST_CASE("a connection the server closed for being idle is opened again by the next call",
          "[inproc][faults][idle]") {
  ServerOptions so{.io_threads = 1};
  so.idle_timeout = 200ms;
  TestServer ts("inproc://idle:0", so);
  std::atomic<int> idle_goaways{0};
  Faults faults("idle", [&](Direction d, std::span<const std::byte> m) {
    DecodedFrame f;
    if (d == Direction::kToClient && DecodeFrame(m, &f).empty() &&
        f.header.type == FrameType::kGoAway && (f.header.flags & kGoAwayFlagIdle) != 0) {
      ++idle_goaways;
    }
    return Fault::kDeliver;
  });
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  REQUIRE(stub.Echo(Payload("first")).ok());
  // The server says GOAWAY (flagged idle) and closes; the channel waits for a call to need it.
  REQUIRE(
      Eventually([&] { return idle_goaways.load() == 1 && ts.server.connections() == 0; }, 5000ms));
  // Not an error for the caller: a call without wait_for_ready connects again and is served.
  auto next = stub.Echo(Payload("next"), {.timeout = 5s});
  REQUIRE(next.ok());
  CHECK(next->payload() == "next");
  CHECK(Eventually([&] { return ts.server.connections() == 1; }, 5000ms));
  CHECK(idle_goaways.load() == 1);
}

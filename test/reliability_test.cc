// Reliability and security behaviour (issue 5), each case over every transport of
// ListenUrisInProcess() (tcp and inproc on the host; rdma in the Soft-RoCE VM suite):
// authentication, connection and concurrency limits, GOAWAY on shutdown, reconnect with backoff and
// wait-for-ready, server-side keepalive, deadline inheritance in nested calls, and peers that send
// garbage through a real transport.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "rpc/internal/frame.h"
#include "test/raw_peer.h"
#include "test/test_util.h"
#include "transport/stats.h"
#include "transport/transport.h"
#include "transport/uri.h"

namespace asio = boost::asio;
using namespace rdmarpc;
using namespace rdmarpc::testing;
using namespace std::chrono_literals;

TEST_CASE("authentication: a wrong or missing secret is refused before any call runs",
          "[reliability][auth]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  ServerOptions so{.io_threads = 1};
  so.transport.auth_secret = "correct horse battery staple";
  TestServer ts(listen, so);

  for (std::string secret : {std::string(), std::string("wrong secret")}) {
    ChannelOptions co;
    co.transport.auth_secret = secret;
    auto ch = Channel::ConnectBlocking(ts.uri, co);
    INFO("client secret: '" << secret << "'");
    REQUIRE_FALSE(ch.ok());
    CHECK(ch.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(ch.status().message(), Catch::Contains("authentication failed"));
  }
  CHECK(ts.server.connections() == 0);

  ChannelOptions co;
  co.transport.auth_secret = "correct horse battery staple";
  auto ch = Channel::ConnectBlocking(ts.uri, co);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  EchoRequest req;
  req.set_payload("authenticated");
  auto r = stub.Echo(req);
  REQUIRE(r.ok());
  CHECK(r->payload() == "authenticated");

  // Authentication is mutual: a client with a secret does not take a server that cannot prove
  // it knows the same one (a rogue or misconfigured server gets none of its calls).
  TestServer open(listen);
  auto ch2 = Channel::ConnectBlocking(open.uri, co);
  REQUIRE_FALSE(ch2.ok());
  CHECK_THAT(ch2.status().message(), Catch::Contains("did not prove"));
  ServerOptions other{.io_threads = 1};
  other.transport.auth_secret = "another secret";
  TestServer impostor(listen, other);
  auto ch3 = Channel::ConnectBlocking(impostor.uri, co);
  REQUIRE_FALSE(ch3.ok());
  CHECK_THAT(ch3.status().message(), Catch::Contains("authentication failed"));
  // Without a secret on either side, anyone connects (the default).
  CHECK(Channel::ConnectBlocking(open.uri).ok());
}

TEST_CASE("max_connections: one more client is turned away with RESOURCE_EXHAUSTED",
          "[reliability][limits]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  TestServer ts(listen, ServerOptions{.io_threads = 2, .max_connections = 2});
  auto a = Channel::ConnectBlocking(ts.uri);
  auto b = Channel::ConnectBlocking(ts.uri);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto c = Channel::ConnectBlocking(ts.uri);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kResourceExhausted);
  // Refused in the handshake (tcp://, rdma://: the ANSWER's "busy" names the limit, not its
  // number), or told by GOAWAY (inproc://, which has no handshake; and a client that passed the
  // handshake together with another and found the server full after).
  CHECK_THAT(c.status().message(),
             Catch::Contains("limit of 2 connections") ||
                 Catch::Contains("at the server's connection limit (max_connections)"));
  // The two admitted clients are unaffected.
  TestService::BlockingStub stub(*b);
  CHECK(stub.Echo(EchoRequest()).ok());
  // Room again once one leaves.
  a = Status(StatusCode::kCancelled, "dropped");
  REQUIRE(Eventually([&] { return ts.server.connections() < 2; }, 5000ms));
  auto d = Channel::ConnectBlocking(ts.uri);
  CHECK(d.ok());
}

TEST_CASE("max_connections_per_peer: one client address cannot take every connection",
          "[reliability][limits]") {
  // (Not inproc://: its peers are names, one per client.)
  auto listen = GENERATE(from_range(ListenUris()));
  TestServer ts(listen, ServerOptions{.io_threads = 2, .max_connections_per_peer = 2});
  ChannelOptions co;
  co.reconnect = false;
  auto a = Channel::ConnectBlocking(ts.uri, co);
  auto b = Channel::ConnectBlocking(ts.uri, co);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const auto refused = [] {
    return transport::Get(transport::Snapshot(), transport::Stat::kRefusedLimit);
  };
  const uint64_t refused_before = refused();
  auto c = Channel::ConnectBlocking(ts.uri, co);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kResourceExhausted);
  INFO(c.status().ToString());
  // The handshake's busy answer names the limit; a GOAWAY (after a race) names the address.
  CHECK_THAT(c.status().message(), Catch::Contains("(max_connections_per_peer)") ||
                                       Catch::Contains("connections from one client address"));
  CHECK(refused() > refused_before);  // rdmarpc_transport_refused_total{reason="connection_limit"}
  TestService::BlockingStub stub(*b);
  CHECK(stub.Echo(EchoRequest()).ok());
  a = Status(StatusCode::kCancelled, "dropped");
  REQUIRE(Eventually([&] { return ts.server.connections() < 2; }, 5000ms));
  CHECK(Channel::ConnectBlocking(ts.uri, co).ok());
}

TEST_CASE("concurrency limits queue calls (backpressure), never fail them",
          "[reliability][limits]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  const uint32_t server_limit = GENERATE(4u, 0u);  // 0: no server limit, client limit only
  const uint32_t client_limit = server_limit ? 0u : 3u;
  ServerOptions so{.io_threads = 1};
  so.max_concurrent_calls_per_connection = server_limit;
  TestServer ts(listen, so);
  ChannelOptions co;
  co.max_concurrent_calls = client_limit;
  const int kCalls = 40;
  auto results = RunLoop([&]() -> asio::awaitable<std::vector<Status>> {
    auto ch = co_await MustConnect(ts.uri, co);
    TestService::Stub stub(ch);
    std::vector<Status> out(kCalls);
    int done = 0;
    auto ex = co_await asio::this_coro::executor;
    for (int i = 0; i < kCalls; ++i) {
      asio::co_spawn(
          ex,
          [&, i]() -> asio::awaitable<void> {
            SleepRequest req;
            req.set_ms(50);
            auto r = co_await stub.Sleep(req, {.timeout = 30s});
            out[i] = r.status();
            ++done;
          },
          asio::detached);
    }
    co_await WaitUntil([&] { return done == kCalls; }, 60000ms);
    co_return out;
  }());
  int ok = 0;
  for (const auto& s : results) {
    INFO(s.ToString());
    CHECK(s.ok());
    ok += s.ok();
  }
  CHECK(ok == kCalls);
  const int limit = static_cast<int>(server_limit ? server_limit : client_limit);
  CHECK(ts.service.max_sleeping.load() <= limit);
  CHECK(ts.service.max_sleeping.load() == limit);  // the limit is used, not undershot
}

TEST_CASE("a call that waited for the concurrency limit until its deadline says so",
          "[reliability][limits]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  const bool server_side = GENERATE(true, false);  // whose limit: the server's, or the channel's
  ServerOptions so{.io_threads = 1};
  so.max_concurrent_calls_per_connection = server_side ? 1 : 0;
  TestServer ts(listen, so);
  ChannelOptions co;
  co.max_concurrent_calls = server_side ? 0 : 1;
  auto ch = Channel::ConnectBlocking(ts.uri, co);
  REQUIRE(ch.ok());
  std::thread holder([&] {
    TestService::BlockingStub stub(*ch);
    SleepRequest req;
    req.set_ms(1500);
    (void)stub.Sleep(req, {.timeout = 10s});
  });
  REQUIRE(Eventually([&] { return ts.service.sleeping.load() == 1; }, 5000ms));
  TestService::BlockingStub stub(*ch);
  SleepRequest req;
  req.set_ms(1);
  auto r = stub.Sleep(req, {.timeout = 100ms});
  holder.join();
  INFO(r.status().ToString());
  CHECK(r.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(r.status().message().find("never sent: 1 calls in flight on the connection") !=
        std::string::npos);
  CHECK(r.status().message().find(
            server_side ? "the server allows (its max_concurrent_calls_per_connection, 1)"
                        : "ChannelOptions::max_concurrent_calls allows (1)") != std::string::npos);
  // A call that merely ran out of time on the server says nothing of the limit.
  req.set_ms(500);
  auto slow = stub.Sleep(req, {.timeout = 100ms});
  CHECK(slow.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(slow.status().message().find("never sent") == std::string::npos);
}

TEST_CASE("a client that ignores SETTINGS gets RESOURCE_EXHAUSTED for calls over the limit",
          "[reliability][limits]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  ServerOptions so{.io_threads = 1};
  so.max_concurrent_calls_per_connection = 2;
  TestServer ts(listen, so);
  auto peer = RunLoop([&]() -> asio::awaitable<std::shared_ptr<RawPeer>> {
    auto [conn, peer] = co_await RawConnect(ts.uri);
    for (uint64_t id = 1; id <= 5; ++id) conn->Send(Bytes(SleepRequestFrame(id, 200)));
    co_await WaitUntil([&] { return peer->Frames(FrameType::kResponse).size() == 5; }, 10000ms);
    conn->Close();
    co_return peer;
  }());
  auto settings = peer->Frames(FrameType::kSettings);
  REQUIRE(settings.size() == 1);
  auto responses = peer->Frames(FrameType::kResponse);
  REQUIRE(responses.size() == 5);
  int ok = 0, exhausted = 0;
  for (const auto& h : responses) {
    if (h.status == 0) ++ok;
    if (h.status == static_cast<uint32_t>(StatusCode::kResourceExhausted)) ++exhausted;
  }
  CHECK(ok == 2);
  CHECK(exhausted == 3);
}

TEST_CASE("shutdown sends GOAWAY: running calls finish, new calls fail fast, no error storm",
          "[reliability][shutdown]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  auto ts =
      std::make_unique<TestServer>(listen, ServerOptions{.io_threads = 1, .drain_timeout = 5s});
  ChannelOptions co;
  co.reconnect_backoff_initial = 50ms;
  auto ch = Channel::ConnectBlocking(ts->uri, co);
  REQUIRE(ch.ok());
  std::atomic<int> ok{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 5; ++i) {
    callers.emplace_back([&] {
      TestService::BlockingStub stub(*ch);
      SleepRequest req;
      req.set_ms(800);
      if (stub.Sleep(req, {.timeout = 10s}).ok()) ++ok;
    });
  }
  REQUIRE(Eventually([&] { return ts->service.sleeping.load() == 5; }, 5000ms));
  std::thread stopper([&] { ts->server.Shutdown(); });
  // Once the GOAWAY is in, new calls fail at once with UNAVAILABLE instead of going to the
  // draining server or waiting.
  TestService::BlockingStub stub(*ch);
  Status late;
  const auto until = std::chrono::steady_clock::now() + 3s;
  do {
    std::this_thread::sleep_for(20ms);
    late = stub.Echo(EchoRequest(), {.timeout = 5s}).status();
  } while (late.ok() && std::chrono::steady_clock::now() < until);
  const auto t0 = std::chrono::steady_clock::now();
  auto again = stub.Echo(EchoRequest(), {.timeout = 5s});
  const auto fail_took = std::chrono::steady_clock::now() - t0;
  CHECK(late.code() == StatusCode::kUnavailable);
  CHECK_FALSE(again.ok());
  CHECK(again.status().code() == StatusCode::kUnavailable);
  CHECK(fail_took < 1s);  // fail fast, not after the 5 s deadline
  for (auto& t : callers) t.join();
  stopper.join();
  CHECK(ok == 5);  // every call running at shutdown finished normally
}

TEST_CASE("a channel reconnects after its server restarts; wait_for_ready calls ride it out",
          "[reliability][reconnect]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  auto ts =
      std::make_unique<TestServer>(listen, ServerOptions{.io_threads = 1, .drain_timeout = 1s});
  const std::string uri = ts->uri;  // the restarted server takes the same port
  ChannelOptions co;
  co.reconnect_backoff_initial = 50ms;
  co.reconnect_backoff_max = 300ms;
  auto ch = Channel::ConnectBlocking(uri, co);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  REQUIRE(stub.Echo(EchoRequest()).ok());

  ts.reset();  // the server goes away
  // Fail fast while it is down: UNAVAILABLE at once, not after the deadline.
  Status down;
  const auto until = std::chrono::steady_clock::now() + 3s;
  do {
    down = stub.Echo(EchoRequest(), {.timeout = 10s}).status();
  } while (down.ok() && std::chrono::steady_clock::now() < until);
  const auto t0 = std::chrono::steady_clock::now();
  auto fast = stub.Echo(EchoRequest(), {.timeout = 10s});
  CHECK(fast.status().code() == StatusCode::kUnavailable);
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);

  // A wait-for-ready call made while it is down succeeds once the server is back.
  std::atomic<bool> waited_ok{false};
  std::string waited_status;
  std::thread waiter([&] {
    EchoRequest req;
    req.set_payload("waited");
    auto r = stub.Echo(req, {.timeout = 20s, .wait_for_ready = true});
    waited_status = r.status().ToString();
    waited_ok = r.ok() && r->payload() == "waited";
  });
  std::this_thread::sleep_for(300ms);
  std::unique_ptr<TestServer> again;
  for (int i = 0; i < 50 && !again; ++i) {
    try {
      again = std::make_unique<TestServer>(uri, ServerOptions{.io_threads = 1});
    } catch (const std::exception&) {
      std::this_thread::sleep_for(100ms);  // the port may take a moment to be free again
    }
  }
  REQUIRE(again);
  waiter.join();
  INFO("wait_for_ready call: " << waited_status);
  CHECK(waited_ok);
  // And ordinary calls work again on the same channel.
  CHECK(stub.Echo(EchoRequest(), {.timeout = 5s}).ok());
}

TEST_CASE("server keepalive closes a silent client's connection and cancels its calls",
          "[reliability][keepalive]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  ServerOptions so{.io_threads = 1};
  so.keepalive_interval = 200ms;
  so.keepalive_timeout = 600ms;
  TestServer ts(listen, so);
  // A live client that answers pings stays connected through several intervals.
  auto live = Channel::ConnectBlocking(ts.uri);
  REQUIRE(live.ok());
  auto peer = RunLoop([&]() -> asio::awaitable<std::shared_ptr<RawPeer>> {
    // The raw peer never answers PING: to the server it is a client that stopped.
    auto [conn, peer] = co_await RawConnect(ts.uri);
    conn->Send(Bytes(SleepRequestFrame(1, 60000)));
    co_await WaitUntil([&] { return peer->closed; }, 10000ms);
    co_return peer;
  }());
  CHECK(peer->closed);
  CHECK(peer->Frames(FrameType::kPing).size() >= 1);
  // Its 60 s call was cancelled on the server when the connection went.
  CHECK(Eventually([&] { return ts.service.cancelled_seen.load() == 1; }, 5000ms));
  std::this_thread::sleep_for(1000ms);
  TestService::BlockingStub stub(*live);
  CHECK(stub.Echo(EchoRequest()).ok());
  CHECK(ts.server.connections() == 1);
}

TEST_CASE("a nested call inherits the handler's deadline", "[reliability][deadline]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  TestServer front(listen), back(listen);
  auto ch = Channel::ConnectBlocking(front.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  RelayRequest req;
  req.set_target(back.uri);
  auto r = stub.Relay(req, {.timeout = 3s});
  REQUIRE(r.ok());
  // The back server's handler saw a deadline no later than the caller's.
  CHECK(r->budget_ms() > 0);
  CHECK(r->budget_ms() <= 3000);

  // A nested call that would outlast the caller's deadline is cut off at it, and the back
  // server's handler is cancelled.
  req.set_sleep_ms(20000);
  const auto t0 = std::chrono::steady_clock::now();
  auto slow = stub.Relay(req, {.timeout = 700ms});
  CHECK(slow.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(Eventually([&] { return back.service.cancelled_seen.load() == 1; }, 5000ms));
}

TEST_CASE("garbage frames through a real transport close that connection only",
          "[reliability][errors]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  TestServer ts(listen);
  auto good = Channel::ConnectBlocking(ts.uri);
  REQUIRE(good.ok());
  TestService::BlockingStub stub(*good);

  FrameHeader unknown_type;
  unknown_type.type = FrameType::kRequest;
  std::string unknown = Frame(unknown_type, "");
  unknown[2] = static_cast<char>(200);
  FrameHeader md_past_end;
  md_past_end.type = FrameType::kRequest;
  md_past_end.metadata_bytes = 1000;
  std::string bad_version = Frame(FrameHeader{}, "");
  bad_version[1] = 9;
  const std::vector<std::pair<std::string, std::string>> attacks = {
      {"empty message", ""},
      {"shorter than a header", "hello"},
      {"bad magic", std::string(40, '\x42')},
      {"unknown frame type", unknown},
      {"unsupported version", bad_version},
      {"metadata past the end", Frame(md_past_end, "abc")},
  };
  for (const auto& [name, bytes] : attacks) {
    INFO(name);
    auto peer = RunLoop([&]() -> asio::awaitable<std::shared_ptr<RawPeer>> {
      auto [conn, peer] = co_await RawConnect(ts.uri);
      conn->Send(Bytes(bytes));
      co_await WaitUntil([&] { return peer->closed; }, 5000ms);
      co_return peer;
    }());
    CHECK(peer->closed);
    EchoRequest req;
    req.set_payload("after " + name);
    auto r = stub.Echo(req);
    REQUIRE(r.ok());
    CHECK(r->payload() == "after " + name);
  }

  // Bad call metadata and an unparsable request are answered with an error, not a close.
  auto peer = RunLoop([&]() -> asio::awaitable<std::shared_ptr<RawPeer>> {
    auto [conn, peer] = co_await RawConnect(ts.uri);
    FrameHeader h;
    h.type = FrameType::kRequest;
    h.method_id = MethodId("/rdmarpc.testing.TestService/Echo");
    h.call_id = 7;
    h.metadata_bytes = 3;
    conn->Send(Bytes(Frame(h, "\x01\x02\x03")));  // 3 bytes cannot hold a metadata entry
    h.call_id = 8;
    h.metadata_bytes = 0;
    conn->Send(Bytes(Frame(h, "\xff\xff\xff\xff")));  // not a valid EchoRequest
    co_await WaitUntil([&] { return peer->Frames(FrameType::kResponse).size() == 2; }, 5000ms);
    conn->Close();
    co_return peer;
  }());
  auto responses = peer->Frames(FrameType::kResponse);
  REQUIRE(responses.size() == 2);
  for (const auto& h : responses) {
    CHECK(h.status == static_cast<uint32_t>(StatusCode::kInvalidArgument));
  }
}

// Issue 11, item 14: connecting to a host name must not block the I/O thread while the name is
// looked up; every other channel on that thread keeps its calls moving. Hidden ([.]): it needs
// a name server that is slow on purpose, which the VM suite sets up (test/rdma_vm_test.sh: a
// resolv.conf pointing at a local UDP socket that never answers) and names a host to ask it
// about in $RDMARPC_TEST_SLOW_HOST. Asked for without that, it fails rather than pass untested.
TEST_CASE("a slow host-name lookup does not stall other channels on the same I/O thread",
          "[.][resolve]") {
  const char* slow_host = std::getenv("RDMARPC_TEST_SLOW_HOST");
  if (slow_host == nullptr || *slow_host == '\0') {
    FAIL(
        "RDMARPC_TEST_SLOW_HOST is not set: this case needs the slow name server of "
        "test/rdma_vm_test.sh");
  }
  // Host names are a network transport's: not inproc://.
  auto listen = GENERATE(from_range(ListenUris()));
  INFO("listen " << listen);
  TestServer ts(listen);
  auto ep = transport::ParseUri(ts.uri);
  REQUIRE(ep.ok());
  const std::string slow_uri = ts.uri.substr(0, ts.uri.find("://")) + "://" + slow_host + ":" +
                               std::to_string(ep.value().port);

  struct Outcome {
    Status lookup;           // the slow channel's connect
    long lookup_ms = 0;      // how long it took
    int calls = 0;           // calls the other channel finished meanwhile
    long worst_call_ms = 0;  // the slowest of them
    Status last;             // the other channel's last call
  };
  auto out = RunLoop([&]() -> asio::awaitable<Outcome> {
    Outcome o;
    // The busy channel and the slow connect share this coroutine's one-thread io_context.
    TestService::Stub stub(co_await MustConnect(ts.uri));
    bool looking_up = true, pinger_done = false;
    auto ex = co_await asio::this_coro::executor;
    asio::co_spawn(
        ex,
        [&]() -> asio::awaitable<void> {
          while (looking_up) {
            const auto t0 = std::chrono::steady_clock::now();
            auto r = co_await stub.Echo(EchoRequest(), {.timeout = 10s});
            const long ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - t0)
                                .count();
            o.last = r.status();
            if (!r.ok()) break;
            ++o.calls;
            o.worst_call_ms = std::max(o.worst_call_ms, ms);
          }
          pinger_done = true;
        },
        asio::detached);
    const auto t0 = std::chrono::steady_clock::now();
    ChannelOptions co;
    co.transport.connect_timeout_ms = 20000;
    auto slow = co_await Channel::Connect(slow_uri, co);
    o.lookup_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    o.lookup = slow.ok() ? Status() : slow.status();
    looking_up = false;
    // The last call in flight finishes before the stub and `o` go out of scope.
    co_await WaitUntil([&] { return pinger_done; }, 15000ms);
    co_return o;
  }());
  INFO("lookup took " << out.lookup_ms << " ms: " << out.lookup.ToString() << "; " << out.calls
                      << " calls meanwhile, the slowest " << out.worst_call_ms << " ms");
  // The lookup must really have been slow (else this case proves nothing) and must fail with
  // the resolver's answer, not hang.
  CHECK(out.lookup_ms >= 1000);
  CHECK(out.lookup.code() == StatusCode::kUnavailable);
  CHECK_THAT(out.lookup.message(), Catch::Contains("cannot resolve"));
  // Meanwhile the other channel kept going: calls finished all along, none waited for the
  // lookup.
  CHECK(out.last.ok());
  CHECK(out.calls >= 20);
  CHECK(out.worst_call_ms < out.lookup_ms / 2);
}

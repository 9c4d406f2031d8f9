// The channel's reconnector alone (rpc/internal/reconnector.h), over the in-process transport:
// the backoff's growth, jitter and cap; failed attempts retried until the server is back; no
// attempt once the channel no longer wants one or has cancelled. Channels reconnecting to real
// servers are in reliability_test and inproc_fault_test.
#include "rpc/internal/reconnector.h"

#include <boost/asio/ip/tcp.hpp>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "transport/factory.h"

using namespace rdmarpc;
using namespace rdmarpc::internal;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

// Stands in for the channel: records what the reconnector tells it.
struct Recorder final : ReconnectListener, std::enable_shared_from_this<Recorder> {
  Recorder(const transport::Executor& ex, std::string target,
           transport::Options options = transport::Options{})
      : reconnector(ex, std::move(target), std::move(options), 1ms, 4ms) {}

  bool WantsConnection() const override { return want; }
  void OnReconnected(std::shared_ptr<transport::Connection> c) override { conn = std::move(c); }
  void OnReconnectFailed(const transport::Error& e) override {
    errors.push_back(e.message);
    if (after_failure) after_failure();
  }
  void Schedule(std::chrono::milliseconds delay) { reconnector.Schedule(weak_from_this(), delay); }

  bool want = true;
  std::vector<std::string> errors;
  std::shared_ptr<transport::Connection> conn;
  std::function<void()> after_failure;
  Reconnector reconnector;
};

// A listener on `uri` that keeps what it accepts.
struct Accepting {
  Accepting(const std::string& uri, asio::io_context& ctx) {
    auto l = transport::Listen(
        uri, {ctx.get_executor()},
        [this](std::shared_ptr<transport::Connection> c) { accepted.push_back(std::move(c)); },
        transport::Options{});
    REQUIRE(l.ok());
    listener = std::move(l.value());
  }
  ~Accepting() {
    listener->Close();
    for (auto& c : accepted) c->Close();
  }
  std::unique_ptr<transport::Listener> listener;
  std::vector<std::shared_ptr<transport::Connection>> accepted;
};

// Runs `ctx` until `done` or five seconds pass.
template <class Done>
void RunUntil(asio::io_context& ctx, Done done) {
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  while (!done() && std::chrono::steady_clock::now() < give_up) {
    ctx.restart();
    ctx.run_for(5ms);
  }
}

}  // namespace

TEST_CASE("reconnect backoff grows 1.6x per failure with +-20% jitter up to its cap",
          "[reconnector]") {
  asio::io_context ctx;
  Reconnector r(ctx.get_executor(), "inproc://nowhere:1", transport::Options{}, 100ms, 1000ms);
  double backoff = 100;
  std::set<int64_t> at_cap;
  for (int i = 0; i < 30; ++i) {
    const auto delay = r.NextBackoff();
    INFO("attempt " << i << ": backoff " << backoff << " ms, delay " << delay.count() << " ms");
    CHECK(delay.count() >= static_cast<int64_t>(backoff * 0.8) - 1);
    CHECK(delay.count() <= static_cast<int64_t>(backoff * 1.2));
    if (backoff >= 1000) at_cap.insert(delay.count());
    backoff = std::min(1000.0, static_cast<double>(static_cast<int64_t>(backoff * 1.6)));
  }
  CHECK(at_cap.size() > 1);  // jittered, not one fixed delay: clients do not retry in lockstep
  r.ResetBackoff();          // after a connection worked: from the start again
  const auto first = r.NextBackoff();
  CHECK(first >= 79ms);
  CHECK(first <= 120ms);
}

TEST_CASE("failed reconnects are retried after the backoff until the server is back",
          "[reconnector]") {
  asio::io_context ctx;
  auto rec = std::make_shared<Recorder>(ctx.get_executor(), "inproc://reconnector-back:7");
  std::unique_ptr<Accepting> server;
  rec->after_failure = [&] {
    if (rec->errors.size() == 3)
      server = std::make_unique<Accepting>("inproc://reconnector-back:7", ctx);
  };
  rec->Schedule(0ms);
  // The server's end is accepted on a later turn of the loop than the client's connects.
  RunUntil(ctx, [&] { return rec->conn && server && !server->accepted.empty(); });
  REQUIRE(rec->conn);
  CHECK(rec->errors.size() == 3);  // three refusals, then the attempt after them connected
  CHECK(rec->errors[0].find("refused") != std::string::npos);
  CHECK(server->accepted.size() == 1);
  CHECK_FALSE(rec->conn->closed());
  rec->conn->Close();
}

TEST_CASE("no reconnect once the channel no longer wants one, or after Cancel", "[reconnector]") {
  asio::io_context ctx;
  Accepting server("inproc://reconnector-stop:8", ctx);
  auto rec = std::make_shared<Recorder>(ctx.get_executor(), "inproc://reconnector-stop:8");
  rec->want = false;  // e.g. the channel was closed, or is connecting already
  rec->Schedule(0ms);
  ctx.run_for(50ms);
  CHECK(server.accepted.empty());
  CHECK_FALSE(rec->conn);

  rec->want = true;
  rec->Schedule(20ms);
  rec->reconnector.Cancel();  // Channel::Close
  ctx.restart();
  ctx.run_for(100ms);
  CHECK(server.accepted.empty());
  CHECK_FALSE(rec->conn);

  rec->Schedule(0ms);  // and the same reconnector still connects when asked again
  RunUntil(ctx, [&] { return rec->conn && !server.accepted.empty(); });
  REQUIRE(rec->conn);
  CHECK(server.accepted.size() == 1);
  rec->conn->Close();
}

TEST_CASE("one attempt at a time: a reconnect asked for while one is in progress waits for it",
          "[reconnector]") {
  // A TCP peer that accepts and never answers the transport's handshake keeps an attempt in
  // progress (until the connect timeout): the state in which a second Schedule must not start a
  // second attempt. (inproc:// cannot show it: its connect ends within one turn.)
  asio::io_context ctx;
  asio::ip::tcp::acceptor silent(ctx, {asio::ip::make_address("127.0.0.1"), 0});
  std::vector<std::shared_ptr<asio::ip::tcp::socket>> accepted;
  std::function<void()> accept_next = [&] {
    auto s = std::make_shared<asio::ip::tcp::socket>(ctx);
    silent.async_accept(*s, [&, s](boost::system::error_code ec) {
      if (ec) return;
      accepted.push_back(s);
      accept_next();
    });
  };
  accept_next();
  transport::Options options;
  options.connect_timeout_ms = 10'000;  // far past the test: the attempt stays in progress
  auto rec = std::make_shared<Recorder>(
      ctx.get_executor(), "tcp://127.0.0.1:" + std::to_string(silent.local_endpoint().port()),
      options);
  rec->Schedule(0ms);
  RunUntil(ctx, [&] { return !accepted.empty(); });
  REQUIRE(accepted.size() == 1);
  rec->Schedule(0ms);  // e.g. a call that wants a connection, while the first attempt runs
  rec->Schedule(1ms);
  ctx.restart();
  ctx.run_for(200ms);
  CHECK(accepted.size() == 1);  // still the first attempt, and no other
  CHECK(rec->errors.empty());
  CHECK_FALSE(rec->conn);
  rec->reconnector.Cancel();  // ends the attempt in progress
  ctx.restart();
  ctx.run_for(50ms);
  silent.close();
  ctx.restart();
  ctx.run_for(10ms);
}

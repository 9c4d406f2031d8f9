// Shared fixtures for the integration tests: a server running TestService, and
// the list of transports to run each test over.
#pragma once

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rpc/rdmarpc.h"
#include "test/protos/test_service.rdmarpc.pb.h"

namespace rdmarpc::testing {

// `uris`, or only those of the scheme $RDMARPC_TEST_ONLY_SCHEME names when it is set.
inline std::vector<std::string> FilterScheme(std::vector<std::string> uris) {
  if (const char* only = std::getenv("RDMARPC_TEST_ONLY_SCHEME"); only && *only) {
    std::vector<std::string> keep;
    for (auto& u : uris) {
      if (u.rfind(std::string(only) + "://", 0) == 0) keep.push_back(u);
    }
    uris = keep;
  }
  return uris;
}
// Transports the integration suites run over: tcp always; rdma when $RDMARPC_TEST_RDMA_HOST
// names an address with an RDMA device (set by the Soft-RoCE VM suite, tools/vm/). Tests whose
// client and server are in this one process use ListenUrisInProcess, which adds inproc://.
inline std::vector<std::string> ListenUris() {
  std::vector<std::string> uris = {"tcp://127.0.0.1:0"};
  if (const char* host = std::getenv("RDMARPC_TEST_RDMA_HOST"); host && *host) {
    uris.push_back(std::string("rdma://") + host + ":0");
  }
  return FilterScheme(std::move(uris));
}
// ListenUris() and the in-process transport (transport/inproc/): for tests that keep the client
// and the server in this process (no child processes), over which the protocol runs without a
// network.
inline std::vector<std::string> ListenUrisInProcess() {
  std::vector<std::string> uris = ListenUris();
  uris.push_back("inproc://test:0");
  return FilterScheme(std::move(uris));
}

// `n` pseudo-random bytes determined by `seed`: payloads whose corruption a
// test can see.
inline std::string Pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x);
  }
  return s;
}

// Counts a handler as running while it lives (in a counter the tests poll).
struct Running {
  explicit Running(std::atomic<int>& n) : n(n) { ++n; }
  ~Running() { --n; }
  std::atomic<int>& n;
};

class TestServiceImpl final : public TestService::Service {
  // The "mode" metadata of Upload and Chat.
  struct StreamMode {
    bool stall = false;
    uint64_t stop_after = 0;  // 0 = never
    uint64_t probe_at = 0;    // Count: see probe_ran_after (0 = no probe)
    uint64_t delay_ms = 0;    // Upload: wait this long before reading ("delay:MS")
  };
  static StreamMode ModeOf(const ServerContext& ctx) {
    StreamMode mode;
    if (const std::string* m = ctx.FindMetadata("mode")) {
      if (*m == "stall") mode.stall = true;
      if (m->rfind("probe:", 0) == 0) mode.probe_at = std::stoull(m->substr(6));
      if (m->rfind("stop-after:", 0) == 0) mode.stop_after = std::stoull(m->substr(11));
      if (m->rfind("delay:", 0) == 0) mode.delay_ms = std::stoull(m->substr(6));
    }
    return mode;
  }
  static void Tally(const EchoRequest& m, UploadSummary& s) {
    if (m.seq() != s.count()) s.set_out_of_order(s.out_of_order() + 1);
    if (!m.payload().empty() && m.payload() != Pattern(m.payload().size(), m.seq())) {
      s.set_bad_payloads(s.bad_payloads() + 1);
    }
    s.set_bytes(s.bytes() + m.payload().size());
    s.set_count(s.count() + 1);
  }
  // Waits, polling, until the caller cancels (or its connection goes).
  static boost::asio::awaitable<void> UntilCancelled(ServerContext& ctx) {
    boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
    while (!ctx.cancelled()) {
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    }
  }
  // A handler that reads nothing (its caller's window fills) until the caller cancels.
  boost::asio::awaitable<Status> StallUntilCancelled(ServerContext& ctx) {
    co_await UntilCancelled(ctx);
    ++client_streams_cancelled;
    co_return Status(StatusCode::kCancelled, "cancelled while stalled");
  }

 public:
  boost::asio::awaitable<Status> Echo(ServerContext& ctx, const EchoRequest& req,
                                      EchoReply& reply) override {
    co_return EchoInline(ctx, req, reply);
  }
  Status EchoInline(ServerContext& ctx, const EchoRequest& req, EchoReply& reply) override {
    reply.set_payload(req.payload());
    reply.set_seq(req.seq());
    if (const std::string* m = ctx.FindMetadata("echo-meta")) reply.set_meta(*m);
    if (ctx.FindMetadata("echo-peer")) reply.set_meta(ctx.peer());
    reply.set_budget_ms(
        ctx.has_deadline()
            ? std::chrono::duration_cast<std::chrono::milliseconds>(ctx.remaining()).count()
            : -1);
    return Status();
  }
  boost::asio::awaitable<Status> Fail(ServerContext&, const FailRequest& req,
                                      google::protobuf::Empty&) override {
    co_return Status(static_cast<StatusCode>(req.code()), req.message());
  }
  Status FailInline(ServerContext&, const FailRequest& req, google::protobuf::Empty&) override {
    if (req.code() == 0xFFFF) throw std::runtime_error("inline boom");
    return Status(static_cast<StatusCode>(req.code()), req.message());
  }
  boost::asio::awaitable<Status> Throw(ServerContext&, const google::protobuf::Empty&,
                                       google::protobuf::Empty&) override {
    throw std::runtime_error("boom");
    co_return Status();
  }
  boost::asio::awaitable<Status> Sleep(ServerContext& ctx, const SleepRequest& req,
                                       google::protobuf::Empty&) override {
    const int now = ++sleeping;
    for (int m = max_sleeping.load(); now > m && !max_sleeping.compare_exchange_weak(m, now);) {
    }
    boost::asio::steady_timer t(co_await boost::asio::this_coro::executor,
                                std::chrono::milliseconds(req.ms()));
    if (req.ignore_cancel()) {
      // An empty cancellation slot: the caller's CANCEL does not reach this wait.
      co_await t.async_wait(boost::asio::bind_cancellation_slot(
          boost::asio::cancellation_slot(), boost::asio::as_tuple(boost::asio::use_awaitable)));
    } else {
      co_await t.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    }
    --sleeping;
    if (ctx.cancelled()) ++cancelled_seen;
    co_return Status();
  }
  // Sleep calls whose handler saw ServerContext::cancelled() when its timer returned.
  std::atomic<int> cancelled_seen{0};
  // Sleep calls running now, and the most that ever ran at once.
  std::atomic<int> sleeping{0}, max_sleeping{0};
  boost::asio::awaitable<Status> Relay(ServerContext& ctx, const RelayRequest& req,
                                       EchoReply& reply) override {
    auto ch = co_await Channel::Connect(req.target());
    if (!ch.ok()) co_return ch.status();
    TestService::Stub stub(*ch);
    CallOptions nested;
    nested.Inherit(ctx);
    if (req.sleep_ms() > 0) {
      SleepRequest sleep;
      sleep.set_ms(req.sleep_ms());
      auto r = co_await stub.Sleep(sleep, nested);
      co_return r.status();
    }
    auto r = co_await stub.Echo(EchoRequest(), nested);
    if (!r.ok()) co_return r.status();
    reply = *r;
    co_return Status();
  }
  boost::asio::awaitable<Status> Count(ServerContext& ctx, const CountRequest& req,
                                       ServerWriter<CountReply>& writer) override {
    Running running(streams_running);
    const uint64_t probe_at = ModeOf(ctx).probe_at;
    if (probe_at) probe_ran_after.store(-1);
    CountReply reply;
    for (uint64_t i = 0; i < req.count(); ++i) {
      if (probe_at && i == probe_at) {
        // Other work for this I/O thread, queued by the stream at its probe_at'th message: when
        // it runs tells how long the stream held the thread.
        const uint64_t base = stream_messages_sent.load();
        boost::asio::post(co_await boost::asio::this_coro::executor, [this, base] {
          probe_ran_after.store(static_cast<int64_t>(stream_messages_sent.load() - base));
        });
      }
      if (req.writable_first() && !co_await writer.Writable()) {
        ++streams_stopped;
        co_return Status(StatusCode::kCancelled, "stream stopped after " + std::to_string(i));
      }
      reply.set_seq(i);
      if (req.payload_bytes()) *reply.mutable_payload() = Pattern(req.payload_bytes(), i);
      stream_messages_built.fetch_add(1);
      if (!co_await writer.Write(reply)) {
        ++streams_stopped;
        co_return Status(StatusCode::kCancelled, "stream stopped after " + std::to_string(i));
      }
      stream_messages_sent.fetch_add(1);
    }
    if (req.block_after()) {
      co_await UntilCancelled(ctx);
      ++streams_stopped;
      co_return Status(StatusCode::kCancelled, "cancelled while blocked");
    }
    if (req.fail_code()) {
      co_return Status(static_cast<StatusCode>(req.fail_code()),
                       "failed after " + std::to_string(req.count()));
    }
    co_return Status();
  }
  boost::asio::awaitable<Status> Upload(ServerContext& ctx, ServerReader<EchoRequest>& reader,
                                        UploadSummary& summary) override {
    Running running(client_streams_running);
    const StreamMode mode = ModeOf(ctx);
    if (mode.stall) co_return co_await StallUntilCancelled(ctx);
    if (mode.delay_ms) {  // a handler busy before it reads: messages queue meanwhile
      boost::asio::steady_timer t(co_await boost::asio::this_coro::executor,
                                  std::chrono::milliseconds(mode.delay_ms));
      co_await t.async_wait(boost::asio::use_awaitable);
    }
    // Read into one reused message (Chat below reads the other form, a new message each).
    EchoRequest m;
    while (co_await reader.Read(m)) {
      Tally(m, summary);
      if (summary.count() == mode.stop_after) {
        co_return Status(StatusCode::kFailedPrecondition,
                         "stopped after " + std::to_string(mode.stop_after));
      }
    }
    if (ctx.cancelled()) ++client_streams_cancelled;
    co_return Status();
  }
  boost::asio::awaitable<Status> Chat(ServerContext& ctx,
                                      ServerReaderWriter<EchoRequest, EchoReply>& stream) override {
    Running running(client_streams_running);
    const StreamMode mode = ModeOf(ctx);
    if (mode.stall) co_return co_await StallUntilCancelled(ctx);
    UploadSummary seen;
    EchoReply reply;
    while (auto m = co_await stream.Read()) {
      Tally(*m, seen);
      reply.set_seq(m->seq());
      reply.set_payload(std::move(*m->mutable_payload()));
      if (!co_await stream.Write(reply)) co_return Status(StatusCode::kCancelled, "write failed");
      if (seen.count() == mode.stop_after) {
        co_return Status(StatusCode::kFailedPrecondition,
                         "stopped after " + std::to_string(mode.stop_after));
      }
    }
    if (ctx.cancelled()) {
      ++client_streams_cancelled;
      co_return Status(StatusCode::kCancelled, "cancelled");
    }
    if (seen.out_of_order() || seen.bad_payloads()) {
      co_return Status(StatusCode::kDataLoss, "messages out of order or corrupt");
    }
    // After the caller's half-close this direction is still open.
    reply.set_seq(seen.count());
    reply.clear_payload();
    reply.set_meta("bye");
    if (!co_await stream.Write(reply)) co_return Status(StatusCode::kCancelled, "write failed");
    co_return Status();
  }
  // Upload and Chat calls running now, and those that saw the caller cancel.
  std::atomic<int> client_streams_running{0}, client_streams_cancelled{0};

  // Count streams running now; those that ended because Write said the stream was over (or the
  // caller cancelled while blocked); messages written in all.
  std::atomic<int> streams_running{0}, streams_stopped{0};
  std::atomic<uint64_t> stream_messages_sent{0};
  std::atomic<uint64_t> stream_messages_built{0};  // Count: before each Write
  // Count with mode "probe:N": the messages it had written since its Nth when a handler it
  // posted then ran (-1: not yet).
  std::atomic<int64_t> probe_ran_after{-1};
  boost::asio::awaitable<Status> Block(ServerContext&, const SleepRequest& req,
                                       google::protobuf::Empty&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(req.ms()));
    co_return Status();
  }
};

// A server with TestService on one address, started on construction.
struct TestServer {
  explicit TestServer(const std::string& listen_uri, ServerOptions options = {.io_threads = 2})
      : server(options) {
    if (!server.AddService(service).ok()) throw std::runtime_error("AddService failed");
    auto bound = server.Listen(listen_uri);
    if (!bound.ok()) throw std::runtime_error("Listen failed: " + bound.status().ToString());
    uri = *bound;
    server.Start();
  }
  TestServiceImpl service;
  Server server;
  std::string uri;
};

// Connects or throws (for tests where a failed connect is not the subject).
inline boost::asio::awaitable<std::shared_ptr<Channel>> MustConnect(std::string uri,
                                                                    ChannelOptions o) {
  auto ch = co_await Channel::Connect(uri, o);
  if (!ch.ok()) throw std::runtime_error("connect failed: " + ch.status().ToString());
  co_return *ch;
}
// Not a default argument: GCC 12 destroys a coroutine's defaulted class-type argument twice.
inline boost::asio::awaitable<std::shared_ptr<Channel>> MustConnect(std::string uri) {
  return MustConnect(std::move(uri), ChannelOptions{});
}

// Waits on the current executor until `done()` holds or `limit` passes.
template <class F>
boost::asio::awaitable<bool> WaitUntil(F done, std::chrono::milliseconds limit) {
  boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) co_return false;
    t.expires_after(std::chrono::milliseconds(5));
    co_await t.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
  }
  co_return true;
}

// Waits until `count()` reaches `target` (true) for as long as it keeps going up: false once it
// has stood still for `stall`, or after `limit` in all. For checks that something goes on, not
// how fast: the RDMA suites run in an emulated guest that the host's own tests starve, where a
// stream can run ten times slower than usual with nothing wrong, while a lost wake-up stops it.
template <class F>
boost::asio::awaitable<bool> WaitForProgress(F count, uint64_t target,
                                             std::chrono::milliseconds stall,
                                             std::chrono::milliseconds limit) {
  boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
  const auto start = std::chrono::steady_clock::now();
  auto moved_at = start;
  uint64_t last = count();
  while (last < target) {
    const auto now = std::chrono::steady_clock::now();
    if (now - moved_at > stall || now - start > limit) co_return false;
    t.expires_after(std::chrono::milliseconds(5));
    co_await t.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    if (const uint64_t c = count(); c != last) {
      last = c;
      moved_at = std::chrono::steady_clock::now();
    }
  }
  co_return true;
}

// From plain (non-coroutine) test code: polls until `done()` holds (true) or `limit` passes
// (false). `done()` is called once per poll and never again after it held, so it may act (a
// connect attempt): calling it once more to report the result once failed a test whose second
// connect found the server full again.
template <class F>
bool Eventually(F done, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const bool last_try = std::chrono::steady_clock::now() >= until;
    if (done()) return true;
    if (last_try) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Runs `work` to completion on a fresh single-threaded io_context in this
// thread.
template <class T>
T RunLoop(boost::asio::awaitable<T> work) {
  boost::asio::io_context ioc(1);
  auto fut = boost::asio::co_spawn(ioc, std::move(work), boost::asio::use_future);
  ioc.run();
  return fut.get();
}

}  // namespace rdmarpc::testing

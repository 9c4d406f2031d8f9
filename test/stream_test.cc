// Server streams (issue 13), over every transport the environment offers: tcp:// and inproc:// on
// the host, and rdma:// in the Soft-RoCE VM (rdma_vm_test). Order and exactly-once delivery, the
// end status, flow control against a reader that stops, cancellation from either side, deadlines, a
// server that goes away mid-stream, large messages, many streams at once, and the blocking API.
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>

#include "test/test_util.h"

using namespace rdmarpc;
using namespace rdmarpc::testing;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

// Runs `work` on a fresh event-loop thread and waits for it.
template <class T>
T RunOnLoop(EventLoopThread& loop, asio::awaitable<T> work) {
  return asio::co_spawn(loop.executor(), std::move(work), asio::use_future).get();
}

CountRequest Count(uint64_t n, uint32_t payload = 0) {
  CountRequest r;
  r.set_count(n);
  r.set_payload_bytes(payload);
  return r;
}

// What a stream's window lets a writer of 1 KiB messages have outstanding (256 KiB of ~1.06 KiB
// frames), and no more.
constexpr uint64_t kWindowOf1KiBMessages = kStreamWindowBytes / (1024 + kFrameHeaderBytes) + 2;

}  // namespace

TEST_CASE("a server stream delivers every message once, in order, then OK", "[stream][core]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  EventLoopThread loop;
  const uint64_t n = 1'000'000;
  struct Out {
    uint64_t got = 0;
    uint64_t out_of_order = 0;
    Status status;
  };
  Out out = RunOnLoop(loop, [&]() -> asio::awaitable<Out> {
    Out o;
    auto ch = co_await Channel::Connect(ts.uri);
    if (!ch.ok()) {
      o.status = ch.status();
      co_return o;
    }
    TestService::Stub stub(*ch);
    auto call = co_await stub.Count(Count(n));
    while (auto m = co_await call.Read()) {
      if (m->seq() != o.got) ++o.out_of_order;
      ++o.got;
    }
    o.status = co_await call.Finish();
    co_return o;
  }());
  INFO(out.status.ToString());
  CHECK(out.status.ok());
  CHECK(out.got == n);
  CHECK(out.out_of_order == 0);
}

TEST_CASE("a stream's payloads arrive intact, 16 MiB messages included", "[stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  for (uint32_t size : {100u, 70'000u, 16u << 20}) {
    INFO("payload " << size);
    const uint64_t n = size > (1u << 20) ? 4 : 50;
    auto call = stub.Count(Count(n, size));
    uint64_t got = 0;
    while (auto m = call.Read()) {
      CHECK(m->seq() == got);
      CHECK(m->payload() == Pattern(size, got));
      ++got;
    }
    CHECK(got == n);
    CHECK(call.Finish().ok());
  }
}

TEST_CASE("Read into a reused message: each message intact whatever came before it", "[stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  // Sizes that shrink and grow, so that a message lands in a buffer (ours, and the stream's
  // reused ones) that held a larger or smaller one before.
  const std::vector<uint32_t> sizes = {100, 0, 70'000, 5, 3'000, 0, 100};
  const uint64_t n = 40;  // messages per stream
  SECTION("blocking") {
    auto ch = Channel::ConnectBlocking(ts.uri);
    REQUIRE(ch.ok());
    TestService::BlockingStub stub(*ch);
    CountReply m;  // one message for every stream
    for (uint32_t size : sizes) {
      INFO("payload " << size);
      auto call = stub.Count(Count(n, size));
      uint64_t got = 0;
      while (call.Read(m)) {
        CHECK(m.seq() == got);
        CHECK(m.payload() == Pattern(size, got));
        ++got;
      }
      CHECK(got == n);
      CHECK(call.Finish().ok());
    }
  }
  SECTION("a coroutine on the channel's thread, and on another") {
    EventLoopThread loop;
    for (bool own_thread : {false, true}) {
      INFO((own_thread ? "channel on a thread of its own" : "channel on the reader's loop"));
      const std::string problems = RunOnLoop(loop, [&]() -> asio::awaitable<std::string> {
        std::shared_ptr<Channel> ch;
        if (own_thread) {
          auto c = Channel::ConnectBlocking(ts.uri);
          if (!c.ok()) co_return c.status().ToString();
          ch = *c;
        } else {
          ch = co_await MustConnect(ts.uri);
        }
        TestService::Stub stub(ch);
        CountReply m;
        std::string p;
        for (uint32_t size : sizes) {
          auto call = co_await stub.Count(Count(n, size));
          uint64_t got = 0;
          while (co_await call.Read(m)) {
            if (m.seq() != got || m.payload() != Pattern(size, got)) {
              p += " size " + std::to_string(size) + " message " + std::to_string(got);
            }
            ++got;
          }
          if (got != n) p += " size " + std::to_string(size) + ": got " + std::to_string(got);
          if (Status s = co_await call.Finish(); !s.ok()) p += " " + s.ToString();
        }
        co_return p;
      }());
      CHECK(problems == "");
    }
  }
}

TEST_CASE("a handler's error ends the stream after its messages", "[stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  CountRequest req = Count(3);
  req.set_fail_code(static_cast<uint32_t>(StatusCode::kNotFound));
  auto call = TestService::BlockingStub(*ch).Count(req);
  int got = 0;
  while (call.Read()) ++got;
  CHECK(got == 3);
  Status s = call.Finish();
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.message() == "failed after 3");
}

TEST_CASE("a reader that stops reading holds back the server: memory stays bounded",
          "[stream][flow]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  // 100,000 messages of 1 KiB (100 MiB) offered; the reader takes one and stops.
  auto call = TestService::BlockingStub(*ch).Count(Count(100'000, 1024));
  REQUIRE(call.Read().has_value());
  std::this_thread::sleep_for(1s);
  const uint64_t sent = ts.service.stream_messages_sent.load();
  std::printf(
      "stream flow control over %s: a reader that took 1 message held the server at %llu "
      "messages written (%llu KiB), window %llu KiB\n",
      listen.c_str(), static_cast<unsigned long long>(sent),
      static_cast<unsigned long long>(sent * (1024 + kFrameHeaderBytes) / 1024),
      static_cast<unsigned long long>(kStreamWindowBytes / 1024));
  CHECK(sent <= kWindowOf1KiBMessages);
  CHECK(ts.service.streams_running == 1);
  // Reading again, the reader gets everything, in order.
  uint64_t got = 1;
  while (auto m = call.Read()) {
    if (m->seq() != got) break;
    ++got;
  }
  CHECK(got == 100'000);
  CHECK(call.Finish().ok());
}

// ServerWriter::Writable: a handler that builds (copies) each message only once it can be sent
// holds none while its reader does not read, and hears the end of the stream from it.
TEST_CASE("Writable waits out a full window, so that nothing is built meanwhile; false at the end",
          "[stream][flow]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  CountRequest req = Count(100'000, 1024);
  req.set_writable_first(true);
  auto call = TestService::BlockingStub(*ch).Count(req);
  REQUIRE(call.Read().has_value());
  std::this_thread::sleep_for(1s);
  // Held back by the window as with Write alone, but with no message built and waiting: a
  // Writable that did not wait would let the handler build the next one and wait in Write.
  const uint64_t sent = ts.service.stream_messages_sent.load();
  const uint64_t built = ts.service.stream_messages_built.load();
  CHECK(sent <= kWindowOf1KiBMessages);
  CHECK(built == sent);
  // Reading on, every message comes, in order.
  for (uint64_t i = 1; i < 1000; ++i) {
    auto m = call.Read();
    REQUIRE(m.has_value());
    CHECK(m->seq() == i);
  }
  // The caller cancels while the handler waits in Writable: it answers false.
  std::this_thread::sleep_for(200ms);
  call.Cancel();
  CHECK(Eventually([&] { return ts.service.streams_running == 0; }, 10000ms));
  CHECK(ts.service.streams_stopped == 1);
  CHECK(TestService::BlockingStub(*ch).Echo(EchoRequest(), {.timeout = 10s}).ok());
}

TEST_CASE("the caller cancels a stream mid-way: the server's writer stops at once",
          "[stream][cancel]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  SECTION("Cancel()") {
    auto call = stub.Count(Count(1'000'000'000));
    for (int i = 0; i < 10; ++i) REQUIRE(call.Read().has_value());
    // Let the window fill: messages wait in the channel, unread, when Cancel() comes.
    std::this_thread::sleep_for(200ms);
    call.Cancel();
    // They go with the call: the next Read ends (it handed them out before).
    CHECK_FALSE(call.Read().has_value());
    CHECK(call.Finish().code() == StatusCode::kCancelled);
  }
  SECTION("dropping the reader") {
    auto call = stub.Count(Count(1'000'000'000));
    for (int i = 0; i < 10; ++i) REQUIRE(call.Read().has_value());
  }
  SECTION("cancelling a Read that waits") {
    EventLoopThread loop;
    Status s = RunOnLoop(loop, [&]() -> asio::awaitable<Status> {
      TestService::Stub async_stub(*ch);
      CountRequest req = Count(1);
      req.set_block_after(true);
      auto call = co_await async_stub.Count(req);
      co_await call.Read();  // the one message; the next Read waits
      asio::cancellation_signal cancel;
      asio::steady_timer t(co_await asio::this_coro::executor, 100ms);
      t.async_wait(
          [&](boost::system::error_code) { cancel.emit(asio::cancellation_type::terminal); });
      auto m =
          co_await asio::co_spawn(co_await asio::this_coro::executor, call.Read(),
                                  asio::bind_cancellation_slot(cancel.slot(), asio::use_awaitable));
      if (m) co_return Status(StatusCode::kInternal, "a message after the cancel");
      co_return co_await call.Finish();
    }());
    CHECK(s.code() == StatusCode::kCancelled);
  }
  // The server's handler learns: its Write returns false (or its wait sees the cancel).
  CHECK(Eventually([&] { return ts.service.streams_running == 0; }, 10000ms));
  CHECK(ts.service.streams_stopped == 1);
  // The channel is fine afterwards.
  CHECK(stub.Echo(EchoRequest(), {.timeout = 10s}).ok());
}

TEST_CASE("a stream's deadline covers the whole stream", "[stream][deadline]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  CountRequest req = Count(5);
  req.set_block_after(true);
  const auto start = std::chrono::steady_clock::now();
  auto call = TestService::BlockingStub(*ch).Count(req, {.timeout = 300ms});
  int got = 0;
  while (call.Read()) ++got;
  CHECK(got == 5);
  Status s = call.Finish();
  CHECK(s.code() == StatusCode::kDeadlineExceeded);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(Eventually([&] { return ts.service.streams_running == 0; }, 10000ms));
}

TEST_CASE("a server that goes away mid-stream ends it with UNAVAILABLE", "[stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  auto ts = std::make_unique<TestServer>(listen);
  ChannelOptions o;
  o.reconnect = false;
  auto ch = Channel::ConnectBlocking(ts->uri, o);
  REQUIRE(ch.ok());
  CountRequest req = Count(2);
  req.set_block_after(true);
  auto call = TestService::BlockingStub(*ch).Count(req, {.timeout = 30s});
  REQUIRE(call.Read().has_value());
  REQUIRE(call.Read().has_value());
  std::thread stop([&] { ts.reset(); });
  while (call.Read()) {
  }
  Status s = call.Finish();
  stop.join();
  INFO(s.ToString());
  CHECK_FALSE(s.ok());
  CHECK((s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kCancelled));
}

TEST_CASE("1,000 streams at once on one channel", "[stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  EventLoopThread loop;
  const int kStreams = 1000;
  const uint64_t kEach = 100;
  struct Out {
    int ok = 0;
    uint64_t messages = 0;
    std::string error;
  };
  Out out = RunOnLoop(loop, [&]() -> asio::awaitable<Out> {
    Out o;
    auto ch = co_await Channel::Connect(ts.uri);
    if (!ch.ok()) {
      o.error = ch.status().ToString();
      co_return o;
    }
    TestService::Stub stub(*ch);
    std::vector<ClientReader<CountReply>> calls;
    for (int i = 0; i < kStreams; ++i) calls.push_back(co_await stub.Count(Count(kEach)));
    // Read them round-robin, a message at a time, so that all are open together.
    std::vector<uint64_t> got(kStreams, 0);
    bool any = true;
    while (any) {
      any = false;
      for (int i = 0; i < kStreams; ++i) {
        if (got[i] == kEach) continue;
        auto m = co_await calls[i].Read();
        if (!m || m->seq() != got[i]) {
          got[i] = kEach;  // stop reading this one; Finish says why
          continue;
        }
        ++got[i];
        ++o.messages;
        any = true;
      }
    }
    for (auto& c : calls) {
      Status s = co_await c.Finish();
      if (s.ok()) {
        ++o.ok;
      } else if (o.error.empty()) {
        o.error = s.ToString();
      }
    }
    co_return o;
  }());
  INFO(out.error);
  CHECK(out.ok == kStreams);
  CHECK(out.messages == kStreams * kEach);
}

TEST_CASE("a streaming method the server does not serve is named in UNIMPLEMENTED", "[stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  // A server without TestService: its Count is unknown there.
  Server server(ServerOptions{.io_threads = 1});
  auto bound = server.Listen(listen);
  REQUIRE(bound.ok());
  server.Start();
  auto ch = Channel::ConnectBlocking(*bound);
  REQUIRE(ch.ok());
  auto call = TestService::BlockingStub(*ch).Count(Count(1));
  CHECK_FALSE(call.Read().has_value());
  Status s = call.Finish();
  CHECK(s.code() == StatusCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("rdmarpc.testing.TestService/Count"));
}

// --- client streams and bidirectional streams -------------------------------------------------

namespace {

EchoRequest Numbered(uint64_t seq, uint32_t payload = 0) {
  EchoRequest r;
  r.set_seq(seq);
  if (payload) r.set_payload(Pattern(payload, seq));
  return r;
}

CallOptions WithMode(std::string mode, std::chrono::milliseconds timeout = 60s) {
  CallOptions o;
  o.timeout = timeout;
  o.metadata.emplace_back("mode", std::move(mode));
  return o;
}

}  // namespace

TEST_CASE("a client stream delivers every message once, in order, and the reply comes back",
          "[stream][client][core]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  EventLoopThread loop;
  const uint64_t n = 1'000'000;
  struct Out {
    uint64_t written = 0;
    Result<UploadSummary> summary;
  };
  Out out = RunOnLoop(loop, [&]() -> asio::awaitable<Out> {
    Out o;
    TestService::Stub stub(co_await MustConnect(ts.uri));
    auto call = co_await stub.Upload();
    EchoRequest m;
    for (uint64_t i = 0; i < n; ++i) {
      m.set_seq(i);
      if (!co_await call.Write(m)) break;
      ++o.written;
    }
    o.summary = co_await call.Finish();
    co_return o;
  }());
  INFO(out.summary.status().ToString());
  REQUIRE(out.summary.ok());
  CHECK(out.written == n);
  CHECK(out.summary->count() == n);
  CHECK(out.summary->out_of_order() == 0);
}

TEST_CASE("a client stream message over the message limit ends the stream with RESOURCE_EXHAUSTED",
          "[stream][client]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  ChannelOptions options;
  options.transport.max_message_bytes = 4096;
  auto ch = Channel::ConnectBlocking(ts.uri, options);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  auto call = stub.Upload({.timeout = 10s});
  REQUIRE(call.Write(Numbered(0, 100)));
  CHECK_FALSE(call.Write(Numbered(1, 8192)));
  CHECK_FALSE(call.Write(Numbered(2, 100)));  // the stream is over
  auto summary = call.Finish();
  CHECK(summary.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(summary.status().message(), Catch::Contains("exceeds the message limit of 4096"));
  // The channel serves on.
  CHECK(stub.Echo(EchoRequest(), {.timeout = 5s}).ok());
}

TEST_CASE("a client stream carries large messages intact, 16 MiB included", "[stream][client]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  for (uint32_t size : {100u, 70'000u, 16u << 20}) {
    INFO("payload " << size);
    const uint64_t n = size > (1u << 20) ? 4 : 50;
    auto call = stub.Upload({.timeout = 120s});
    for (uint64_t i = 0; i < n; ++i) REQUIRE(call.Write(Numbered(i, size)));
    auto summary = call.Finish();
    INFO(summary.status().ToString());
    REQUIRE(summary.ok());
    CHECK(summary->count() == n);
    CHECK(summary->bad_payloads() == 0);
    CHECK(summary->bytes() == n * size);
  }
}

TEST_CASE("a bidirectional stream echoes in order, both ways at once", "[stream][bidi][core]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  EventLoopThread loop;
  const uint64_t n = 100'000;
  struct Out {
    uint64_t written = 0, read = 0, out_of_order = 0;
    bool bye = false, writer_done = false;
    Status status;
  };
  // A writer coroutine and a reader coroutine on one call, as a chat client would run them.
  Out out = RunOnLoop(loop, [&]() -> asio::awaitable<Out> {
    auto o = std::make_shared<Out>();
    TestService::Stub stub(co_await MustConnect(ts.uri));
    auto call = std::make_shared<ClientReaderWriter<EchoRequest, EchoReply>>(
        co_await stub.Chat({.timeout = 120s}));
    auto ex = co_await asio::this_coro::executor;
    asio::co_spawn(
        ex,
        [call, o, n]() -> asio::awaitable<void> {
          for (uint64_t i = 0; i < n; ++i) {
            if (!co_await call->Write(Numbered(i, 16))) break;
            ++o->written;
          }
          co_await call->WritesDone();
          o->writer_done = true;
        },
        asio::detached);
    while (auto m = co_await call->Read()) {
      if (m->meta() == "bye") {
        o->bye = m->seq() == n;
        continue;
      }
      if (m->seq() != o->read || m->payload() != Pattern(16, m->seq())) ++o->out_of_order;
      ++o->read;
    }
    // Named, not a temporary inside the co_await: GCC 12 destroyed that temporary closure (and
    // its copy of `o`) twice, freeing `*o` under this coroutine (ASan: heap-use-after-free).
    auto writer_done = [o] { return o->writer_done; };
    co_await WaitUntil(writer_done, 10000ms);
    o->status = co_await call->Finish();
    co_return *o;
  }());
  INFO(out.status.ToString());
  CHECK(out.status.ok());
  CHECK(out.written == n);
  CHECK(out.read == n);
  CHECK(out.out_of_order == 0);
  CHECK(out.bye);
}

TEST_CASE("half-close orders: the server may write after it, end before it, or never see it",
          "[stream][bidi]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  SECTION("all writes, half-close, then all reads") {
    auto call = stub.Chat({.timeout = 30s});
    for (uint64_t i = 0; i < 100; ++i) REQUIRE(call.Write(Numbered(i, 8)));
    REQUIRE(call.WritesDone());
    CHECK_FALSE(call.Write(Numbered(100)));  // nothing goes after the half-close
    uint64_t read = 0;
    bool bye = false;
    while (auto m = call.Read()) {
      if (m->meta() == "bye") {
        bye = true;
        CHECK(m->seq() == 100);
      } else {
        CHECK(m->seq() == read++);
      }
    }
    CHECK(read == 100);
    CHECK(bye);
    CHECK(call.Finish().ok());
  }
  SECTION("one write, one read, in turn") {
    auto call = stub.Chat({.timeout = 30s});
    for (uint64_t i = 0; i < 100; ++i) {
      REQUIRE(call.Write(Numbered(i)));
      auto m = call.Read();
      REQUIRE(m.has_value());
      CHECK(m->seq() == i);
    }
    REQUIRE(call.WritesDone());
    auto bye = call.Read();
    REQUIRE(bye.has_value());
    CHECK(bye->meta() == "bye");
    CHECK_FALSE(call.Read().has_value());
    CHECK(call.Finish().ok());
  }
  SECTION("Finish without WritesDone half-closes") {
    auto call = stub.Chat({.timeout = 30s});
    REQUIRE(call.Write(Numbered(0)));
    CHECK(call.Finish().ok());
  }
  SECTION("the server ends first: the client's writes stop, Finish has its status") {
    auto call = stub.Chat(WithMode("stop-after:3", 30s));
    uint64_t written = 0;
    // The server stops reading after 3; the rest of the window is taken, then Write fails.
    while (written < 1'000'000 && call.Write(Numbered(written, 1024))) ++written;
    CHECK(written >= 3);
    CHECK(written < 1'000'000);
    Status s = call.Finish();
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK(s.message() == "stopped after 3");
  }
  SECTION("a client-streaming server answers before the client is done") {
    auto call = stub.Upload(WithMode("stop-after:5", 30s));
    uint64_t written = 0;
    while (written < 1'000'000 && call.Write(Numbered(written, 1024))) ++written;
    CHECK(written >= 5);
    auto r = call.Finish();
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
  }
  CHECK(Eventually([&] { return ts.service.client_streams_running == 0; }, 10000ms));
  CHECK(stub.Echo(EchoRequest(), {.timeout = 10s}).ok());
}

TEST_CASE("a server that stops reading holds the client's writer back: memory stays bounded",
          "[stream][client][flow]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  EventLoopThread loop;
  struct Out {
    uint64_t written = 0;
    bool blocked = false;
    Status status;
  };
  Out out = RunOnLoop(loop, [&]() -> asio::awaitable<Out> {
    Out o;
    TestService::Stub stub(co_await MustConnect(ts.uri));
    auto call = co_await stub.Upload(WithMode("stall"));
    auto ex = co_await asio::this_coro::executor;
    EchoRequest m = Numbered(0, 1024);
    for (;;) {
      // A Write that has not returned in a second is held back by the window.
      asio::cancellation_signal cancel;
      asio::steady_timer t(ex, 1s);
      t.async_wait([&](boost::system::error_code ec) {
        if (!ec) cancel.emit(asio::cancellation_type::terminal);
      });
      bool ok = co_await asio::co_spawn(
          ex, call.Write(m), asio::bind_cancellation_slot(cancel.slot(), asio::use_awaitable));
      t.cancel();
      if (!ok) {
        o.blocked = true;
        break;
      }
      if (++o.written > 100'000) break;
    }
    o.status = (co_await call.Finish()).status();
    co_return o;
  }());
  std::printf(
      "client stream flow control over %s: a server that read nothing held the writer at %llu "
      "messages (%llu KiB), window %llu KiB\n",
      listen.c_str(), static_cast<unsigned long long>(out.written),
      static_cast<unsigned long long>(out.written * (1024 + kFrameHeaderBytes) / 1024),
      static_cast<unsigned long long>(kStreamWindowBytes / 1024));
  CHECK(out.blocked);
  CHECK(out.written <= kWindowOf1KiBMessages);
  CHECK(out.status.code() == StatusCode::kCancelled);  // the cancelled Write ended the call
  CHECK(Eventually([&] { return ts.service.client_streams_running == 0; }, 10000ms));
  CHECK(ts.service.client_streams_cancelled == 1);
}

TEST_CASE("either side cancels a client stream mid-way; the other sees it at once",
          "[stream][client][cancel]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  TestService::BlockingStub stub(*ch);
  SECTION("the client's Cancel() while the server reads") {
    auto call = stub.Chat({.timeout = 60s});
    for (uint64_t i = 0; i < 10; ++i) REQUIRE(call.Write(Numbered(i)));
    REQUIRE(call.Read().has_value());
    call.Cancel();
    CHECK_FALSE(call.Write(Numbered(10)));
    CHECK(call.Finish().code() == StatusCode::kCancelled);
    CHECK(Eventually([&] { return ts.service.client_streams_cancelled == 1; }, 10000ms));
  }
  SECTION("the client's Cancel() from another thread wakes a blocked Read") {
    auto call = stub.Chat(WithMode("stall"));
    REQUIRE(call.Write(Numbered(0)));
    std::thread canceller([&] {
      std::this_thread::sleep_for(200ms);
      call.Cancel();
    });
    const auto start = std::chrono::steady_clock::now();
    CHECK_FALSE(call.Read().has_value());
    canceller.join();
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    CHECK(call.Finish().code() == StatusCode::kCancelled);
  }
  SECTION("dropping the writer") {
    auto call = stub.Upload({.timeout = 60s});
    REQUIRE(call.Write(Numbered(0)));
  }
  SECTION("the deadline passes while the client still writes") {
    auto call = stub.Upload(WithMode("stall", 300ms));
    uint64_t written = 0;
    const auto start = std::chrono::steady_clock::now();
    while (written < 1'000'000 && call.Write(Numbered(written, 1024))) ++written;
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    CHECK(call.Finish().status().code() == StatusCode::kDeadlineExceeded);
  }
  // The server's handler learns (its Read ends, ServerContext::cancelled()), and nothing is
  // left running there.
  CHECK(Eventually([&] { return ts.service.client_streams_running == 0; }, 10000ms));
  CHECK(stub.Echo(EchoRequest(), {.timeout = 10s}).ok());
}

TEST_CASE("a server that goes away mid client stream ends it with UNAVAILABLE",
          "[stream][client]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  auto ts = std::make_unique<TestServer>(listen);
  ChannelOptions o;
  o.reconnect = false;
  auto ch = Channel::ConnectBlocking(ts->uri, o);
  REQUIRE(ch.ok());
  auto call = TestService::BlockingStub(*ch).Chat(WithMode("stall", 30s));
  REQUIRE(call.Write(Numbered(0)));
  std::thread stop([&] { ts.reset(); });
  while (call.Read()) {
  }
  Status s = call.Finish();
  stop.join();
  INFO(s.ToString());
  CHECK((s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kCancelled));
}

TEST_CASE("1,000 bidirectional streams at once on one channel", "[stream][bidi]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  TestServer ts(listen);
  EventLoopThread loop;
  const int kStreams = 1000;
  const uint64_t kEach = 20;
  struct Out {
    int ok = 0;
    uint64_t echoed = 0;
    std::string error;
  };
  Out out = RunOnLoop(loop, [&]() -> asio::awaitable<Out> {
    Out o;
    TestService::Stub stub(co_await MustConnect(ts.uri));
    std::vector<ClientReaderWriter<EchoRequest, EchoReply>> calls;
    for (int i = 0; i < kStreams; ++i) calls.push_back(co_await stub.Chat({.timeout = 120s}));
    // Round-robin, a message each way at a time, so that all are open together.
    for (uint64_t k = 0; k < kEach; ++k) {
      for (auto& c : calls) co_await c.Write(Numbered(k));
      for (auto& c : calls) {
        auto m = co_await c.Read();
        if (m && m->seq() == k) ++o.echoed;
      }
    }
    for (auto& c : calls) {
      Status s = co_await c.Finish();
      if (s.ok()) {
        ++o.ok;
      } else if (o.error.empty()) {
        o.error = s.ToString();
      }
    }
    co_return o;
  }());
  INFO(out.error);
  CHECK(out.ok == kStreams);
  CHECK(out.echoed == kStreams * kEach);
}

TEST_CASE("a method called as the wrong kind gets UNIMPLEMENTED naming both kinds",
          "[stream][kinds]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  TestServer ts(listen);
  auto ch = Channel::ConnectBlocking(ts.uri);
  REQUIRE(ch.ok());
  // A client built from a .proto where Chat is unary.
  static constexpr MethodInfo kChatAsUnary{"/rdmarpc.testing.TestService/Chat",
                                           MethodId("/rdmarpc.testing.TestService/Chat")};
  EchoRequest req;
  EchoReply reply;
  Status s = (*ch)->Run((*ch)->Call(kChatAsUnary, req, reply, {.timeout = 10s}));
  CHECK(s.code() == StatusCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("bidirectional-streaming on this server") &&
                              Catch::Contains("called it as unary"));
  // And the other way: Echo opened as a bidirectional stream.
  static constexpr MethodInfo kEchoAsBidi{"/rdmarpc.testing.TestService/Echo",
                                          MethodId("/rdmarpc.testing.TestService/Echo"),
                                          MethodKind::kBidiStreaming};
  ClientReaderWriter<EchoRequest, EchoReply> call(
      (*ch)->Run((*ch)->OpenStream(kEchoAsBidi, {.timeout = 10s})));
  Status bidi = (*ch)->Run(call.Finish());
  CHECK(bidi.code() == StatusCode::kUnimplemented);
  CHECK_THAT(bidi.message(), Catch::Contains("unary on this server"));
}

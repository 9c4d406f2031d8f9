// A hostile or broken server, seen from the client: a channel connected to a peer that speaks
// the transport and the frame format but answers what each test scripts -- replies that do not
// parse, forged and repeated call ids, garbage frames, streams sent past their window, replies
// over the client's size limit, status codes nobody defined, an oversized GOAWAY, no SETTINGS at
// all. Whatever the server does, the caller gets a Status that says what happened, the client's
// memory stays bounded, and the channel serves the next call (reconnecting where it had to drop
// the connection). Each case runs over every transport of ListenUrisInProcess() (tcp and inproc
// on the host; rdma in the Soft-RoCE VM suite, test/rdma_vm_test.sh).
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rpc/event_loop.h"
#include "rpc/internal/frame.h"
#include "test/random_util.h"
#include "test/raw_peer.h"
#include "test/test_util.h"
#include "transport/factory.h"

namespace asio = boost::asio;
using namespace rdmarpc;
using namespace rdmarpc::testing;
using namespace std::chrono_literals;

namespace {

// A request as the scripted server saw it.
struct SeenRequest {
  FrameHeader header;
  std::string payload;
};

// What a test scripts: called on the server's loop thread for each REQUEST frame, with the
// connection to answer on.
using Script = std::function<void(transport::Connection&, const SeenRequest&)>;

void SendFrame(transport::Connection& conn, const FrameHeader& h, const std::string& payload) {
  conn.Send(Bytes(Frame(h, payload)));
}

FrameHeader ResponseTo(const SeenRequest& r, StatusCode code = StatusCode::kOk) {
  FrameHeader h;
  h.type = FrameType::kResponse;
  h.call_id = r.header.call_id;
  h.status = static_cast<uint32_t>(code);
  return h;
}

// A serialized EchoReply carrying `payload`: what the scripts answer with, honestly or not.
std::string EchoReplyBytes(const std::string& payload) {
  EchoReply reply;
  reply.set_payload(payload);
  return reply.SerializeAsString();
}

// The reply a well-behaved Echo server would send. (No Catch assertions on the server's thread:
// Catch is not thread-safe. A request that does not parse gets no answer; its call fails.)
void AnswerEcho(transport::Connection& conn, const SeenRequest& r) {
  EchoRequest req;
  if (!req.ParseFromString(r.payload)) return;
  SendFrame(conn, ResponseTo(r), EchoReplyBytes(req.payload()));
}

// The request's EchoRequest payload (empty when it is not one).
std::string EchoPayload(const SeenRequest& r) {
  EchoRequest req;
  return req.ParseFromString(r.payload) ? req.payload() : std::string();
}

// A server on its own loop thread that runs `script` for every request. Sends SETTINGS on each
// accepted connection unless `send_settings` is false.
class ScriptedServer {
 public:
  ScriptedServer(const std::string& listen_uri, Script script, bool send_settings = true)
      : state_(std::make_shared<State>()) {
    state_->script = std::move(script);
    state_->send_settings = send_settings;
    std::shared_ptr<State> state = state_;
    auto l = transport::Listen(
        listen_uri, {loop_.executor()},
        [state](std::shared_ptr<transport::Connection> conn) { state->Accept(std::move(conn)); },
        transport::Options{});
    if (!l.ok()) throw std::runtime_error("listen: " + l.error().message);
    listener_ = std::move(l.value());
    uri = listener_->uri();
    loop_.Start();  // only now: the listener registers with the loop from this thread
  }
  ~ScriptedServer() {
    listener_->Close();
    // Closed and let go of on the loop's thread, while the loop still runs: a connection must
    // not outlive its io_context (an RDMA connection's destructor releases its descriptors from
    // the loop's reactor).
    asio::post(loop_.executor(), asio::use_future([state = state_] {
                 for (auto& c : state->conns) c->Close();
                 state->conns.clear();
               }))
        .get();
  }

  int accepted() const { return state_->accepted.load(); }
  int requests() const { return state_->requests.load(); }
  // Frames of `type` received from clients so far.
  uint64_t frames_of(FrameType type) const {
    return state_->frames[static_cast<size_t>(type)].load();
  }
  // What the server's connections hold queued for the client (on the loop thread).
  size_t queued_send_bytes() {
    return asio::post(loop_.executor(), asio::use_future([state = state_] {
                        size_t n = 0;
                        for (auto& c : state->conns) n += c->queued_send_bytes();
                        return n;
                      }))
        .get();
  }

  // Runs `f` on the server's loop thread with its newest connection, and waits for it. False
  // when there is none.
  bool OnNewest(std::function<void(transport::Connection&)> f) {
    return asio::post(loop_.executor(), asio::use_future([state = state_, f = std::move(f)] {
                        if (state->conns.empty()) return false;
                        f(*state->conns.back());
                        return true;
                      }))
        .get();
  }

  std::string uri;

 private:
  struct Peer;
  struct State : std::enable_shared_from_this<State> {
    Script script;
    bool send_settings = true;
    std::vector<std::shared_ptr<transport::Connection>> conns;  // loop thread only
    std::atomic<int> accepted{0}, requests{0};
    std::atomic<uint64_t> frames[16]{};
    void Accept(std::shared_ptr<transport::Connection> conn);
  };
  struct Peer final : transport::ConnectionHandler {
    Peer(std::shared_ptr<State> s, transport::Connection* c) : state(std::move(s)), conn(c) {}
    void OnMessage(std::span<const std::byte> m) override {
      DecodedFrame f;
      if (!DecodeFrame(m, &f).empty()) return;
      ++state->frames[static_cast<size_t>(f.header.type)];
      if (f.header.type != FrameType::kRequest) return;
      ++state->requests;
      state->script(
          *conn, SeenRequest{f.header, std::string(reinterpret_cast<const char*>(f.payload.data()),
                                                   f.payload.size())});
    }
    void OnClose(const transport::Error&) override {}
    std::shared_ptr<State> state;
    transport::Connection* conn;  // owns this handler until OnClose
  };

  std::shared_ptr<State> state_;
  EventLoopThread loop_{/*start=*/false};
  std::unique_ptr<transport::Listener> listener_;
};

void ScriptedServer::State::Accept(std::shared_ptr<transport::Connection> conn) {
  ++accepted;
  conn->Start(std::make_shared<Peer>(shared_from_this(), conn.get()));
  if (send_settings) {
    FrameHeader h;
    h.type = FrameType::kSettings;
    std::string payload(kSettingsBytes, '\0');
    EncodeSettings(Settings{.features = kFeatureClientStreams},
                   reinterpret_cast<std::byte*>(payload.data()));
    SendFrame(*conn, h, payload);
  }
  conns.push_back(std::move(conn));
}

// A blocking stub on a new channel to `server`; the test stops if it cannot connect.
TestService::BlockingStub ConnectTo(const ScriptedServer& server, ChannelOptions options = {}) {
  auto ch = Channel::ConnectBlocking(server.uri, std::move(options));
  REQUIRE(ch.ok());
  return TestService::BlockingStub(*ch);
}

// Echo(payload) through `stub`.
Result<EchoReply> Echo(TestService::BlockingStub& stub, const std::string& payload,
                       const CallOptions& options = {}) {
  EchoRequest req;
  req.set_payload(payload);
  return stub.Echo(req, options);
}

// `n` calls in a row through `stub`, each of which must get its own payload back (none of the
// replies a hostile server slipped in beside them).
void EachGetsItsOwnReply(TestService::BlockingStub& stub, int n, const std::string& prefix,
                         const CallOptions& options = {}) {
  for (int i = 0; i < n; ++i) {
    const std::string payload = prefix + std::to_string(i);
    auto r = Echo(stub, payload, options);
    REQUIRE(r.ok());
    REQUIRE(r->payload() == payload);
  }
}

// After what the server did, the channel serves a call again (on a new connection where it
// had to drop one): waits for it to be ready, and the call gets its own payload back.
void ServedAfterwards(TestService::BlockingStub& stub, const std::string& payload) {
  auto r = Echo(stub, payload, {.timeout = 5s, .wait_for_ready = true});
  INFO((r.ok() ? std::string("OK") : r.status().ToString()));
  REQUIRE(r.ok());
  CHECK(r->payload() == payload);
}

}  // namespace

TEST_CASE("a reply that does not parse fails that call alone, with INTERNAL naming the type",
          "[hostile-server]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    if (EchoPayload(r) == "garbage") {
      SendFrame(conn, ResponseTo(r), "\xff\xff\xff\xff");  // no valid field tag
    } else {
      AnswerEcho(conn, r);
    }
  });
  auto stub = ConnectTo(server);
  auto bad = Echo(stub, "garbage");
  CHECK(bad.status().code() == StatusCode::kInternal);
  CHECK_THAT(bad.status().message(), Catch::Contains("rdmarpc.testing.EchoReply"));
  auto good = Echo(stub, "fine");
  REQUIRE(good.ok());
  CHECK(good->payload() == "fine");
  CHECK(server.accepted() == 1);  // the connection was kept: the frame itself was sound
}

TEST_CASE("replies to call ids never sent, and repeated replies, reach no caller",
          "[hostile-server]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    for (uint64_t id : {r.header.call_id ^ (uint64_t{1} << 32),  // the slot, another generation
                        r.header.call_id + 1, r.header.call_id + 1000, ~uint64_t{0}, uint64_t{0}}) {
      FrameHeader h = ResponseTo(r);
      h.call_id = id;
      SendFrame(conn, h, EchoReplyBytes("forged"));
    }
    AnswerEcho(conn, r);
    AnswerEcho(conn, r);  // again: the call is over, its slot may already serve the next one
    SendFrame(conn, ResponseTo(r), EchoReplyBytes("stale"));
  });
  auto stub = ConnectTo(server);
  EachGetsItsOwnReply(stub, 200, "call ");
  CHECK(server.accepted() == 1);
}

TEST_CASE("a malformed frame from the server fails what it had, then the channel reconnects",
          "[hostile-server]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    if (EchoPayload(r) == "break") {
      conn.Send(Bytes(std::string(40, '\x42')));  // bad magic
    } else {
      AnswerEcho(conn, r);
    }
  });
  auto stub = ConnectTo(server);
  auto broken = Echo(stub, "break", {.timeout = 5s});
  CHECK(broken.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(broken.status().message(), Catch::Contains("malformed frame"));
  ServedAfterwards(stub, "after");
  CHECK(server.accepted() == 2);
}

TEST_CASE("a server stream sent past its window costs the server the connection, not our memory",
          "[hostile-server][stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    if (r.header.flags & kRequestFlagServerStream) {
      // 1 MiB of messages at once, four windows' worth, without waiting for any WINDOW.
      CountReply m;
      m.set_payload(std::string(1024, 'x'));
      FrameHeader h;
      h.type = FrameType::kStreamMessage;
      h.call_id = r.header.call_id;
      for (uint64_t i = 0; i < 1024; ++i) {
        m.set_seq(i);
        SendFrame(conn, h, m.SerializeAsString());
      }
      return;
    }
    AnswerEcho(conn, r);
  });
  auto stub = ConnectTo(server);
  CountRequest req;
  req.set_count(1024);
  auto call = stub.Count(req, {.timeout = 10s});
  // Not reading until the client has dropped the connection and made a new one: the violation
  // is found while nothing of the stream was read (a reader taking messages meanwhile would
  // send WINDOWs and move the line).
  CHECK(Eventually([&] { return server.accepted() == 2; }, 10'000ms));
  uint64_t got = 0;
  while (auto m = call.Read()) {
    CHECK(m->seq() == got);
    ++got;
  }
  // At most a window's worth (and the message that crossed it) was kept for the reader before
  // the connection was dropped; the rest was never buffered.
  CHECK(got > 0);
  CHECK(got <= kStreamWindowBytes / (1024 + kFrameHeaderBytes) + 2);
  const Status s = call.Finish();
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Catch::Contains("flow-control window"));
  ServedAfterwards(stub, "after");
}

TEST_CASE(
    "a server stream message that does not parse ends that stream with INTERNAL, after "
    "the messages before it",
    "[hostile-server][stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    if (r.header.flags & kRequestFlagServerStream) {
      FrameHeader h;
      h.type = FrameType::kStreamMessage;
      h.call_id = r.header.call_id;
      CountReply m;
      for (uint64_t i = 0; i < 3; ++i) {
        m.set_seq(i);
        m.set_payload(std::string(100, 'p'));
        SendFrame(conn, h, m.SerializeAsString());
      }
      SendFrame(conn, h, std::string("\xff\xff\xff\xff", 4));  // a tag cut short
      m.set_seq(3);
      SendFrame(conn, h, m.SerializeAsString());
      SendFrame(conn, ResponseTo(r), "");
      return;
    }
    AnswerEcho(conn, r);
  });
  auto stub = ConnectTo(server);
  for (bool reuse : {false, true}) {
    INFO((reuse ? "Read(out)" : "Read()"));
    auto call = stub.Count(CountRequest(), {.timeout = 10s});
    uint64_t got = 0;
    CountReply m;
    while (reuse ? call.Read(m) : [&] {
      auto r = call.Read();
      if (r) m = *r;
      return r.has_value();
    }()) {
      CHECK(m.seq() == got);
      ++got;
    }
    CHECK(got == 3);  // those before the bad one, and nothing after it
    CHECK_FALSE((reuse ? call.Read(m) : call.Read().has_value()));
    const Status s = call.Finish();
    CHECK(s.code() == StatusCode::kInternal);
    CHECK_THAT(s.message(), Catch::Contains("does not parse as rdmarpc.testing.CountReply"));
  }
  ServedAfterwards(stub, "after");
  CHECK(server.accepted() == 1);  // the connection was not at fault
}

// A reply of many small fields the client does not know (empty, length-delimited: two bytes
// each on the wire, ~53 parsed) would take some 17-26 times its size once parsed: one the size
// of the message limit, over 1 GiB. A reply or stream message that would take more than the
// message limit beyond its bytes is refused unparsed (RESOURCE_EXHAUSTED); the connection stays.
TEST_CASE("a reply or stream message of many small unknown fields is refused before it is parsed",
          "[hostile-server][memory]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  std::string fields;  // 200 KiB of field 15, empty: within a stream's window and the limit
  while (fields.size() < (200u << 10)) fields += std::string("\x7a\x00", 2);
  ScriptedServer server(listen, [&](transport::Connection& conn, const SeenRequest& r) {
    if (r.header.flags & kRequestFlagServerStream) {
      FrameHeader h;
      h.type = FrameType::kStreamMessage;
      h.call_id = r.header.call_id;
      CountReply m;
      m.set_seq(0);
      SendFrame(conn, h, m.SerializeAsString());
      SendFrame(conn, h, fields);
      SendFrame(conn, ResponseTo(r), "");
      return;
    }
    if (EchoPayload(r) == "fields") {
      SendFrame(conn, ResponseTo(r), fields);
      return;
    }
    AnswerEcho(conn, r);
  });
  ChannelOptions options;
  options.transport.max_message_bytes = 1u << 20;  // 200 KiB of these take ~8 MiB parsed
  auto stub = ConnectTo(server, options);
  auto reply = Echo(stub, "fields");
  CHECK(reply.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(reply.status().message(), Catch::Contains("reply of 204800 bytes would take about") &&
                                           Catch::Contains("once parsed"));
  auto call = stub.Count(CountRequest(), {.timeout = 10s});
  auto first = call.Read();
  REQUIRE(first.has_value());
  CHECK(first->seq() == 0);
  CHECK_FALSE(call.Read().has_value());
  const Status s = call.Finish();
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::Contains("stream message of 204800 bytes would take about"));
  ServedAfterwards(stub, "after");
  CHECK(server.accepted() == 1);  // the connection was not at fault
}

TEST_CASE("a reply over the client's message limit drops that connection; the call says so",
          "[hostile-server][limits]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    if (EchoPayload(r) == "big") {
      SendFrame(conn, ResponseTo(r), EchoReplyBytes(std::string(1 << 20, 'b')));
    } else {
      AnswerEcho(conn, r);
    }
  });
  ChannelOptions options;
  options.transport.max_message_bytes = 64 * 1024;
  auto stub = ConnectTo(server, options);
  auto big = Echo(stub, "big", {.timeout = 5s});
  CHECK(big.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(big.status().message(), Catch::Contains("limit"));
  ServedAfterwards(stub, "small");
}

TEST_CASE("status codes nobody defined read as UNKNOWN; a huge GOAWAY reason is cut short",
          "[hostile-server]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    const std::string what = EchoPayload(r);
    if (r.header.flags & kRequestFlagServerStream) {
      FrameHeader h = ResponseTo(r);
      h.status = 0xffffffff;
      SendFrame(conn, h, "stream over");
    } else if (what == "odd code") {
      FrameHeader h = ResponseTo(r);
      h.status = 12345;
      SendFrame(conn, h, "from a newer server");
    } else if (what == "goaway") {
      // GOAWAY first: the call in flight still gets its reply, then the connection closes.
      FrameHeader h;
      h.type = FrameType::kGoAway;
      h.status = 999;
      SendFrame(conn, h, std::string(1 << 20, 'g'));
      AnswerEcho(conn, r);
    } else {
      AnswerEcho(conn, r);
    }
  });
  auto stub = ConnectTo(server);
  auto odd = Echo(stub, "odd code");
  CHECK(odd.status().code() == StatusCode::kUnknown);
  CHECK_THAT(odd.status().message(), Catch::Contains("from a newer server"));
  CHECK_THAT(odd.status().message(), Catch::Contains("12345"));

  CountRequest count;
  count.set_count(1);
  auto stream = stub.Count(count);
  CHECK_FALSE(stream.Read().has_value());
  const Status ended = stream.Finish();
  CHECK(ended.code() == StatusCode::kUnknown);
  CHECK_THAT(ended.message(), Catch::Contains("4294967295"));

  auto last = Echo(stub, "goaway", {.timeout = 5s});
  REQUIRE(last.ok());
  CHECK(last->payload() == "goaway");
  // The connection is closing: a call now fails at once or goes on a new connection. An error
  // that names the GOAWAY carries only a bounded piece of its 1 MiB reason.
  auto now = Echo(stub, "after", {.timeout = 5s});
  if (!now.ok()) {
    CHECK(now.status().code() == StatusCode::kUnavailable);
    CHECK(now.status().message().size() <= 8192);
  }
  ServedAfterwards(stub, "after");
  CHECK(server.accepted() == 2);
}

TEST_CASE("a megabyte of error text reaches the caller as its first 4 KiB and a count",
          "[hostile-server]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  // 4,095 bytes, then a two-byte UTF-8 character across the 4,096-byte limit, then 1 MiB.
  const std::string huge = std::string(4095, 'e') + "\xc3\xa9" + std::string(1 << 20, 'x');
  ScriptedServer server(listen, [&](transport::Connection& conn, const SeenRequest& r) {
    if (EchoPayload(r) == "huge error") {
      FrameHeader h = ResponseTo(r);
      h.status = static_cast<uint32_t>(StatusCode::kInternal);
      SendFrame(conn, h, huge);
    } else {
      AnswerEcho(conn, r);
    }
  });
  auto stub = ConnectTo(server);
  auto failed = Echo(stub, "huge error");
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == StatusCode::kInternal);
  const std::string& text = failed.status().message();
  // Cut before the character rather than through it, and the rest counted, not kept.
  CHECK(text.rfind(std::string(4095, 'e') + " [", 0) == 0);
  CHECK_THAT(text, Catch::Contains("[" + std::to_string(huge.size() - 4095) +
                                   " more bytes from the server not shown]"));
  CHECK(text.size() < 4096 + 64);
  ServedAfterwards(stub, "after");
  CHECK(server.accepted() == 1);
}

TEST_CASE("a server that never sends SETTINGS fails Connect at the connect timeout",
          "[hostile-server]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(
      listen, [](transport::Connection& conn, const SeenRequest& r) { AnswerEcho(conn, r); },
      /*send_settings=*/false);
  ChannelOptions options;
  options.transport.connect_timeout_ms = 1500;
  options.reconnect = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto ch = Channel::ConnectBlocking(server.uri, options);
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(ch.ok());
  CHECK(ch.status().code() == StatusCode::kUnavailable);
  // (The transport's own connect shares the timeout: on a slow machine an RDMA connect may be
  // what runs out of it.)
  CHECK_THAT(ch.status().message(), Catch::Contains("no SETTINGS") || Catch::Contains("timed out"));
  CHECK(took < 10s);
  CHECK(server.requests() == 0);
}

TEST_CASE("a server that answers after the deadline reaches no caller with it",
          "[hostile-server][deadline]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  auto held = std::make_shared<std::vector<SeenRequest>>();  // loop thread only
  ScriptedServer server(listen, [held](transport::Connection& conn, const SeenRequest& r) {
    if (EchoPayload(r) == "hold") {
      held->push_back(r);
      return;
    }
    AnswerEcho(conn, r);
  });
  auto stub = ConnectTo(server);
  auto slow = Echo(stub, "hold", {.timeout = 200ms});
  CHECK(slow.status().code() == StatusCode::kDeadlineExceeded);
  // Now the late reply, then a new call that may reuse the slot: it gets its own reply.
  size_t held_count = 0;
  REQUIRE(server.OnNewest([&held_count, held](transport::Connection& conn) {
    held_count = held->size();
    if (held->empty()) return;
    SendFrame(conn, ResponseTo(held->front()), EchoReplyBytes("late"));
  }));
  REQUIRE(held_count == 1);
  EachGetsItsOwnReply(stub, 20, "next ", {.timeout = 5s});
  CHECK(server.accepted() == 1);
}

TEST_CASE("a server that floods PINGs and reads nothing cannot grow the client's send queue",
          "[hostile-server][memory]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  // Over TCP the kernel's socket buffers (several MiB on loopback) take PONGs before any queue
  // of ours does, so the flood must be far larger than they are.
  const uint64_t pings = listen.starts_with("tcp") ? 2'000'000 : 200'000;
  ScriptedServer server(listen, [pings](transport::Connection& conn, const SeenRequest& r) {
    AnswerEcho(conn, r);
    if (EchoPayload(r) != "flood") return;
    conn.PauseReceiving();  // from now on, nothing the client sends is taken
    FrameHeader h;
    h.type = FrameType::kPing;
    for (uint64_t i = 0; i < pings; ++i) {
      h.call_id = i;
      SendFrame(conn, h, "");
    }
  });
  auto stub = ConnectTo(server);
  REQUIRE(Echo(stub, "flood").ok());
  // The client reads every PING (the server's send queue drains) ...
  CHECK(Eventually([&] { return server.queued_send_bytes() == 0; }, 60'000ms));
  // ... and then the server takes what the client queued for it meanwhile: the PONGs it sent.
  REQUIRE(server.OnNewest([](transport::Connection& conn) { conn.ResumeReceiving(); }));
  uint64_t pongs = 0;
  for (uint64_t last = ~uint64_t{0}; pongs != last;) {
    last = pongs;
    std::this_thread::sleep_for(500ms);
    pongs = server.frames_of(FrameType::kPong);
  }
  INFO(pongs << " of " << pings << " PINGs answered");
  // Answering each would have queued pings * 32 bytes in the client; it answers only while
  // what it has queued is small (what reaches the server proves the client alive anyway).
  CHECK(pongs * kFrameHeaderBytes < 16u << 20);
  CHECK(pongs < pings / 2);
  auto after = Echo(stub, "still there", {.timeout = 10s});
  REQUIRE(after.ok());
  CHECK(after->payload() == "still there");
}

TEST_CASE("stream messages on a client-streaming call are a protocol error, not a buffer",
          "[hostile-server][stream]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    if (r.header.flags & kRequestFlagClientStream) {
      // A client-streaming call's only answer is its final RESPONSE; send messages instead.
      FrameHeader h;
      h.type = FrameType::kStreamMessage;
      h.call_id = r.header.call_id;
      for (int i = 0; i < 10; ++i) SendFrame(conn, h, std::string(1000, 'm'));
      return;
    }
    AnswerEcho(conn, r);
  });
  auto stub = ConnectTo(server);
  auto call = stub.Upload({.timeout = 10s});
  EchoRequest m;
  m.set_seq(0);
  call.Write(m);  // may already fail: the server answers the call's opening
  auto summary = call.Finish();
  REQUIRE_FALSE(summary.ok());
  CHECK(summary.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(summary.status().message(), Catch::Contains("client-streaming call"));
  ServedAfterwards(stub, "after");
}

namespace {

// SETTINGS announcing that the server runs at most `limit` calls per connection.
std::string LimitSettings(uint32_t limit) {
  std::string payload(kSettingsBytes, '\0');
  EncodeSettings(Settings{.max_concurrent_calls = limit, .features = kFeatureClientStreams},
                 reinterpret_cast<std::byte*>(payload.data()));
  return payload;
}

bool IsSleep(const SeenRequest& r) {
  return r.header.method_id == MethodId("/rdmarpc.testing.TestService/Sleep");
}

}  // namespace

TEST_CASE(
    "a server that sends GOAWAY and never answers an abandoned call does not hold the channel",
    "[hostile-server][goaway]") {
  // Calls already sent finish after a GOAWAY, and the channel closes the connection once
  // nothing is left on it. A call whose caller gave up is not something left: its caller is
  // gone. (The channel used to wait for the server's answer to it, which this server never
  // sends: the channel stayed draining, and every later call failed or waited forever.)
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    if (IsSleep(r)) return;  // never answered, not even its CANCEL
    if (EchoPayload(r) == "going away") {
      FrameHeader h;
      h.type = FrameType::kGoAway;
      h.status = static_cast<uint32_t>(StatusCode::kUnavailable);
      SendFrame(conn, h, "draining");
    }
    AnswerEcho(conn, r);
  });
  auto stub = ConnectTo(server);
  auto slept = stub.Sleep(SleepRequest(), {.timeout = 200ms});
  CHECK(slept.status().code() == StatusCode::kDeadlineExceeded);
  auto last = Echo(stub, "going away", {.timeout = 5s});
  REQUIRE(last.ok());  // sent before the GOAWAY: it finishes
  CHECK(last->payload() == "going away");
  auto next = Echo(stub, "next", {.timeout = 5s, .wait_for_ready = true});
  INFO((next.ok() ? std::string("OK") : next.status().ToString()));
  REQUIRE(next.ok());
  CHECK(next->payload() == "next");
  CHECK(server.accepted() == 2);
}

TEST_CASE(
    "a server that never acknowledges a CANCEL holds its room in the limit for a while, "
    "not for good",
    "[hostile-server][limits]") {
  // The server announces one call per connection, then never answers a Sleep, nor its CANCEL.
  // The channel counts an abandoned call until the server lets go of it (a handler may ignore
  // cancellation: hostile_test checks that the next call waits for it), but at most
  // kAbandonedGrace (10 s): then the next call goes. (It used to wait forever.)
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, [](transport::Connection& conn, const SeenRequest& r) {
    if (IsSleep(r)) return;
    AnswerEcho(conn, r);
  });
  auto stub = ConnectTo(server);
  REQUIRE(server.OnNewest([](transport::Connection& conn) {
    SendFrame(conn, FrameHeader{.type = FrameType::kSettings}, LimitSettings(1));
  }));
  auto first = Echo(stub, "limit is in", {.timeout = 5s});  // after the SETTINGS, on one connection
  REQUIRE(first.ok());
  auto slept = stub.Sleep(SleepRequest(), {.timeout = 200ms});
  CHECK(slept.status().code() == StatusCode::kDeadlineExceeded);
  const auto t0 = std::chrono::steady_clock::now();
  auto next = Echo(stub, "next", {.timeout = 30s});
  const auto waited = std::chrono::steady_clock::now() - t0;
  INFO((next.ok() ? std::string("OK") : next.status().ToString()));
  REQUIRE(next.ok());
  CHECK(next->payload() == "next");
  CHECK(waited > 5s);  // it did wait for the room (10 s after the CANCEL)
  CHECK(server.accepted() == 1);
}

namespace {

// A payload for a reply frame: usually a message of one of the test service's reply types (the
// right one for the call or not), sometimes bytes that do not parse, sometimes nothing.
std::string RandomReplyPayload(Rng& rng) {
  const size_t pick = Below(rng, 20);
  if (pick < 3) return {};
  if (pick < 7) return RandomBytes(rng, 64);
  const std::string payload =
      Chance(rng, 0.03) ? std::string(60'000, 'r') : std::string(Below(rng, 300), 'r');
  if (pick < 12) return EchoReplyBytes(payload);
  if (pick < 17) {
    CountReply m;
    m.set_seq(Below(rng, 4));
    m.set_payload(payload);
    return m.SerializeAsString();
  }
  UploadSummary m;
  m.set_count(rng());
  m.set_bytes(rng());
  return m.SerializeAsString();
}

// What a hostile server sends for one request: a handful of frames drawn from the protocol's
// vocabulary, for this call, for calls it saw before (ended or not), or for none; then, now and
// then, it drops the connection. Runs on the server's loop thread.
class RandomAnswers {
 public:
  explicit RandomAnswers(uint64_t seed) : rng_(seed) {}

  void operator()(transport::Connection& conn, const SeenRequest& r) {
    for (size_t n = Below(rng_, 7); n > 0; --n) SendOne(conn, r);
    recent_.push_back(r.header.call_id);
    if (recent_.size() > 16) recent_.pop_front();
    if (Chance(rng_, 0.03)) conn.Close();
  }

 private:
  void SendOne(transport::Connection& conn, const SeenRequest& r) {
    FrameHeader h;
    const size_t whose = Below(rng_, 20);
    h.call_id = whose < 15                       ? r.header.call_id
                : whose < 19 && !recent_.empty() ? recent_[Below(rng_, recent_.size())]
                                                 : rng_();
    std::string metadata, payload;
    const size_t pick = Below(rng_, 100);
    if (pick < 40) {
      h.type = FrameType::kResponse;
      h.status = Chance(rng_, 0.7) ? 0 : static_cast<uint32_t>(Below(rng_, 20));  // past the last
      metadata = RandomMetadata(rng_);
      payload = h.status == 0 ? RandomReplyPayload(rng_) : RandomBytes(rng_, 100);
    } else if (pick < 65) {
      h.type = FrameType::kStreamMessage;
      if (Chance(rng_, 0.1)) h.flags = static_cast<uint8_t>(rng_());
      payload = RandomReplyPayload(rng_);
    } else if (pick < 75) {
      h.type = FrameType::kWindow;
      std::string w(kWindowBytes, '\0');
      EncodeWindow(Chance(rng_, 0.5) ? Below(rng_, 1 << 20) : rng_(),
                   reinterpret_cast<std::byte*>(w.data()));
      payload = Chance(rng_, 0.9) ? w : RandomBytes(rng_, 16);
    } else if (pick < 83) {
      h.type = Chance(rng_, 0.7) ? FrameType::kPing : FrameType::kPong;
      payload = RandomBytes(rng_, 16);
    } else if (pick < 88) {
      h.type = FrameType::kGoAway;
      h.flags = static_cast<uint8_t>(Below(rng_, 4));
      h.status = static_cast<uint32_t>(Below(rng_, 20));
      payload = RandomBytes(rng_, 200);
    } else if (pick < 93) {
      h.type = FrameType::kSettings;
      std::string settings(kSettingsBytes, '\0');
      EncodeSettings(Settings{.max_concurrent_calls =
                                  Chance(rng_, 0.3) ? static_cast<uint32_t>(1 + Below(rng_, 3)) : 0,
                              .max_message_bytes = static_cast<uint32_t>(rng_()),
                              .features = static_cast<uint32_t>(rng_())},
                     reinterpret_cast<std::byte*>(settings.data()));
      payload = Chance(rng_, 0.8) ? settings : RandomBytes(rng_, 16);
    } else {
      // What only a client sends, and (rarely: the connection ends there) types nobody defined.
      h.type = Chance(rng_, 0.8)
                   ? (Chance(rng_, 0.5) ? FrameType::kRequest : FrameType::kCancel)
                   : static_cast<FrameType>(Chance(rng_, 0.5) ? 0 : 10 + Below(rng_, 246));
      h.method_id = static_cast<uint32_t>(rng_());
      payload = RandomBytes(rng_, 32);
    }
    h.metadata_bytes = static_cast<uint32_t>(metadata.size());
    if (Chance(rng_, 0.01)) h.metadata_bytes = static_cast<uint32_t>(rng_());  // past the frame
    SendFrame(conn, h, metadata + payload);
  }

  Rng rng_;
  std::deque<uint64_t> recent_;  // call ids of earlier requests
};

// One call of a random kind through `stub`, as an application would make it (streams read to
// their end, written and closed); returns how it ended.
Status RandomCall(TestService::BlockingStub& stub, Rng& rng, std::chrono::milliseconds timeout) {
  const CallOptions options{.timeout = timeout};
  EchoRequest m;
  m.set_payload(std::string(Below(rng, 200), 'q'));
  switch (Below(rng, 5)) {
    case 0: {
      auto r = stub.Echo(m, options);
      return r.ok() ? Status() : r.status();
    }
    case 1: {
      SleepRequest req;
      req.set_ms(static_cast<uint32_t>(Below(rng, 20)));
      auto r = stub.Sleep(req, options);
      return r.ok() ? Status() : r.status();
    }
    case 2: {
      auto call = stub.Count(CountRequest(), options);
      for (int i = 0; i < 100 && call.Read(); ++i) {
      }
      if (Chance(rng, 0.1)) call.Cancel();
      return call.Finish();
    }
    case 3: {
      auto call = stub.Upload(options);
      for (size_t i = Below(rng, 4); i > 0 && call.Write(m); --i) {
      }
      if (Chance(rng, 0.1)) call.Cancel();
      if (Chance(rng, 0.7)) call.WritesDone();
      auto r = call.Finish();
      return r.ok() ? Status() : r.status();
    }
    default: {
      auto call = stub.Chat(options);
      for (size_t i = Below(rng, 4); i > 0 && call.Write(m); --i) {
      }
      if (Chance(rng, 0.7)) call.WritesDone();
      for (int i = 0; i < 10 && call.Read(); ++i) {
      }
      if (Chance(rng, 0.1)) call.Cancel();
      return call.Finish();
    }
  }
}

}  // namespace

TEST_CASE(
    "random frames from a hostile server: every call ends by its deadline with a defined "
    "status, and the channel serves an honest server afterwards",
    "[hostile-server][random]") {
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  const uint64_t seed = TestSeed("hostile_server_test random case over " + listen);
  INFO("RDMARPC_TEST_SEED=" << seed);
  // The script runs on the server's loop thread only: the generator needs no lock.
  auto hostile = std::make_shared<RandomAnswers>(seed);
  auto honest = std::make_shared<std::atomic<bool>>(false);
  ScriptedServer server(listen,
                        [hostile, honest](transport::Connection& conn, const SeenRequest& r) {
                          if (honest->load()) {
                            AnswerEcho(conn, r);
                          } else {
                            (*hostile)(conn, r);
                          }
                        });
  auto stub = ConnectTo(server);
  // Several callers on one channel at once, so that the server's stray frames meet live calls
  // of every kind. (No Catch assertions off the main thread: results are gathered, then checked.)
  constexpr int kThreads = 3, kCallsEach = 50;
  constexpr auto kTimeout = 250ms;
  // How long past its deadline a call may take to return: the deadline is the caller's, and a
  // loaded machine (or the Soft-RoCE VM) is slow, but a call the client lost would wait forever.
  constexpr auto kOverrun = 5s;
  struct Outcome {
    std::map<int, int> by_code;
    std::vector<std::string> wrong;
  };
  std::vector<Outcome> outcomes(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Rng rng(seed + 1 + static_cast<uint64_t>(t));
      for (int i = 0; i < kCallsEach; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const Status s = RandomCall(stub, rng, kTimeout);
        const auto took = std::chrono::steady_clock::now() - start;
        const int code = static_cast<int>(s.code());
        ++outcomes[t].by_code[code];
        if (code > static_cast<int>(StatusCode::kUnauthenticated)) {
          outcomes[t].wrong.push_back("a status code nobody defined: " + std::to_string(code));
        }
        if (took > kTimeout + kOverrun) {
          outcomes[t].wrong.push_back(
              "a call returned " +
              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
              " ms after it started (" + s.ToString() + ")");
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::map<int, int> by_code;
  for (const auto& o : outcomes) {
    for (const auto& [code, n] : o.by_code) by_code[code] += n;
    for (const auto& w : o.wrong) FAIL_CHECK(w);
  }
  std::string summary;
  for (const auto& [code, n] : by_code) {
    summary +=
        " " + std::string(StatusCodeName(static_cast<StatusCode>(code))) + " " + std::to_string(n);
  }
  std::printf("hostile_server_test random case: %d calls on %d connections:%s\n",
              kThreads * kCallsEach, server.accepted(), summary.c_str());
  honest->store(true);
  // A server that never acknowledged the CANCELs of calls whose callers gave up still counts
  // them (as far as the channel knows) for kAbandonedGrace (10 s); within its announced limit
  // the next call waits for that room, then goes.
  auto r = Echo(stub, "after the random frames", {.timeout = 20s, .wait_for_ready = true});
  INFO((r.ok() ? std::string("OK") : r.status().ToString()));
  REQUIRE(r.ok());
  CHECK(r->payload() == "after the random frames");
}

namespace {

// A script that grants every client stream unbounded credit as it opens (GrantUnboundedCredit)
// and answers Echo honestly; with `then_read_nothing`, the connection takes nothing more from
// the client after the grant.
Script GreedyClientStreams(bool then_read_nothing) {
  return [then_read_nothing](transport::Connection& conn, const SeenRequest& r) {
    if (!(r.header.flags & kRequestFlagClientStream)) {
      AnswerEcho(conn, r);
      return;
    }
    GrantUnboundedCredit(conn, r.header.call_id);
    if (then_read_nothing) conn.PauseReceiving();
  };
}

}  // namespace

TEST_CASE(
    "a server that grants a client stream unbounded credit and reads nothing cannot grow the "
    "client's memory",
    "[hostile-server][stream][memory]") {
  // Stream credit bounds what a writer may queue only as far as the server is honest about what
  // it will read: this one grants 2^42 bytes and stops reading. The channel's send-queue bound
  // (ChannelOptions::max_queued_bytes) makes the writer wait instead, within its deadline.
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, GreedyClientStreams(/*then_read_nothing=*/true));
  ChannelOptions co;
  co.max_queued_bytes = 1 << 20;
  auto stub = ConnectTo(server, co);
  constexpr uint64_t kMessages = 20'000;
  EchoRequest m;
  m.set_payload(std::string(10'000, 'u'));
  auto call = stub.Upload({.timeout = 3s});
  uint64_t accepted = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (; accepted < kMessages; ++accepted) {
    m.set_seq(accepted);
    if (!call.Write(m)) break;
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(accepted << " messages of 10,000 bytes accepted while the server read nothing");
  // A 1 MiB bound, plus what the transport holds beyond our queue (TCP: the kernel's socket
  // buffers, several MiB on loopback). Before the bound, all 200 MB were queued.
  CHECK(accepted < 2'000);
  CHECK(took < 10s);  // the writer gave up at its deadline (3 s), it did not hang
  auto summary = call.Finish();
  REQUIRE_FALSE(summary.ok());
  CHECK(summary.status().code() == StatusCode::kDeadlineExceeded);
  CHECK_THAT(summary.status().message(), Catch::Contains("the server has not taken"));
  // Unary calls on the same connection wait too (in order, within their deadlines) rather than
  // queue their requests without bound: none of these is sent.
  const int requests_before = server.requests();
  for (int i = 0; i < 100; ++i) {
    auto r = Echo(stub, std::string(100'000, 'e'), {.timeout = 20ms});
    REQUIRE_FALSE(r.ok());
    REQUIRE(r.status().code() == StatusCode::kDeadlineExceeded);
    if (i == 0) std::printf("a call while the queue is full: %s\n", r.status().ToString().c_str());
    CHECK_THAT(r.status().message(), Catch::Contains("waiting to send"));
  }
  // Once the server reads again, what was queued drains and the channel serves calls again.
  REQUIRE(server.OnNewest([](transport::Connection& conn) { conn.ResumeReceiving(); }));
  ServedAfterwards(stub, "after");
  // Before the bound, the 100 calls' requests (10 MB) were queued and reached the server now.
  CHECK(server.requests() - requests_before == 1);  // "after" alone
}

TEST_CASE(
    "a client stream given unbounded credit shares its thread: the loop's other work runs "
    "within every 64 KiB it writes",
    "[hostile-server][stream]") {
  // The mirror of hostile_test's server case: a server granting 2^42 bytes and reading all let a
  // writer coroutine on the channel's own thread write without ever waiting, so nothing else on
  // that loop (the channel's other calls, other channels) ran until it stopped. Probed by work
  // the writer posts to its thread at its 300th message.
  auto listen = GENERATE(from_range(ListenUrisInProcess()));
  INFO("over " << listen);
  ScriptedServer server(listen, GreedyClientStreams(/*then_read_nothing=*/false));
  auto ch = Channel::ConnectBlocking(server.uri);
  REQUIRE(ch.ok());
  constexpr uint64_t kMessages = 5'000;
  std::atomic<uint64_t> written{0};
  std::atomic<int64_t> probe_ran_after{-1};
  const bool all = (*ch)->Run([&]() -> asio::awaitable<bool> {
    TestService::Stub stub(*ch);
    auto call = co_await stub.Upload(CallOptions{.timeout = 30s});
    EchoRequest m;
    m.set_payload(std::string(1'000, 'u'));
    for (uint64_t i = 0; i < kMessages; ++i) {
      if (i == 300) {
        asio::post(co_await asio::this_coro::executor,
                   [&] { probe_ran_after = static_cast<int64_t>(written.load()) - 300; });
      }
      m.set_seq(i);
      if (!co_await call.Write(m)) co_return false;
      ++written;
    }
    call.Cancel();
    co_return true;
  }());
  CHECK(all);
  CHECK(Eventually([&] { return probe_ran_after.load() >= 0; }, 10'000ms));
  INFO("the loop's other work ran after " << probe_ran_after.load() << " messages of 1,000 bytes");
  // 64 KiB slices. Before: the rest of the stream, 4,700 messages.
  CHECK(probe_ran_after.load() * 1'000 <= 80'000);
  TestService::BlockingStub after(*ch);
  ServedAfterwards(after, "after");
}

// RDMA transport: connection set-up with librdmacm (listening, the CM handshake that exchanges
// the rings and authenticates, connecting with retries) over the pieces beside it:
//   device.h      per I/O thread and device: PD, SRQ, CQs, polling, registered buffers
//   connection.h  one connection's data path (records, credits, rendezvous)
//   record.h      the record format and its reassembly, free of verbs
//   ring.h        the ring's credit bookkeeping, free of verbs
//   tunables.h    sizes and limits
// docs/PROTOCOL.md has the bytes.
//
// Threading: a listener's CM events are taken on its own executor; each accepted connection is
// set up on the I/O thread that will own it (round-robin). Nothing here takes a lock.
#include "transport/rdma/rdma_transport.h"

#include <arpa/inet.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>

#include "transport/acceptor.h"
#include "transport/handshake.h"
#include "transport/log_limit.h"
#include "transport/rdma/connection.h"
#include "transport/rdma/tunables.h"
#include "transport/rdma/verbs.h"
#include "transport/stats.h"

namespace rdmarpc::transport::rdma {
namespace asio = boost::asio;

Expected<void> DeviceAvailable() {
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    int err = errno;
    return Error{std::string("no RDMA device present (ibv_get_device_list: ") + std::strerror(err) +
                 "); use tcp://, or run inside the Soft-RoCE VM (tools/vm/rxe_vm.sh)"};
  }
  ibv_free_device_list(list);
  if (n == 0) return Error{"no RDMA device present (ibv_get_device_list found none); use tcp://"};
  return {};
}

namespace {

std::string SockaddrUri(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (sa && sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (sa && sa->sa_family == AF_INET6) {
    auto* in = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    port = ntohs(in->sin6_port);
  }
  return Endpoint{Scheme::kRdma, host, port}.ToUri();
}

// Rejects a connect request, saying why (or challenging it) in the reject's private data.
void RejectWith(rdma_cm_id* id, const Answer& answer) {
  uint8_t out[kAnswerBytes];
  EncodeAnswer(answer, out);
  rdma_reject(id, out, kAnswerBytes);
}
void RejectWith(rdma_cm_id* id, Refusal why) {
  Answer a;
  a.code = why;
  RejectWith(id, a);
}

rdma_conn_param ConnParam(const uint8_t* data, size_t len, uint8_t rd_atom) {
  rdma_conn_param p{};
  p.private_data = data;
  p.private_data_len = static_cast<uint8_t>(len);
  // RDMA READs in flight each way (rendezvous reads of large messages).
  p.responder_resources = rd_atom;
  p.initiator_depth = rd_atom;
  p.retry_count = 7;
  p.rnr_retry_count = 7;  // "infinite": a receiver briefly short of receives is not an error
  return p;
}

class RdmaListener final : public Listener {
 public:
  struct State : AcceptorCore, std::enable_shared_from_this<State> {
    State(const std::vector<Executor>& executors, AcceptHandler on_accept, const Options& options)
        : AcceptorCore(executors, std::move(on_accept), options), fd(executors[0]) {}
    asio::posix::stream_descriptor fd;
    EventChannel events;
    CmId id;
    void Wait() {
      fd.async_wait(asio::posix::stream_descriptor::wait_read,
                    [self = shared_from_this()](boost::system::error_code ec) {
                      if (ec || self->closed) return;
                      rdma_cm_event* e = nullptr;
                      while (rdma_get_cm_event(self->events.get(), &e) == 0) self->OnEvent(e);
                      self->Wait();
                    });
    }

    void OnEvent(rdma_cm_event* e) {
      if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_ack_cm_event(e);
        return;
      }
      rdma_cm_id* child = e->id;
      Expected<PeerHello> decoded =
          DecodePeerHello(e->param.conn.private_data, e->param.conn.private_data_len);
      std::string peer = SockaddrUri(rdma_get_peer_addr(child));
      // Refused or challenged before anything is allocated for the peer, and before it learns
      // any rkey: a challenge is a reject too, and the client connects again with its proof.
      std::string why;
      const Answer answer = Screen(
          static_cast<const uint8_t*>(e->param.conn.private_data), e->param.conn.private_data_len,
          decoded.ok() ? Expected<Hello>(decoded.value().hello) : Expected<Hello>(decoded.error()),
          /*retry=*/false, peer, &why);
      rdma_ack_cm_event(e);  // the private data is not read after this
      if (answer.code != Refusal::kNone) {
        if (answer.code != Refusal::kChallenge && !why.empty()) {
          static LogLimit limit;
          WarnLimited(limit, "rdma: refusing connection from {}: {}", peer, why);
        }
        RejectWith(child, answer);
        rdma_destroy_id(child);
        return;
      }
      // Each connection in set-up pins its ring until it is established or given up: at the
      // bound the oldest gives up; at twice the bound, busy, before anything is allocated.
      // Logged once per 1,000: a flood must not flood the log as well.
      if (!MakeRoom("rdma", peer)) {
        RejectWith(child, Refusal::kBusy);
        rdma_destroy_id(child);
        return;
      }
      // Move the new id to its own event channel, on the I/O thread that will own it.
      EventChannel ch(rdma_create_event_channel());
      if (!ch || rdma_migrate_id(child, ch.get())) {
        const int err_no = errno;
        static LogLimit limit;
        WarnLimited(limit, "rdma: cannot take connection from {}: {}", peer, std::strerror(err_no));
        // Out of descriptors is the usual cause: the client hears RESOURCE_EXHAUSTED.
        const bool busy = err_no == EMFILE || err_no == ENFILE || err_no == ENOMEM;
        if (busy) Count(Stat::kRefusedDescriptors);
        RejectWith(child, busy ? Refusal::kBusy : Refusal::kServerError);
        rdma_destroy_id(child);
        return;
      }
      const Executor& target = NextExecutor();
      auto set_up = BeginSetUp(target);
      asio::co_spawn(target,
                     Accept(shared_from_this(), set_up, target, CmId(child), std::move(ch),
                            decoded.value(), peer),
                     asio::bind_cancellation_slot(set_up->give_up.slot(), asio::detached));
    }

    static asio::awaitable<void> Accept(std::shared_ptr<State> self, std::shared_ptr<SetUp> slot,
                                        Executor ex, CmId id, EventChannel ch, PeerHello client,
                                        std::string peer) {
      // However this ends (established, refused, given up), it no longer counts as set-up.
      const SetUpEnd end(*self, std::move(slot));
      // Given up (MakeRoom): the wait below ends, without a throw.
      co_await asio::this_coro::throw_if_cancelled(false);
      auto conn = std::make_shared<RdmaConnection>(ex, self->options(), peer);
      rdma_cm_id* raw = id.get();
      Expected<void> set_up = conn->Adopt(std::move(id), std::move(ch));
      if (set_up.ok()) set_up = conn->Setup();
      if (!set_up.ok()) {
        static LogLimit limit;
        WarnLimited(limit, "rdma: set-up for {} failed: {}", peer, set_up.error().message);
        RejectWith(raw, Refusal::kServerError);
        co_return;
      }
      conn->SetRemoteRing(client.ring);
      // Private data of the accept: our HELLO (where our ring is), then an ANSWER whose proof
      // shows a client with a secret that we know it too.
      const Hello ours = WithRing(Hello{}, conn->LocalRing());
      Answer answer;
      answer.proof = self->auth().ProveServer(client.hello, ours);
      uint8_t data[kHelloBytes + kAnswerBytes];
      EncodeHello(ours, data);
      EncodeAnswer(answer, data + kHelloBytes);
      rdma_conn_param p = ConnParam(data, sizeof data, conn->rd_atom());
      if (rdma_accept(conn->id(), &p)) {
        static LogLimit limit;
        WarnLimited(limit, "rdma: accept from {} failed: {}", peer, std::strerror(errno));
        co_return;
      }
      CmEvent ev;
      if ((co_await asio::this_coro::cancellation_state).cancelled() ==
          asio::cancellation_type::none) {
        ev = co_await conn->NextEvent(
            std::max(self->options().connect_timeout_ms, kEstablishWaitMinMs));
      }
      if (!ev || ev->event != RDMA_CM_EVENT_ESTABLISHED) {
        if (!ev && (co_await asio::this_coro::cancellation_state).cancelled() !=
                       asio::cancellation_type::none) {
          // One per request of a flood: MakeRoom's warning counts them instead.
          spdlog::debug("rdma: connection from {} not established: given up for a newer one", peer);
          co_return;
        }
        static LogLimit limit;
        WarnLimited(limit, "rdma: connection from {} not established: {}", peer,
                    ev ? rdma_event_str(ev->event) : "timed out");
        co_return;
      }
      ev.reset();
      if (self->closed) co_return;
      conn->WatchEvents();
      if (auto opened = conn->Open(); !opened.ok()) {
        static LogLimit limit;
        WarnLimited(limit, "rdma: connection from {}: {}", peer, opened.error().message);
      }
      self->Deliver(conn);
    }
  };

  RdmaListener(std::shared_ptr<State> s, std::string uri)
      : state_(std::move(s)), uri_(std::move(uri)) {}
  ~RdmaListener() override { Close(); }

  void Close() override {
    if (closing_.exchange(true)) return;
    asio::post(state_->fd.get_executor(), [s = state_] {
      s->closed = true;
      if (s->fd.is_open()) s->fd.release();
      s->id.reset();
      s->events.reset();
    });
  }

  std::string uri() const override { return uri_; }
  int connections_in_setup() const override { return state_->set_ups_now(); }

 private:
  std::shared_ptr<State> state_;
  std::string uri_;
  std::atomic<bool> closing_{false};
};

sockaddr_storage ToSockaddr(const asio::ip::address& addr, uint16_t port) {
  asio::ip::tcp::endpoint tep(addr, port);
  sockaddr_storage ss{};
  std::memcpy(&ss, tep.data(), tep.size());
  return ss;
}

// For Connect, which runs on an I/O thread: a host name is looked up without blocking the loop
// (Asio's resolver does the getaddrinfo on its own thread).
asio::awaitable<Expected<sockaddr_storage>> ResolveHostAsync(const Endpoint& ep, Executor ex) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(ep.host == "localhost" ? "127.0.0.1" : ep.host, ec);
  if (!ec) co_return ToSockaddr(addr, ep.port);
  asio::ip::tcp::resolver r(ex);
  auto [rec, results] = co_await r.async_resolve(ep.host, std::to_string(ep.port),
                                                 asio::as_tuple(asio::use_awaitable));
  if (rec || results.empty()) co_return Error{"cannot resolve " + ep.host};
  co_return ToSockaddr(results.begin()->endpoint().address(), ep.port);
}

}  // namespace

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options) {
  const std::string what = "rdma listen on " + endpoint.ToUri() + ": ";
  if (auto device = DeviceAvailable(); !device.ok()) return Error{what + device.error().message};
  if (executors.empty()) return Error{what + "no executors"};
  auto addr = ListenAddress(endpoint);
  if (!addr.ok()) return Error{what + addr.error().message};
  sockaddr_storage sa = ToSockaddr(addr.value(), endpoint.port);
  auto s = std::make_shared<RdmaListener::State>(executors, std::move(on_accept), options);
  s->events.reset(rdma_create_event_channel());
  if (!s->events) return Error{what + Errno("rdma_create_event_channel")};
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(s->events.get(), &id, nullptr, RDMA_PS_TCP)) {
    return Error{what + Errno("rdma_create_id")};
  }
  s->id.reset(id);
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&sa))) {
    return Error{what + Errno("rdma_bind_addr")};
  }
  if (rdma_listen(id, 1024)) return Error{what + Errno("rdma_listen")};
  if (!SetNonBlocking(s->events->fd)) return Error{what + Errno("fcntl")};
  boost::system::error_code ec;
  s->fd.assign(s->events->fd, ec);
  if (ec) return Error{what + ec.message()};
  Endpoint bound = endpoint;
  bound.port = ntohs(rdma_get_src_port(id));
  s->Wait();
  return std::unique_ptr<Listener>(new RdmaListener(s, bound.ToUri()));
}

namespace {

// One connection attempt: a new CM id, QP and ring, and one connect request.
struct Attempt {
  std::shared_ptr<RdmaConnection> conn;  // set when connected
  Error error;
  bool transient = false;          // worth another attempt while the connect timeout lasts
  std::optional<Nonce> challenge;  // the server wants our proof: connect again with it
};

// The accept's private data: the server's HELLO (its ring), then its ANSWER (its proof of our
// secret). Private data holding only a HELLO carries no proof, which CheckServer refuses when we
// have a secret. The server's ring, or why the connection must not be used.
Expected<RingDescriptor> AcceptedRing(const rdma_conn_param& accept, const Authenticator& auth,
                                      const Hello& sent) {
  Expected<PeerHello> server = DecodePeerHello(accept.private_data, accept.private_data_len);
  if (!server.ok()) return server.error();
  Answer answer;
  if (accept.private_data_len >= kHelloBytes + kAnswerBytes) {
    Expected<Answer> decoded =
        DecodeAnswer(static_cast<const uint8_t*>(accept.private_data) + kHelloBytes, kAnswerBytes);
    if (!decoded.ok()) return decoded.error();
    answer = decoded.value();
  }
  if (auto proved = auth.CheckServer(sent, server.value().hello, answer); !proved.ok()) {
    return proved.error();
  }
  return server.value().ring;
}

int MsUntil(std::chrono::steady_clock::time_point t) {
  return static_cast<int>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(t - std::chrono::steady_clock::now())
             .count()));
}

asio::awaitable<Attempt> ConnectOnce(const Endpoint& endpoint, sockaddr_storage sa,
                                     Executor executor, const Options& options,
                                     const Authenticator& auth, Hello* hello,
                                     const std::optional<Nonce>& challenge,
                                     std::chrono::steady_clock::time_point until) {
  Attempt out;
  auto fail = [&](std::string why, bool transient = false) {
    out.error = Error{std::move(why)};
    out.transient = transient;
    return out;
  };
  EventChannel events(rdma_create_event_channel());
  if (!events) co_return fail(Errno("rdma_create_event_channel"));
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(events.get(), &raw, nullptr, RDMA_PS_TCP)) {
    co_return fail(Errno("rdma_create_id"));
  }
  // The connection owns the id and its channel from here, so every exit below releases them.
  auto conn = std::make_shared<RdmaConnection>(executor, options, endpoint.ToUri());
  if (auto adopted = conn->Adopt(CmId(raw), std::move(events)); !adopted.ok()) {
    co_return fail(adopted.error().message);
  }
  auto describe = [](const CmEvent& ev) {
    return std::string(rdma_event_str(ev->event)) + " (status " + std::to_string(ev->status) + ")";
  };
  const int resolve_ms = std::max(1, std::min(kResolveTimeoutMs, MsUntil(until)));
  if (rdma_resolve_addr(raw, nullptr, reinterpret_cast<sockaddr*>(&sa), resolve_ms)) {
    co_return fail(Errno("rdma_resolve_addr"));
  }
  {
    CmEvent ev = co_await conn->NextEvent(resolve_ms + 500);
    if (!ev) co_return fail("address resolution timed out", true);
    if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
      co_return fail("address resolution failed: " + describe(ev), true);
    }
  }
  if (rdma_resolve_route(raw, resolve_ms)) co_return fail(Errno("rdma_resolve_route"));
  {
    CmEvent ev = co_await conn->NextEvent(resolve_ms + 500);
    if (!ev) co_return fail("route resolution timed out", true);
    if (ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
      co_return fail("route resolution failed: " + describe(ev), true);
    }
  }
  if (auto set_up = conn->Setup(); !set_up.ok()) co_return fail(set_up.error().message);
  *hello = WithRing(*hello, conn->LocalRing());
  if (challenge) auth.Prove(hello, *challenge);  // the proof covers the ring fields
  uint8_t data[kHelloBytes];
  EncodeHello(*hello, data);
  rdma_conn_param p = ConnParam(data, sizeof data, conn->rd_atom());
  if (rdma_connect(conn->id(), &p)) co_return fail(Errno("rdma_connect"));
  CmEvent ev = co_await conn->NextEvent(std::max(1, MsUntil(until)));
  if (!ev) {
    co_return fail("timed out after " + std::to_string(options.connect_timeout_ms) + " ms");
  }
  if (ev->event == RDMA_CM_EVENT_REJECTED) {
    // An rdmarpc server says why (or challenges us) in the reject's private data; a bare reject
    // means nobody listens on that port.
    Expected<Answer> decoded =
        DecodeAnswer(ev->param.conn.private_data, ev->param.conn.private_data_len);
    if (decoded.ok() && decoded.value().code != Refusal::kNone) {
      const Answer& answer = decoded.value();
      if (answer.code == Refusal::kChallenge && hello->wants_auth && !challenge) {
        out.challenge = answer.challenge;
        co_return out;
      }
      fail("refused by the server: " + RefusalText(answer.code, answer.busy));
      out.error.busy = answer.code == Refusal::kBusy;
      co_return out;
    }
    co_return fail("connection refused (nobody listening on that port)");
  }
  if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
    // CONNECT_ERROR, UNREACHABLE: the CM gave up on this request (a loaded server answering
    // too late, a lost packet). A new request usually succeeds.
    co_return fail(describe(ev), ev->event == RDMA_CM_EVENT_CONNECT_ERROR ||
                                     ev->event == RDMA_CM_EVENT_UNREACHABLE);
  }
  Expected<RingDescriptor> ring = AcceptedRing(ev->param.conn, auth, *hello);
  ev.reset();
  if (!ring.ok()) {
    conn->Close();
    co_return fail(ring.error().message);
  }
  conn->SetRemoteRing(ring.value());
  conn->WatchEvents();
  if (auto opened = conn->Open(); !opened.ok()) co_return fail(opened.error().message);
  out.conn = std::move(conn);
  co_return out;
}

}  // namespace

asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                               Executor executor,
                                                               const Options& options) {
  const std::string what = "rdma connect to " + endpoint.ToUri() + ": ";
  if (auto device = DeviceAvailable(); !device.ok()) {
    co_return Error{what + device.error().message};
  }
  auto sa = co_await ResolveHostAsync(endpoint, executor);
  if (!sa.ok()) co_return Error{what + sa.error().message};
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  const Authenticator auth(options.auth_secret);
  Hello hello = auth.NewHello();
  std::optional<Nonce> challenge;
  asio::steady_timer pause(executor);
  for (int attempt = 0;; ++attempt) {
    Attempt a = co_await ConnectOnce(endpoint, sa.value(), executor, options, auth, &hello,
                                     challenge, until);
    if (a.conn) co_return std::shared_ptr<Connection>(a.conn);
    if (a.challenge) {
      challenge = a.challenge;  // at most once: ConnectOnce takes no second challenge
      continue;
    }
    // Transient failures are retried, with a short growing pause, while the timeout lasts.
    const int pause_ms = std::min(10 << std::min(attempt, 5), 320);
    if (!a.transient || MsUntil(until) <= pause_ms) {
      a.error.message = what + a.error.message;
      co_return a.error;
    }
    spdlog::info("{}attempt {} failed ({}); trying again", what, attempt + 1, a.error.message);
    pause.expires_after(std::chrono::milliseconds(pause_ms));
    co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

}  // namespace rdmarpc::transport::rdma

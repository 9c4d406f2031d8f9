#include "transport/inproc/inproc_transport.h"

#include <atomic>
#include <boost/asio/execution_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "transport/handler_slot.h"
#include "transport/handshake.h"
#include "transport/stats.h"

namespace rdmarpc::transport::inproc {
namespace asio = boost::asio;

namespace {

class InprocConnection;

// The two ends of one connection and the messages between them. Each end lives on its own
// executor; what they share is here, under `mu`. An end that is gone is no longer posted to,
// so no handler is queued on an executor whose connection has been destroyed.
struct Link {
  struct Pipe {  // one direction
    // Each message followed by kMessageSlopBytes of padding (see Send).
    std::deque<std::vector<std::byte>> ready;  // for the receiver, in order
    std::deque<std::vector<std::byte>> held;   // held by a fault hook; after `ready`
    size_t bytes = 0;                          // in ready and held: the sender's queued bytes
    bool closed = false;                       // the sender closed: deliver `ready`, then close
    bool reset = false;                        // broken: close at once, deliver nothing more
    bool drain_posted = false;                 // a Drain is queued on the receiver
  };
  struct End {
    std::weak_ptr<InprocConnection> conn;
    std::optional<Executor> executor;  // empty once the end is destroyed
  };

  std::string name;  // the listener's NAME
  std::mutex mu;
  Pipe to[2];  // indexed by Direction
  End end[2];  // end[kToServer] is the server's end (it receives Direction::kToServer)
};

constexpr size_t Index(Direction d) { return d == Direction::kToServer ? 0 : 1; }

// Forgets, when an io_context is destroyed, the executors of the ends that live on it: an end
// may outlive its io_context (whoever holds the connection lets go later), and its peer must
// then stop posting to it instead of posting into freed memory.
class EndService final : public asio::execution_context::service {
 public:
  using key_type = EndService;
  static inline asio::execution_context::id id;
  explicit EndService(asio::execution_context& ctx) : service(ctx) {}

  static void Register(const Executor& ex, const std::shared_ptr<Link>& link, size_t side) {
    auto& self = asio::use_service<EndService>(asio::query(ex, asio::execution::context));
    std::lock_guard lock(self.mu_);  // ends are registered from the connecting thread
    std::erase_if(self.ends_, [](const auto& e) { return e.first.expired(); });
    self.ends_.emplace_back(link, side);
  }

  void shutdown() override {
    std::lock_guard lock(mu_);
    for (auto& [weak, side] : ends_) {
      if (auto link = weak.lock()) {
        std::lock_guard link_lock(link->mu);
        link->end[side].executor.reset();
      }
    }
    ends_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<std::weak_ptr<Link>, size_t>> ends_;
};

// --- listeners, connections and fault hooks known to the process ------------------------------

struct ListenerState {
  std::string name;
  uint16_t port = 0;
  std::vector<Executor> executors;
  AcceptHandler on_accept;
  Options options;
  Authenticator auth{""};
  std::mutex mu;
  size_t next = 0;  // round-robin over executors
  bool closed = false;
  uint64_t accepted = 0;
};

struct Registry {
  std::mutex mu;
  std::map<std::pair<std::string, uint16_t>, std::shared_ptr<ListenerState>> listeners;
  std::map<std::string, std::shared_ptr<const FaultHook>, std::less<>> hooks;
  std::vector<std::weak_ptr<Link>> links;  // for ReleaseHeld; pruned as links go
  std::atomic<bool> any_hooks{false};
};
Registry& registry() {
  static auto* r = new Registry;  // leaked: connections may close during static destruction
  return *r;
}

std::shared_ptr<const FaultHook> HookFor(const std::string& name) {
  Registry& r = registry();
  if (!r.any_hooks.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(r.mu);
  auto it = r.hooks.find(name);
  return it == r.hooks.end() ? nullptr : it->second;
}

// --- the connection ------------------------------------------------------------------------------

class InprocConnection final : public Connection,
                               public std::enable_shared_from_this<InprocConnection> {
 public:
  // `inbound`: the direction this end receives.
  InprocConnection(std::shared_ptr<Link> link, Direction inbound, Executor executor,
                   const Options& options, std::string peer)
      : link_(std::move(link)),
        in_(inbound),
        out_(inbound == Direction::kToServer ? Direction::kToClient : Direction::kToServer),
        executor_(std::move(executor)),
        max_message_bytes_(options.max_message_bytes),
        peer_(std::move(peer)) {
    Count(Stat::kInprocConnectionsOpened);
  }

  ~InprocConnection() override {
    Count(Stat::kInprocConnectionsClosed);
    std::lock_guard lock(link_->mu);
    link_->end[Index(in_)].executor.reset();
    EndOutLocked();  // gone without Close (the layer above dropped it): the peer sees a close
  }

  // Registers this end with the link; call once, right after construction.
  void Attach() {
    EndService::Register(executor_, link_, Index(in_));
    std::lock_guard lock(link_->mu);
    link_->end[Index(in_)] = {weak_from_this(), executor_};
  }

  const Executor& executor() const override { return executor_; }

  void Start(std::shared_ptr<ConnectionHandler> handler) override {
    handler_.Set(std::move(handler));
    if (handler_.closed()) {
      Post([](InprocConnection& c) { c.handler_.DeliverClose(); });
      return;
    }
    started_ = true;
    Post([](InprocConnection& c) { c.Drain(); });
  }

  bool Send(const MessageWriter& message) override {
    if (handler_.closed() || message.size() > max_message_bytes_) return false;
    // The padding after the message is what every transport leaves after one it delivers
    // (kMessageSlopBytes).
    const size_t n = message.size();
    std::vector<std::byte> bytes(n + kMessageSlopBytes);
    message.WriteTo(bytes.data());
    Fault fault = Fault::kDeliver;
    if (auto hook = HookFor(link_->name); hook && *hook) {
      fault = (*hook)(out_, std::span<const std::byte>(bytes.data(), n));
    }
    if (fault == Fault::kDrop) return true;
    if (fault == Fault::kReset) {
      Reset("connection reset (fault injected)");
      return true;
    }
    std::lock_guard lock(link_->mu);
    Link::Pipe& out = link_->to[Index(out_)];
    // Not reached while this end is open (closing marks `out` and closed() above); kept so that
    // nothing is ever queued behind a close.
    if (out.closed || out.reset) return false;
    out.bytes += n;
    if (fault == Fault::kHold || !out.held.empty()) {
      out.held.push_back(std::move(bytes));
    } else {
      out.ready.push_back(std::move(bytes));
      PostDrain(*link_, out_);
    }
    return true;
  }

  void Close() override {
    if (handler_.closed()) return;
    CloseWith("closed locally");
  }

  // Every message Send accepted is already with the peer (in its pipe): nothing to wait for.
  void CloseAfterSending(int limit_ms) override {
    (void)limit_ms;
    Close();
  }

  size_t queued_send_bytes() const override {
    std::lock_guard lock(link_->mu);
    return link_->to[Index(out_)].bytes;
  }

  void PauseReceiving() override { paused_ = true; }
  void WatchSendProgress(bool on) override { watch_progress_ = on; }
  void ResumeReceiving() override {
    if (!paused_) return;
    paused_ = false;
    Post([](InprocConnection& c) { c.Drain(); });
  }

  bool closed() const override { return handler_.closed(); }
  size_t max_message_bytes() const override { return max_message_bytes_; }
  std::string peer() const override { return peer_; }

  // Delivers what the peer sent, in order, until the pipe is empty or receiving pauses; then
  // the peer's close, if it closed. On this end's executor.
  void Drain() {
    bool progressed = false;
    for (int n = 0;; ++n) {
      std::vector<std::byte> message;
      size_t size = 0;  // message's, without the padding
      std::optional<std::string> close;
      {
        std::lock_guard lock(link_->mu);
        Link::Pipe& in = link_->to[Index(in_)];
        in.drain_posted = false;
        if (handler_.closed()) return;
        if (in.reset) {
          close = "connection reset (fault injected)";
        } else if (!started_ || paused_) {
          if (!in.closed) break;
          // A paused end still hears that its peer is gone, or it would wait for ever; what it
          // had not read is lost, as with a socket whose peer vanished.
          close = "peer closed the connection";
        } else if (in.ready.empty()) {
          if (!in.closed || !in.held.empty()) break;
          close = "peer closed the connection";
        } else if (n == 64) {  // more waiting: let other work on this thread run first
          PostDrain(*link_, in_);
          break;
        } else {
          message = std::move(in.ready.front());
          in.ready.pop_front();
          size = message.size() - kMessageSlopBytes;
          in.bytes -= size;
          progressed = true;
          if (size > max_message_bytes_) {  // the peer's limit may be larger than ours
            close = "peer sent a message of " + std::to_string(size) +
                    " bytes, over the limit of " + std::to_string(max_message_bytes_);
          }
        }
      }
      if (close) {
        CloseWith(std::move(*close));
        break;
      }
      if (ConnectionHandler* h = handler_.get()) {
        h->OnMessage(std::span<const std::byte>(message.data(), size));
      }
    }
    if (progressed) TellSender();
  }

  // The sender learns that its queued bytes went down (ConnectionHandler::OnSendProgress),
  // which it only hears while its own receiving is paused or it watches its queue.
  void OnPeerProgress() {
    if ((paused_ || watch_progress_) && !handler_.closed()) {
      if (ConnectionHandler* h = handler_.get()) h->OnSendProgress();
    }
  }

  // For ReleaseHeld: moves the messages held in direction `d` on `link` to its ready queue.
  static size_t Release(Link& link, Direction d) {
    Link::Pipe& p = link.to[Index(d)];
    const size_t n = p.held.size();
    while (!p.held.empty()) {
      p.ready.push_back(std::move(p.held.front()));
      p.held.pop_front();
    }
    if (n) PostDrain(link, d);
    return n;
  }

 private:
  // Posts fn(*this) to this end's executor, if the connection still exists then.
  template <class Fn>
  void Post(Fn fn) {
    asio::post(executor_, [weak = weak_from_this(), fn]() {
      if (auto self = weak.lock()) fn(*self);
    });
  }

  // Queues a Drain on the end that receives direction `d`, unless one is queued or the end is
  // gone. Caller holds link.mu.
  static void PostDrain(Link& link, Direction d) {
    Link::Pipe& p = link.to[Index(d)];
    Link::End& e = link.end[Index(d)];
    if (p.drain_posted || !e.executor) return;
    p.drain_posted = true;
    asio::post(*e.executor, [weak = e.conn]() {
      if (auto c = weak.lock()) c->Drain();
    });
  }

  // Tells the other end (on its executor) that messages it sent were taken.
  void TellSender() {
    std::lock_guard lock(link_->mu);
    Link::End& e = link_->end[Index(out_)];
    if (!e.executor) return;
    asio::post(*e.executor, [weak = e.conn]() {
      if (auto c = weak.lock()) c->OnPeerProgress();
    });
  }

  // This end sends nothing more: the peer closes once it has read what came before (unless
  // the connection was reset). Caller holds link_->mu.
  void EndOutLocked() {
    Link::Pipe& out = link_->to[Index(out_)];
    if (out.closed || out.reset) return;
    out.closed = true;
    PostDrain(*link_, out_);
  }

  void CloseWith(std::string reason) {
    if (!handler_.MarkClosed(std::move(reason))) return;
    {
      std::lock_guard lock(link_->mu);
      EndOutLocked();
      Link::Pipe& in = link_->to[Index(in_)];
      in.ready.clear();
      in.held.clear();
      in.bytes = 0;
    }
    // Never from inside Send or Close: posted.
    Post([](InprocConnection& c) { c.handler_.DeliverClose(); });
  }

  void Reset(const std::string& reason) {
    {
      std::lock_guard lock(link_->mu);
      Link::Pipe& out = link_->to[Index(out_)];
      out.reset = true;
      out.ready.clear();
      out.held.clear();
      out.bytes = 0;
      PostDrain(*link_, out_);
    }
    CloseWith(reason);
  }

  std::shared_ptr<Link> link_;
  const Direction in_, out_;
  Executor executor_;
  const size_t max_message_bytes_;
  const std::string peer_;
  HandlerSlot handler_;
  bool started_ = false;
  bool paused_ = false;
  bool watch_progress_ = false;  // WatchSendProgress
};

class InprocListener final : public Listener {
 public:
  explicit InprocListener(std::shared_ptr<ListenerState> state) : state_(std::move(state)) {}
  ~InprocListener() override { Close(); }
  void Close() override {
    {
      std::lock_guard lock(state_->mu);
      if (state_->closed) return;
      state_->closed = true;
    }
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    r.listeners.erase({state_->name, state_->port});
  }
  // An in-process connection has no set-up to wait on: it is handed over whole.
  int connections_in_setup() const override { return 0; }
  std::string uri() const override {
    return Endpoint{Scheme::kInproc, state_->name, state_->port}.ToUri();
  }

 private:
  std::shared_ptr<ListenerState> state_;
};

// The set-up exchange TCP and RDMA run over the wire, run in memory with the same
// Authenticator: the same refusals (wrong or missing secret) and the same proofs.
Expected<void> Handshake(const Authenticator& server, const Options& client_options) {
  const Authenticator client(client_options.auth_secret);
  Hello hello = client.NewHello();
  Answer answer;
  for (int round = 0; round < 2; ++round) {
    answer = Answer{};
    answer.code = server.Check(hello, &answer.challenge);
    if (answer.code == Refusal::kChallenge && round > 0) answer.code = Refusal::kBadSecret;
    if (answer.code == Refusal::kNone) answer.proof = server.ProveServer(hello, Hello{});
    if (answer.code != Refusal::kChallenge || !hello.wants_auth) break;
    client.Prove(&hello, answer.challenge);
  }
  if (answer.code != Refusal::kNone) {
    return Error{"refused by the server: " + RefusalText(answer.code)};
  }
  return client.CheckServer(hello, Hello{}, answer);
}

}  // namespace

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options) {
  if (executors.empty()) return Error{"inproc listen: no executors"};
  auto state = std::make_shared<ListenerState>();
  state->name = endpoint.host;
  state->executors = executors;
  state->on_accept = std::move(on_accept);
  state->options = options;
  state->auth = Authenticator(options.auth_secret);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  uint16_t port = endpoint.port;
  if (port == 0) {
    for (port = 1; port != 0 && r.listeners.count({state->name, port}); ++port) {
    }
    if (port == 0) return Error{"inproc listen on " + endpoint.ToUri() + ": no free port"};
  } else if (r.listeners.count({state->name, port})) {
    return Error{"inproc listen on " + endpoint.ToUri() + ": address already in use"};
  }
  state->port = port;
  r.listeners[{state->name, port}] = state;
  return std::unique_ptr<Listener>(std::make_unique<InprocListener>(std::move(state)));
}

asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                               Executor executor,
                                                               const Options& options) {
  const std::string uri = endpoint.ToUri();
  std::shared_ptr<ListenerState> state;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.listeners.find({endpoint.host, endpoint.port});
    if (it != r.listeners.end()) state = it->second;
  }
  if (!state) co_return Error{"connect to " + uri + " failed: Connection refused"};
  if (auto shaken = Handshake(state->auth, options); !shaken.ok()) {
    co_return Error{"connect to " + uri + ": " + shaken.error().message};
  }
  Executor server_executor;
  uint64_t number = 0;
  {
    std::lock_guard lock(state->mu);
    if (state->closed) co_return Error{"connect to " + uri + " failed: Connection refused"};
    server_executor = state->executors[state->next++ % state->executors.size()];
    number = ++state->accepted;
  }
  auto link = std::make_shared<Link>();
  link->name = endpoint.host;
  auto server_end = std::make_shared<InprocConnection>(
      link, Direction::kToServer, server_executor, state->options,
      "inproc://" + endpoint.host + "-client-" + std::to_string(number) + ":0");
  auto client_end =
      std::make_shared<InprocConnection>(link, Direction::kToClient, executor, options, uri);
  server_end->Attach();
  client_end->Attach();
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    std::erase_if(r.links, [](const std::weak_ptr<Link>& l) { return l.expired(); });
    r.links.push_back(link);
  }
  // The accept handler runs on the connection's executor, as for the other transports.
  asio::post(server_executor, [state, server_end]() {
    bool closed;
    {
      std::lock_guard lock(state->mu);
      closed = state->closed;
    }
    if (closed) {
      server_end->Close();  // the client hears "peer closed the connection"
      return;
    }
    state->on_accept(server_end);
  });
  co_return std::shared_ptr<Connection>(std::move(client_end));
}

namespace {
// Calls fn(link) with link.mu held for every live link to listener `name`.
template <class Fn>
void ForLinks(std::string_view name, Fn fn) {
  std::vector<std::shared_ptr<Link>> links;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    for (const auto& weak : r.links) {
      if (auto l = weak.lock(); l && l->name == name) links.push_back(std::move(l));
    }
  }
  for (const auto& l : links) {
    std::lock_guard lock(l->mu);
    fn(*l);
  }
}
}  // namespace

void SetFaultHook(std::string_view name, FaultHook hook) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (hook) {
    r.hooks[std::string(name)] = std::make_shared<const FaultHook>(std::move(hook));
  } else if (auto it = r.hooks.find(name); it != r.hooks.end()) {
    r.hooks.erase(it);
  }
  r.any_hooks.store(!r.hooks.empty(), std::memory_order_release);
}

size_t ReleaseHeld(std::string_view name) {
  size_t n = 0;
  ForLinks(name, [&](Link& l) {
    n += InprocConnection::Release(l, Direction::kToServer);
    n += InprocConnection::Release(l, Direction::kToClient);
  });
  return n;
}

size_t HeldCount(std::string_view name) {
  size_t n = 0;
  ForLinks(name, [&](Link& l) { n += l.to[0].held.size() + l.to[1].held.size(); });
  return n;
}

}  // namespace rdmarpc::transport::inproc

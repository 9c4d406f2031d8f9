#include "rpc/server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <condition_variable>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "rpc/event_loop.h"
#include "rpc/internal/decoded_size.h"
#include "rpc/internal/endpoint.h"
#include "rpc/internal/frame_writer.h"
#include "rpc/internal/keepalive.h"
#include "rpc/internal/parked.h"
#include "transport/factory.h"
#include "transport/log_limit.h"
#include "transport/stats.h"
#include "transport/uri.h"

namespace rdmarpc {
namespace asio = boost::asio;

namespace internal {

// Whose allowance refused a request or client-stream message for what it would take parsed
// (ParsedTooLargeText; ServerConnection::ParsedAllowance).
constexpr std::string_view kParsedAllowanceIs = "a connection may hold beyond them";
// The same, less what the connection's other streams' handlers hold parsed.
constexpr std::string_view kStreamAllowanceIs =
    "the connection may still hold beyond them, besides what messages its other streams' "
    "handlers hold take";

class ServerConnection;

Status HandlerThrew(const char* what) {
  if (what == nullptr)
    return Status(StatusCode::kInternal, "handler threw a non-standard exception");
  return Status(StatusCode::kInternal, std::string("handler threw: ") + what);
}

// The coroutines that run calls' handlers on one I/O thread, kept from call to call. Starting a
// call in an idle one is a resumption; a co_spawn per call cost a new coroutine thread, a
// dispatch to start it and a post to finish it (about a quarter of the server's work on a
// small call). Grows with the calls running at once; keeps at most kMaxIdle idle. One thread
// only: no locks.
class HandlerPool {
 public:
  explicit HandlerPool(transport::Executor ex) : ex_(std::move(ex)) {}
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;
  // Lets go of the idle runners (their frames are destroyed through the executor, as Asio
  // unwinds an unfinished coroutine); must run before the io_context is destroyed.
  ~HandlerPool() {
    for (Runner* r : idle_) {
      Resumer h = TakeParked(r->resume);  // destroying it may free the runner
    }
  }

  // Runs `job` in an idle runner, or a new one; either way it starts here and now (as a
  // co_spawn's dispatch would), until its handler first suspends.
  void Run(CallJobPtr job) {
    if (!idle_.empty()) {
      Runner* r = idle_.back();
      idle_.pop_back();
      r->job = std::move(job);
      TakeParked(r->resume)();
      return;
    }
    RunInNewRunner(std::move(job));
  }

 private:
  static constexpr size_t kMaxIdle = 64;

  // Run's rare path (no idle runner), out of line so that the common one stays a leaf-like
  // resumption without the co_spawn's frame set-up.
  [[gnu::noinline]] void RunInNewRunner(CallJobPtr job) {
    auto owned = std::make_unique<Runner>();
    Runner* r = owned.get();
    r->pool = this;
    r->job = std::move(job);
    // The completion handler owns the runner: its cancellation signal must outlive the
    // coroutine, whose completion still touches the slot bound to it.
    asio::co_spawn(ex_, Loop(r),
                   asio::bind_cancellation_slot(
                       r->cancel.slot(), [owned = std::move(owned)](const std::exception_ptr&) {}));
  }

  struct Runner {
    HandlerPool* pool = nullptr;
    asio::cancellation_signal cancel;  // the running call's: emitted when its caller cancels
    CallJobPtr job;
    std::optional<Resumer> resume;  // while idle
  };

  static asio::awaitable<void> Loop(Runner* r) {
    for (;;) {
      {
        auto job = std::move(r->job);
        Status status;
        try {
          status = co_await job->Begin(&r->cancel);
        } catch (const std::exception& e) {
          status = HandlerThrew(e.what());
        } catch (...) {
          status = HandlerThrew(nullptr);
        }
        job->Finish(std::move(status));
      }  // the call's state goes before the runner waits for the next
      // A cancelled call leaves the runner's state cancelled: the next call starts clean.
      // (Only then: resetting re-installs the state's handler in the signal's slot, ~80
      // instructions per call.)
      if ((co_await asio::this_coro::cancellation_state).cancelled() !=
          asio::cancellation_type::none) {
        co_await asio::this_coro::reset_cancellation_state();
      }
      HandlerPool* pool = r->pool;
      if (pool->idle_.size() >= kMaxIdle) co_return;
      co_await Park([r](Resumer&& resume) {
        r->resume.emplace(std::move(resume));
        r->pool->idle_.push_back(r);
      });
    }
  }

  transport::Executor ex_;
  std::vector<Runner*> idle_;
};

// One of the server's I/O threads: its event loop (started by Server::Start) and what lives on
// it.
struct IoThread {
  EventLoopThread loop{/*start=*/false};
  asio::io_context& ioc = loop.context();
  // After loop: destroyed before its io_context.
  HandlerPool handlers{ioc.get_executor()};
  // Open connections of this thread; touched only on this thread.
  std::unordered_set<std::shared_ptr<ServerConnection>> connections;
  // Set by Shutdown (on this thread) once it has closed the connections: fulfilled, and reset,
  // when the last of them is gone. Shared: Shutdown may stop waiting before it is.
  std::shared_ptr<std::promise<void>> all_closed;
  void ConnectionGone(const std::shared_ptr<ServerConnection>& c) {
    connections.erase(c);
    if (connections.empty() && all_closed) std::exchange(all_closed, nullptr)->set_value();
  }
};

struct ServerCore {
  ServerOptions options;
  // Written only before Start, read-only afterwards: lock-free lookups on every call.
  // Each method with its service and its interceptors (ForMethod's answers, in
  // options.interceptors order).
  struct HostedMethod {
    Service* service;
    const MethodEntry* entry;
    ServerInterceptors interceptors;
    // A metrics recorder bound first in options.interceptors, recorded into directly instead of
    // through `interceptors` (internal::ServerStatsRecorder); null: none. `recorder` owns it.
    internal::MethodStats* stats = nullptr;
    std::shared_ptr<ServerInterceptor> recorder;
    bool observed = false;  // someone hears of the calls: `stats` or `interceptors`
  };
  std::unordered_map<uint32_t, HostedMethod> methods;
  std::vector<const Service*> services;  // in AddService order; also fixed after Start
  std::vector<std::unique_ptr<transport::Listener>> listeners;
  std::atomic<bool> started{false};
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};
  std::atomic<int64_t> in_flight{0};
  // Shutdown waits on `drained` for in_flight to reach 0; the call that gets it there while
  // draining notifies (under the mutex, so that the wake-up cannot slip between Shutdown's check
  // and its wait). Calls outside a drain touch neither.
  std::mutex drain_mu;
  std::condition_variable drained;
  void CallFinished() {
    // seq_cst with `draining`: either Shutdown's check sees this decrement, or this load sees
    // draining set and notifies.
    if (in_flight.fetch_sub(1) == 1 && draining.load()) {
      std::lock_guard<std::mutex> lock(drain_mu);
      drained.notify_all();
    }
  }
  std::atomic<int64_t> connections{0};  // served, not counting those turned away
  // What the connections hold (ServerOptions::max_buffered_bytes), as each last reported it.
  std::atomic<int64_t> buffered{0};
  // What they hold for messages still arriving (ConnectionHandler::OnReceiveHeld), against the
  // same bound; and the one connection (its id; 0: none) whose arriving message goes on while
  // that is over the bound, so that some large message always can (see WaitForRoom).
  std::atomic<int64_t> receiving{0};
  std::atomic<uint64_t> receive_token{0};
  // Connections waiting for room for a large message (WaitForRoom): while there are any, one
  // whose message has stopped arriving is closed (ServerOptions::stalled_message_timeout), and
  // how many were.
  std::atomic<int64_t> room_waiters{0};
  std::atomic<int64_t> stalled{0};
  std::atomic<uint64_t> next_connection_id{1};

  // Connections served per client address (ServerOptions::max_connections_per_peer; empty when
  // it is 0). Touched as connections open and close, never per call. A tree, as streams_ in
  // ServerConnection: the addresses are the peers' (an IPv6 client picks from 2^64), and with
  // std::hash's fixed seed they could be picked to share one bucket, walked under this mutex.
  std::mutex peers_mu;
  std::map<std::string, uint32_t, std::less<>> peers;
  // Counts a connection from `host` in; false (nothing counted) at the limit.
  bool AdmitPeer(const std::string& host) {
    std::lock_guard lock(peers_mu);
    uint32_t& n = peers[host];
    if (n >= options.max_connections_per_peer) {
      if (n == 0) peers.erase(host);
      return false;
    }
    ++n;
    return true;
  }
  void ReleasePeer(const std::string& host) {
    std::lock_guard lock(peers_mu);
    if (auto it = peers.find(host); it != peers.end() && --it->second == 0) peers.erase(it);
  }
  // For the handshake (transport::Options::full): why a client from `peer` would be turned
  // away, or null.
  transport::BusyReason Full(std::string_view peer) {
    using transport::BusyReason;
    const uint32_t max = options.max_connections;
    if (max > 0 && connections.load() >= int64_t{max}) return BusyReason::kConnectionLimit;
    if (options.max_connections_per_peer == 0) return BusyReason::kUnstated;
    const std::string host = PeerHost(peer);
    std::lock_guard lock(peers_mu);
    auto it = peers.find(host);
    if (it != peers.end() && it->second >= options.max_connections_per_peer) {
      return BusyReason::kPeerLimit;
    }
    return BusyReason::kUnstated;
  }
  // The address part of a peer URI ("tcp://10.0.0.1:5000" -> "10.0.0.1"); the whole string when
  // it is not one (inproc:// peers are names).
  static std::string PeerHost(std::string_view peer) {
    auto ep = transport::ParseUri(peer);
    return ep.ok() ? ep.value().host : std::string(peer);
  }
  std::atomic<int64_t> throttled{0};  // times a connection went over its memory budget
  std::vector<std::function<void()>> shutdown_hooks;  // added before Start, run by Shutdown

  // Shutdown hand-off to Run(): RequestShutdown sets the flag and writes a byte to the pipe Run()
  // blocks on. Both are async-signal-safe (no lock, no allocation), as a signal handler needs.
  std::atomic<bool> shutdown_requested{false};
  int wake_read = -1, wake_write = -1;

  ServerCore() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) {
      wake_read = fds[0];
      wake_write = fds[1];
      fcntl(wake_write, F_SETFL, fcntl(wake_write, F_GETFL) | O_NONBLOCK);
    }
  }
  ~ServerCore() {
    if (wake_read >= 0) close(wake_read);
    if (wake_write >= 0) close(wake_write);
  }
  void WakeRun() {
    const int saved_errno = errno;  // a signal handler must leave errno as it found it
    shutdown_requested.store(true);
    if (wake_write >= 0) {
      const char byte = 1;
      [[maybe_unused]] ssize_t n = write(wake_write, &byte, 1);  // full pipe: already woken
    }
    errno = saved_errno;
  }
  void WaitForShutdownRequest() {
    while (!shutdown_requested.load()) {
      char buf[64];
      if (wake_read < 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      ssize_t n = read(wake_read, buf, sizeof buf);
      if (n < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Last, so that it is destroyed first: coroutine frames destroyed with an io_context still
  // touch the fields above.
  std::vector<std::unique_ptr<IoThread>> threads;
};

class ServerConnection final : public FrameEndpoint<ServerConnection>,
                               public CallSink,
                               public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(ServerCore* core, IoThread* thread, std::shared_ptr<transport::Connection> conn)
      : FrameEndpoint(conn->executor(), conn),
        core_(core),
        thread_(thread),
        executor_(conn_->executor()),
        peer_(std::make_shared<const std::string>(conn_->peer())),
        idle_timer_(executor_),
        break_timer_(executor_),
        room_timer_(executor_),
        stall_timer_(executor_) {}

  const transport::Executor& executor() const override { return executor_; }

  void Run(CallJobPtr job) override { thread_->handlers.Run(std::move(job)); }

  // Starts serving: SETTINGS first, so that the client knows its limits before its first call.
  // Over the connection limit, the client is told so with GOAWAY instead and the connection is
  // closed (by the client on reading it, or by us a moment later).
  void Begin() {
    thread_->connections.insert(shared_from_this());
    conn_->Start(shared_from_this());
    const int64_t max = core_->options.max_connections;
    const int64_t open = core_->connections.fetch_add(1) + 1;  // this one included
    if (max > 0 && open > max) {
      core_->connections.fetch_sub(1);
      static transport::LogLimit limit;
      transport::WarnLimited(limit, "server: turning {} away: at the limit of {} connections",
                             *peer_, max);
      return TurnAway(Status(StatusCode::kResourceExhausted,
                             "server is at its limit of " + std::to_string(max) + " connections"));
    }
    if (const uint32_t per_peer = core_->options.max_connections_per_peer; per_peer > 0) {
      peer_host_ = ServerCore::PeerHost(*peer_);
      if (!core_->AdmitPeer(peer_host_)) {
        core_->connections.fetch_sub(1);
        static transport::LogLimit limit;
        transport::WarnLimited(limit,
                               "server: turning {} away: at the limit of {} connections from {}",
                               *peer_, per_peer, peer_host_);
        return TurnAway(Status(StatusCode::kResourceExhausted,
                               "server is at its limit of " + std::to_string(per_peer) +
                                   " connections from one client address (" + peer_host_ +
                                   "; max_connections_per_peer)"));
      }
      peer_counted_ = true;
    }
    counted_ = true;
    Settings settings;
    settings.max_concurrent_calls = core_->options.max_concurrent_calls_per_connection;
    settings.max_message_bytes =
        static_cast<uint32_t>(std::min<size_t>(conn_->max_message_bytes(), UINT32_MAX));
    settings.features = kFeatureClientStreams;
    std::byte payload[kSettingsBytes];
    EncodeSettings(settings, payload);
    FrameHeader h;
    h.type = FrameType::kSettings;
    conn_->Send(
        FrameWriter(h, std::string_view(reinterpret_cast<const char*>(payload), sizeof payload)));
    WatchPeer(weak_from_this(), core_->options.keepalive_interval, core_->options.keepalive_timeout,
              [](ServerConnection& self, std::string why) {
                static transport::LogLimit limit;
                transport::WarnLimited(limit,
                                       "server: client {} is silent ({}); closing its connection",
                                       *self.peer_, why);
                self.Close();
              });
    if (core_->options.idle_timeout.count() > 0) WatchIdle();
    if (core_->draining.load()) SendGoAway(ShuttingDown());
  }

  void Close() {
    if (conn_) conn_->Close();
  }

  // Over a connection limit: the client is told so with GOAWAY and the connection closed (by
  // the client on reading it, or by us a moment later).
  void TurnAway(const Status& why) {
    transport::Count(transport::Stat::kRefusedLimit);
    SendGoAway(why);
    conn_->PauseReceiving();
    auto timer = std::make_shared<asio::steady_timer>(executor_, std::chrono::seconds(1));
    timer->async_wait(
        [self = shared_from_this(), timer](boost::system::error_code) { self->Close(); });
  }

  // Shutdown's close: the replies of the calls that just finished may still be queued (TCP
  // flushes at the end of the event-loop turn), so close once they have left, within a bound.
  void CloseAfterSending(int limit_ms) {
    if (conn_) conn_->CloseAfterSending(limit_ms);
  }

  // Tells the client to send no more calls here (see ChannelCore::OnGoAway). Once per connection.
  void SendGoAway(const Status& why, uint8_t flags = 0) {
    if (goaway_sent_ || !conn_ || conn_->closed()) return;
    goaway_sent_ = true;
    FrameHeader h;
    h.type = FrameType::kGoAway;
    h.flags = flags;
    h.status = static_cast<uint32_t>(why.code());
    conn_->Send(FrameWriter(h, StatusTextCut(why.message())));
  }

  static Status ShuttingDown() {
    return Status(StatusCode::kUnavailable, "server is shutting down");
  }

  // FrameEndpoint: the stream can no longer be trusted. Read nothing more from it, but let the
  // calls that arrived before the bad frame finish and deliver their replies, then close.
  // Everyone else is served as before.
  void OnMalformedFrame(const std::string& err) {
    static transport::LogLimit limit;
    transport::WarnLimited(limit, "server: malformed frame from {}: {}; closing that connection",
                           *peer_, err);
    Break(Status(StatusCode::kInvalidArgument, "malformed frame: " + err));
  }

  // FrameEndpoint: a frame from the client, decoded; `message_bytes` its size on the wire.
  // Inlined into FrameEndpoint::OnMessage, as it was before the two were split (a call and the
  // frame passed by reference cost ~20 instructions per message).
  [[gnu::always_inline]] void OnFrame(const DecodedFrame& f, size_t message_bytes) {
    if (!counted_ || broken_) return;  // turned away or broken: nothing more is served
    in_frame_ = true;  // FinishCall leaves the budget check to the end of this frame
    switch (f.header.type) {
      case FrameType::kRequest:
        ++requests_;
        OnRequest(f, message_bytes);
        break;
      case FrameType::kPing:
        AnswerPing(f);
        break;
      case FrameType::kCancel:
        OnCancel(f.header.call_id);
        break;
      case FrameType::kStreamMessage:
        OnStreamMessage(f);
        break;
      case FrameType::kWindow: {
        uint64_t bytes = 0;
        if (!DecodeWindow(f.payload, &bytes).empty()) {
          Break(Status(StatusCode::kInvalidArgument, "malformed WINDOW frame"));
        } else {
          OnWindow(f.header.call_id, bytes);
        }
        break;
      }
      default:
        // PONG needs nothing beyond keepalive_.Heard(); other types are not meant for a server
        // and are ignored, as the protocol specifies.
        break;
    }
    in_frame_ = false;
    Throttle();
  }

  void OnSendProgress() override { Throttle(); }

  bool OnReceiveHeld(size_t bytes, bool unfinished) override {
    receiving_ = bytes;
    unfinished_ = unfinished;
    if (unfinished) WatchStall();
    WaitForRoom();
    if (unfinished || bytes == 0) return true;
    // A buffer kept for the next large message (none arriving): only while the server is
    // within its bound, else it is given back (and this is told again with less).
    const size_t bound = core_->options.max_buffered_bytes;
    return bound == 0 || core_->receiving.load(std::memory_order_relaxed) <= int64_t(bound);
  }

  void OnClose(const transport::Error& reason) override {
    spdlog::debug("server: connection from {} closed: {}", *peer_, reason.message);
    keepalive_.Stop();
    idle_timer_.cancel();
    break_timer_.cancel();
    room_timer_.cancel();
    stall_timer_.cancel();
    receiving_ = 0;
    unfinished_ = false;
    if (std::exchange(waiting_room_, false)) core_->room_waiters.fetch_sub(1);
    core_->receiving.fetch_sub(int64_t(std::exchange(receiving_counted_, 0)),
                               std::memory_order_relaxed);
    ReleaseReceiveToken();
    conn_.reset();
    if (counted_) core_->connections.fetch_sub(1);
    counted_ = false;
    core_->buffered.fetch_sub(int64_t(std::exchange(reported_, 0)), std::memory_order_relaxed);
    if (peer_counted_) core_->ReleasePeer(peer_host_);
    peer_counted_ = false;
    // Nobody is left to answer: cancel what the connection's calls are doing.
    for (CancelHook* h = running_; h;) {
      CancelHook* next = h->next;
      h->Cancel();
      h = next;
    }
    thread_->ConnectionGone(shared_from_this());
  }

  void Track(CancelHook* hook) override {
    hook->prev = nullptr;
    hook->next = running_;
    if (running_) running_->prev = hook;
    running_ = hook;
    if (hook->streaming) streams_[hook->call_id] = hook;
  }

  void Untrack(CancelHook* hook) override {
    if (hook->prev) hook->prev->next = hook->next;
    if (hook->next) hook->next->prev = hook->prev;
    if (running_ == hook) running_ = hook->next;
    hook->prev = hook->next = nullptr;
    if (hook->streaming) streams_.erase(hook->call_id);
  }

  void StreamMessageTaken(uint64_t call_id, StreamInbox& inbox, size_t bytes,
                          size_t parsed_excess) override {
    held_bytes_ -= bytes + kStreamMessageHeldBytes;
    held_bytes_ = held_bytes_ - inbox.parsed_excess + parsed_excess;
    stream_excess_ = stream_excess_ - inbox.parsed_excess + parsed_excess;
    inbox.parsed_excess = parsed_excess;
    inbox.unreported += bytes;
    if (inbox.unreported >= kStreamWindowBytes / 2 && !inbox.ended && conn_ && !conn_->closed()) {
      SendWindow(*conn_, call_id, inbox.unreported);
      inbox.unreported = 0;
    }
    Throttle();
  }

  // Over it, receiving is paused (by Throttle after the send that crossed it, or by Break), so
  // OnSendProgress reports each step down and Throttle wakes the writers at half.
  bool OverBudget() override {
    if (!conn_ || !Over(BufferedBytes())) return false;
    writers_over_budget_ = true;
    return true;
  }

  bool SendStreamMessage(uint64_t call_id, const google::protobuf::MessageLite& message,
                         size_t* cost, Status* error) override {
    if (!conn_ || conn_->closed()) return false;
    FrameHeader h;
    h.type = FrameType::kStreamMessage;
    h.call_id = call_id;
    FrameWriter w(h, nullptr, &message);
    if (w.size() > conn_->max_message_bytes()) {
      *error = Status(StatusCode::kResourceExhausted,
                      OverLimitText("stream message", w.size(), conn_->max_message_bytes()));
      return false;
    }
    if (!conn_->Send(w)) return false;
    *cost = w.size();
    Throttle();
    return true;
  }

  ReplyFate FinishCall(uint64_t call_id, size_t request_bytes, const Status& status,
                       const google::protobuf::MessageLite* reply, bool deliver) override {
    core_->CallFinished();
    --calls_;
    held_bytes_ -= request_bytes;
    ++finished_;
    if (CallerGone()) return ReplyFate::kUndelivered;  // nothing to deliver
    ReplyFate fate = ReplyFate::kUnsized;
    FrameHeader h;
    h.type = FrameType::kResponse;
    h.call_id = call_id;
    if (!deliver) {
      // Cancelled by the caller, who has its answer already. The acknowledgement tells its
      // channel that the call no longer counts against this connection's limit.
      SendError(h, Status(StatusCode::kCancelled, "cancelled by the caller"));
    } else if (status.ok()) {
      FrameWriter w(h, nullptr, reply);
      if (w.size() <= conn_->max_message_bytes()) [[likely]] {
        conn_->Send(w);
        if (reply) fate = ReplyFate::kSent;
      } else {
        SendError(h, ReplyTooLarge(w.size()));
        fate = ReplyFate::kRefused;
      }
    } else {
      SendError(h, status);
    }
    if (broken_ && calls_ == 0) {
      conn_->CloseAfterSending(kCloseGraceMs);
      return fate;
    }
    // A call finished while its request frame is being handled (a handler that did not
    // suspend) is checked once, at that frame's end: checking here too cost ~40 instructions.
    if (!in_frame_) Throttle();
    return fate;
  }

  bool CallerGone() const override { return !conn_ || conn_->closed(); }

  Status CheckReply(size_t message_bytes) const override {
    const size_t frame_bytes = kFrameHeaderBytes + message_bytes;  // as FinishCall's FrameWriter
    if (!conn_ || frame_bytes <= conn_->max_message_bytes()) return Status();
    return ReplyTooLarge(frame_bytes);
  }

 private:
  // How long a connection closing after a protocol error or an idle GOAWAY waits for its last
  // frames to reach the client (or, idle, for the client to close first).
  static constexpr int kCloseGraceMs = 5000;

  // What the caller gets instead of a reply frame of `frame_bytes` over the message limit.
  [[gnu::cold]] Status ReplyTooLarge(size_t frame_bytes) const {
    return Status(StatusCode::kResourceExhausted,
                  OverLimitText("reply", frame_bytes, conn_->max_message_bytes()));
  }

  void SendError(FrameHeader h, const Status& status) {
    h.status = static_cast<uint32_t>(status.code());
    conn_->Send(FrameWriter(h, StatusTextCut(status.message())));
  }

  // What counts against the per-connection memory budget
  // (ServerOptions::max_buffered_bytes_per_connection): requests held by running calls plus
  // replies the client has not taken. (conn_ set.)
  size_t BufferedBytes() const { return held_bytes_ + conn_->queued_send_bytes(); }

  // Over the budget, stop receiving from this client (it can send no more than its transport
  // window) until it falls to half. Stream writers over the budget wait (OverBudget) until it
  // falls to half, broken or not.
  void Throttle() {
    if (!conn_) return;
    const size_t used = BufferedBytes();
    // The usual case, a connection holding little, paused for nothing and reported as holding
    // nothing: no bound can apply (see quiet_below_), and there is nothing to report.
    if (used < quiet_below_ && (reported_ | paused_ | writers_over_budget_) == 0) return;
    Report(used);
    if (writers_over_budget_ && BackUnder(used)) {
      writers_over_budget_ = false;
      for (auto& [id, hook] : streams_) hook->WakeWriter();
    }
    if (broken_) return;  // Break paused receiving for good
    if (!paused_ && Over(used)) {
      paused_ = true;
      ++core_->throttled;
      spdlog::debug("server: {} holds {} bytes (budget {}, server {} of {}): not reading from it",
                    *peer_, used, core_->options.max_buffered_bytes_per_connection,
                    core_->buffered.load(std::memory_order_relaxed),
                    core_->options.max_buffered_bytes);
      conn_->PauseReceiving();
    } else if (paused_ && !waiting_room_ && BackUnder(used)) {
      Resume();
    }
  }

  // Messages still arriving (ConnectionHandler::OnReceiveHeld): what all connections hold for
  // them is held to ServerOptions::max_buffered_bytes. A connection whose arriving message needs
  // more than fits waits (is not read) until it fits, so that many peers each sending most of a
  // large message cannot add up past the bound; what it asks for is counted only once it fits
  // (the transports say so before they take it). Waiting connections must not all wait
  // for each other (legitimate large calls, together over the bound, would never arrive): one
  // at a time goes on regardless, the one holding the server's receive token, until its
  // message has arrived. A connection that waits looks again on a timer (1 ms, doubling to
  // 64 ms): the room is made on other threads, and a timer needs no list of waiters shared
  // across them.
  [[gnu::noinline]] void WaitForRoom() {
    if (!conn_) return;
    const size_t bound = core_->options.max_buffered_bytes;
    bool wait = false;
    if (!unfinished_) ReleaseReceiveToken();  // the message it was let through for has arrived
    if (receiving_ <= receiving_counted_) {   // less (or nothing) now: give the rest back
      core_->receiving.fetch_sub(int64_t(receiving_counted_ - receiving_),
                                 std::memory_order_relaxed);
      receiving_counted_ = receiving_;
    } else {
      // More: only for a message arriving can it wait (a kept buffer is held already).
      const int64_t more = int64_t(receiving_ - receiving_counted_);
      if (bound != 0 && unfinished_ && !has_receive_token_ &&
          core_->receiving.load(std::memory_order_relaxed) + more > int64_t(bound)) {
        uint64_t none = 0;
        if (core_->receive_token.compare_exchange_strong(none, id_)) {
          has_receive_token_ = true;
        } else {
          wait = true;
        }
      }
      if (!wait) {
        core_->receiving.fetch_add(more, std::memory_order_relaxed);
        receiving_counted_ = receiving_;
      }
    }
    if (wait) {
      if (!waiting_room_) {
        waiting_room_ = true;
        core_->room_waiters.fetch_add(1);
        room_backoff_ms_ = 1;
        ++core_->throttled;
        spdlog::debug(
            "server: {} needs {} bytes for messages still arriving (the server holds {} of "
            "{} for such): not reading from it until they fit",
            *peer_, receiving_, core_->receiving.load(std::memory_order_relaxed), bound);
        if (!paused_) {
          paused_ = true;
          conn_->PauseReceiving();
        }
      }
      room_timer_.expires_after(std::chrono::milliseconds(room_backoff_ms_));
      room_backoff_ms_ = std::min(room_backoff_ms_ * 2, 64);
      room_timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
        if (auto self = weak.lock(); self && !ec) self->WaitForRoom();
      });
      return;
    }
    if (!waiting_room_) return;
    waiting_room_ = false;
    core_->room_waiters.fetch_sub(1);
    room_timer_.cancel();
    if (paused_ && !broken_ && !Over(BufferedBytes())) {
      Resume();
    }
  }

  // A large message arriving (told by OnReceiveHeld, which calls this each time it advances)
  // must keep arriving while other connections wait for room
  // (ServerOptions::stalled_message_timeout): a peer that sends part of one and stops would
  // otherwise keep its part of the bound, or the receive token and with it every other large
  // message, until the idle timeout. A paused connection (waiting for room, or over its budget)
  // is not read by the server, so that time does not count (nor, once it resumes, the time
  // before: Resume); nor does an RDMA rendezvous read's, which the peer cannot slow. One timer
  // per connection, set while a message arrives: nothing on the path of small messages.
  void WatchStall() {
    const auto timeout = core_->options.stalled_message_timeout;
    if (timeout.count() <= 0) return;
    advanced_at_ = std::chrono::steady_clock::now();
    if (!watching_stall_) ArmStall(advanced_at_ + timeout);
  }
  void ArmStall(std::chrono::steady_clock::time_point at) {
    watching_stall_ = true;
    stall_timer_.expires_at(at);
    stall_timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      if (auto self = weak.lock(); self && !ec) self->StallTick();
    });
  }
  void StallTick() {
    watching_stall_ = false;
    if (!conn_ || broken_ || !unfinished_) return;  // (no message arriving: nothing to watch)
    const auto timeout = core_->options.stalled_message_timeout;
    const auto now = std::chrono::steady_clock::now();
    // Not read meanwhile, or read by the transport itself (a rendezvous): not the peer's pace.
    if (paused_ || conn_->fetching_message()) advanced_at_ = now;
    if (now - advanced_at_ >= timeout && core_->room_waiters.load() > 0) {
      ++core_->stalled;
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - advanced_at_);
      static transport::LogLimit limit;
      transport::WarnLimited(
          limit,
          "server: {}'s message ({} bytes held for it) has not advanced for {} ms while others "
          "wait for room; closing its connection",
          *peer_, receiving_, ms.count());
      Break(Status(StatusCode::kUnavailable, "a large message stopped arriving for " +
                                                 std::to_string(ms.count()) +
                                                 " ms while the server had no room for others (its "
                                                 "stalled_message_timeout, " +
                                                 std::to_string(timeout.count()) + " ms)"));
      return;
    }
    // Still arriving, or stalled with no one waiting: look again when it would be overdue
    // (at least a quarter period on, so that a stall no one minds yet costs few wake-ups).
    ArmStall(std::max(advanced_at_ + timeout, now + timeout / 4));
  }

  // Reads again after Throttle or WaitForRoom paused receiving. A message arriving starts its
  // stall clock again (WatchStall): the peer could not send it meanwhile.
  [[gnu::noinline]] void Resume() {
    paused_ = false;
    if (watching_stall_) advanced_at_ = std::chrono::steady_clock::now();
    conn_->ResumeReceiving();
  }

  [[gnu::noinline]] void ReleaseReceiveToken() {
    if (!has_receive_token_) return;
    has_receive_token_ = false;
    core_->receive_token.store(0);
  }

  // Whether a connection holding `used` bytes must not be read: over its own budget, or over
  // its share while the server is over its total (ServerOptions::max_buffered_bytes).
  bool Over(size_t used) const {
    const size_t budget = core_->options.max_buffered_bytes_per_connection;
    return (budget != 0 && used > budget) || OverShare(used);
  }
  // Whether a paused connection holding `used` bytes may be read again: back to half of both.
  bool BackUnder(size_t used) const {
    const size_t budget = core_->options.max_buffered_bytes_per_connection;
    return (budget == 0 || used <= budget / 2) && !OverShare(2 * used);
  }
  bool OverShare(size_t used) const {
    const size_t total = core_->options.max_buffered_bytes;
    if (total == 0 || core_->buffered.load(std::memory_order_relaxed) <= int64_t(total)) {
      return false;
    }
    const int64_t n = std::max<int64_t>(core_->connections.load(std::memory_order_relaxed), 1);
    return used > total / size_t(n);
  }
  // Tells the server what this connection holds when it has moved by kReportGrain or more (or
  // to nothing): a shared atomic for large changes only, not on every call.
  void Report(size_t used) {
    const int64_t delta = int64_t(used) - int64_t(reported_);
    if (delta < kReportGrain && delta > -kReportGrain && (used != 0 || reported_ == 0)) return;
    core_->buffered.fetch_add(delta, std::memory_order_relaxed);
    reported_ = used;
  }
  static constexpr int64_t kReportGrain = 32 << 10;

  // A protocol error: tell the client why (GOAWAY), take nothing more from it, and close once
  // the calls that arrived before the error have delivered their replies, or after
  // kCloseGraceMs whatever they are doing (a handler waiting for its caller would wait forever:
  // nothing more is read from this connection, its close included). Client streams are
  // cancelled at once: the rest of their input will never come, and ending them as if the
  // caller had half-closed would pass a truncated stream off as whole.
  void Break(const Status& why) {
    if (broken_ || !conn_) return;
    broken_ = true;
    conn_->PauseReceiving();
    SendGoAway(why);
    if (calls_ == 0) {
      conn_->CloseAfterSending(kCloseGraceMs);
      return;
    }
    for (CancelHook* h = running_; h;) {
      CancelHook* next = h->next;
      if (h->inbox) h->Cancel();
      h = next;
    }
    break_timer_.expires_after(std::chrono::milliseconds(kCloseGraceMs));
    std::weak_ptr<ServerConnection> weak = shared_from_this();
    break_timer_.async_wait([weak](boost::system::error_code ec) {
      if (auto self = weak.lock(); self && !ec) self->Close();
    });
  }

  // Idle timeout: a connection with no call running that has started or finished no call for a
  // whole idle_timeout gets GOAWAY (flagged idle: the client reconnects when it next needs to)
  // and is closed. PINGs are not activity. Checked by a timer twice per timeout, so the work per
  // call is one counter increment.
  void WatchIdle() {
    const auto period = core_->options.idle_timeout / 2;
    idle_timer_.expires_after(
        std::max<std::chrono::milliseconds>(period, std::chrono::milliseconds(1)));
    std::weak_ptr<ServerConnection> weak = shared_from_this();
    idle_timer_.async_wait([weak](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || !self->conn_) return;
      self->IdleTick();
    });
  }

  void IdleTick() {
    const uint64_t activity = started_ + finished_;
    if (calls_ > 0 || activity != activity_seen_) {
      activity_seen_ = activity;
      quiet_ticks_ = 0;
    } else if (++quiet_ticks_ >= 2) {
      if (idle_goaway_) {
        // Told to go a grace period ago and still here: not one of our channels.
        Close();
        return;
      }
      spdlog::debug("server: {} idle for {} ms; sending GOAWAY", *peer_,
                    core_->options.idle_timeout.count());
      idle_goaway_ = true;
      SendGoAway(
          Status(StatusCode::kUnavailable, "connection idle for " +
                                               std::to_string(core_->options.idle_timeout.count()) +
                                               " ms; reconnect when needed"),
          kGoAwayFlagIdle);
      // Our channels close at once on an idle GOAWAY; a call that crossed it is still served.
      // Whoever is still here after the grace period is closed by the next ticks.
      quiet_ticks_ = 0;
    }
    WatchIdle();
  }

  // The caller gave up on a call (cancelled it, or its deadline passed). Cancels are rare, so a
  // walk over the running calls is cheaper than indexing every call. But a walk costs up to
  // max_concurrent_calls_per_connection steps, a CANCEL only a header: a peer that keeps
  // 1,000 calls running and floods CANCELs for calls that do not exist held an I/O thread at
  // ~6 us a frame. A caller cancels only calls it has requested, once each: one whose CANCELs
  // outnumber its REQUESTs by more than kCancelSlack is in breach of protocol.
  void OnCancel(uint64_t call_id) {
    if (++cancels_ > requests_ + kCancelSlack) [[unlikely]] {
      static transport::LogLimit limit;
      transport::WarnLimited(limit,
                             "server: {} sent {} CANCELs for {} requests; closing its connection",
                             *peer_, cancels_, requests_);
      Break(Status(StatusCode::kInvalidArgument,
                   "more CANCEL frames (" + std::to_string(cancels_) + ") than requests (" +
                       std::to_string(requests_) + ") on this connection"));
      return;
    }
    for (CancelHook* h = running_; h; h = h->next) {
      if (h->call_id == call_id) {
        h->Cancel();
        return;
      }
    }
  }

  // The caller read more of a stream: the writer may send that much more. A WINDOW for a call
  // that has ended (crossed its end on the wire) is ignored.
  void OnWindow(uint64_t call_id, uint64_t bytes) {
    if (auto it = streams_.find(call_id); it != streams_.end()) it->second->AddCredit(bytes);
  }

  // A message of a client stream (or its half-close), kept for the handler's Read. Its bytes
  // count against the connection's memory budget until read. One for a call that has ended is
  // dropped (it crossed the end on the wire); one past the stream's window, after the
  // half-close, or for a call that takes no messages breaks the protocol.
  void OnStreamMessage(const DecodedFrame& f) {
    auto it = streams_.find(f.header.call_id);
    if (it == streams_.end()) return;
    CancelHook* hook = it->second;
    StreamInbox* in = hook->inbox;
    if (in == nullptr) {
      Break(Status(StatusCode::kInvalidArgument, "STREAM_MESSAGE for a call that takes none"));
      return;
    }
    if (in->ended) {
      Break(Status(StatusCode::kInvalidArgument, "STREAM_MESSAGE after the caller's half-close"));
      return;
    }
    if (f.header.flags & kStreamFlagEnd) {
      in->ended = true;
      hook->WakeReader();
      return;
    }
    if (in->buffered + in->unreported >= kStreamWindowBytes) {
      Break(
          Status(StatusCode::kInvalidArgument, "client sent past a stream's flow-control window"));
      return;
    }
    if (hook->context->cancelled()) return;  // nobody will read it
    in->messages.Push(f.payload);
    const size_t cost = kFrameHeaderBytes + f.payload.size();
    in->buffered += cost;
    held_bytes_ += cost + kStreamMessageHeldBytes;
    hook->WakeReader();
  }

  void OnRequest(const DecodedFrame& f, size_t bytes) {
    FrameHeader reply;
    reply.type = FrameType::kResponse;
    reply.call_id = f.header.call_id;
    if (core_->draining.load(std::memory_order_relaxed)) {
      SendError(reply, ShuttingDown());
      return;
    }
    const uint32_t limit = core_->options.max_concurrent_calls_per_connection;
    if (limit != 0 && calls_ >= limit) {
      // Our channel never gets here (it waits for room); a client that ignored SETTINGS does.
      SendError(reply, Status(StatusCode::kResourceExhausted,
                              "too many concurrent calls on this connection (limit " +
                                  std::to_string(limit) + ")"));
      return;
    }
    const ServerCore::HostedMethod* found = last_hosted_;
    if (f.header.method_id != last_method_id_ || found == nullptr) {
      found = FindMethod(f.header.method_id);
      if (found == nullptr) {
        char id[16];
        std::snprintf(id, sizeof id, "0x%08x", f.header.method_id);
        SendError(reply, Status(StatusCode::kUnimplemented,
                                std::string(kUnknownMethodPrefix) + id + " on this server"));
        return;
      }
    }
    Metadata md;
    // What the call holds until it ends, counted against the budgets: its bytes, the runtime's
    // state for it, and the strings its metadata was decoded into (64 KiB of empty entries
    // took ten times their bytes; two clients opening streams with such metadata held 357 MiB
    // of a server bounded at 2 x 16 MiB). See kCallHeldBytes.
    size_t held = bytes + kCallHeldBytes;
    if (!f.metadata.empty()) [[unlikely]] {
      const size_t entries = CountMetadataEntries(f.metadata);
      if (entries > kMaxMetadataEntries) {
        SendError(
            reply,
            Status(StatusCode::kResourceExhausted,
                   "call metadata of more than " + std::to_string(kMaxMetadataEntries) +
                       " entries exceeds the limit of " + std::to_string(kMaxMetadataEntries)));
        return;
      }
      std::string err = DecodeMetadata(f.metadata, &md, entries);
      if (!err.empty()) {
        SendError(reply, Status(StatusCode::kInvalidArgument, "bad call metadata: " + err));
        return;
      }
      held += md.capacity() * kMetadataEntryHeldBytes;
    }
    const ServerCore::HostedMethod& hosted = *found;
    const MethodEntry* entry = hosted.entry;
    const auto called_as = static_cast<MethodKind>(
        f.header.flags & (kRequestFlagClientStream | kRequestFlagServerStream));
    if (called_as != entry->info.kind) {
      // Client and server were built from different definitions of the method.
      SendError(reply, Status(StatusCode::kUnimplemented,
                              "method " + std::string(entry->info.full_name) + " is " +
                                  MethodKindName(entry->info.kind) +
                                  " on this server, but the caller called it as " +
                                  MethodKindName(called_as)));
      return;
    }
    // What the request will take once parsed, where that can be far more than its bytes (many
    // small or unknown fields: rpc/internal/decoded_size.h), is what the call holds.
    if (f.payload.size() >= kDecodedCheckFromBytes) [[unlikely]] {
      if (!CountDecoded(*entry, f.payload, reply, held)) return;
    }
    // One clock read serves the deadline and the interceptors' timing, and none is made for a
    // call with neither.
    ServerContext::Clock::time_point now{};
    if (f.header.timeout_us != 0 || hosted.observed) now = ServerContext::Clock::now();
    const auto deadline = DeadlineFromBudget(f.header.timeout_us, now);
    core_->in_flight.fetch_add(1, std::memory_order_relaxed);
    ++calls_;
    ++started_;
    held_bytes_ += held;
    // The context is built in the call (moving it in from here cost ~50 instructions per call).
    // An inline handler's call ends before Start returns, while the transport's handler slot
    // still holds this connection (its close notice is always posted, transport/handler_slot.h),
    // so the call holds the connection and its peer string without owning them: no reference
    // counts to raise and drop (~70 instructions per call). A coroutine's call may outlive
    // both, and owns them.
    const bool ends_inline = entry->handler->runs_inline();
    ServerCall call(ends_inline ? Unowned(static_cast<CallSink*>(this)) : shared_from_this(),
                    f.header.call_id, held, ends_inline ? Unowned(peer_.get()) : peer_,
                    entry->info.full_name, deadline, std::move(md));
    ContextAccess::CountReceived(call.context(), f.payload.size());
    if (hosted.observed) [[unlikely]] {
      if (hosted.stats) hosted.stats->Started();
      if (!hosted.interceptors.empty()) {
        if (!StartInterceptors(hosted, call, now)) return;
      } else {
        call.Observe(nullptr, hosted.stats, now);
      }
    }
    entry->handler->Start(*hosted.service, std::move(call), f.payload);
  }

  // What a connection may hold in all: its budget, else the server's; no bound when neither.
  size_t ParsedAllowance() const override {
    const ServerOptions& o = core_->options;
    if (o.max_buffered_bytes_per_connection != 0) return o.max_buffered_bytes_per_connection;
    return o.max_buffered_bytes != 0 ? o.max_buffered_bytes : SIZE_MAX;
  }

  size_t StreamParsedAllowance(const StreamInbox& inbox) const override {
    const size_t allowed = ParsedAllowance();
    const size_t others = stream_excess_ - inbox.parsed_excess;
    return allowed > others ? allowed - others : 0;
  }
  void StreamExcessReleased(size_t parsed_excess) override { stream_excess_ -= parsed_excess; }

  // Adds to `held` what `payload` will take once parsed beyond its own bytes. A request that
  // would take more beyond them than the connection may hold in all (its budget, else the
  // server's) is refused with RESOURCE_EXHAUSTED (false): it could only be held by going past
  // the bound, and a message of large fields is never refused for this. Out of line: requests
  // of kDecodedCheckFromBytes and more only.
  [[gnu::noinline]] bool CountDecoded(const MethodEntry& entry, std::span<const std::byte> payload,
                                      const FrameHeader& reply, size_t& held) {
    const google::protobuf::Descriptor* type = entry.handler->request_type();
    if (type == nullptr) return true;
    const size_t excess = DecodedExcess(*type, payload);
    const size_t allowed = ParsedAllowance();
    if (excess > allowed) {
      SendError(reply, Status(StatusCode::kResourceExhausted,
                              ParsedTooLargeText("request", payload.size(), excess, allowed,
                                                 kParsedAllowanceIs)));
      return false;
    }
    held += excess;
    return true;
  }

  // The interceptors' OnStart, in order. False when one of them rejected the call (then it has
  // ended). Out of line: a server without them pays one test per call.
  [[gnu::noinline]] static bool StartInterceptors(const ServerCore::HostedMethod& hosted,
                                                  ServerCall& call,
                                                  ServerContext::Clock::time_point now) {
    const ServerInterceptors& interceptors = hosted.interceptors;
    for (size_t i = 0; i < interceptors.size(); ++i) {
      if (Status s = interceptors[i]->OnStart(call.context()); !s.ok()) [[unlikely]] {
        RejectedByInterceptor(interceptors, i, hosted.stats, call, std::move(s), now);
        return false;
      }
    }
    call.Observe(&interceptors, hosted.stats, now);
    return true;
  }

  // Interceptor `rejecter` turned the call away with `s`: those before it, which let it
  // through, hear how it ended; the handler never runs, and the call ends with the
  // interceptor's Status (as the handler's error would). Out of line: the rare path.
  // A metrics recorder the runtime runs itself (`stats`, first in the list) hears it last, as
  // call.Finish ends the call.
  [[gnu::noinline, gnu::cold]] static void RejectedByInterceptor(
      const ServerInterceptors& interceptors, size_t rejecter, MethodStats* stats, ServerCall& call,
      Status s, ServerContext::Clock::time_point started) {
    const auto elapsed = ServerContext::Clock::now() - started;
    while (rejecter-- > 0) interceptors[rejecter]->OnFinish(call.context(), s, elapsed);
    if (stats) call.Observe(nullptr, stats, started);
    call.Finish(s, nullptr);
  }

  // The method table look-up, out of line; remembers what it found for the next request (the
  // table is fixed once the server has started, so the pointer stays valid). A connection's
  // calls mostly go to one method: checking the last one first saves the hash table's look-up
  // (a division and a walk, ~25 instructions per call).
  [[gnu::noinline]] const ServerCore::HostedMethod* FindMethod(uint32_t method_id) {
    auto it = core_->methods.find(method_id);
    if (it == core_->methods.end()) return nullptr;
    last_method_id_ = method_id;
    last_hosted_ = &it->second;
    return last_hosted_;
  }

  ServerCore* core_;
  IoThread* thread_;
  transport::Executor executor_;
  // Shared with each call's ServerContext: one string per connection, not a copy per call.
  std::shared_ptr<const std::string> peer_;
  asio::steady_timer idle_timer_;
  asio::steady_timer break_timer_;  // closes a broken connection whose calls do not end
  asio::steady_timer room_timer_;   // WaitForRoom looks again
  asio::steady_timer stall_timer_;  // WatchStall looks again
  uint32_t calls_ = 0;              // running on this connection
  uint32_t last_method_id_ = 0;     // the method of the last request (see FindMethod)
  const ServerCore::HostedMethod* last_hosted_ = nullptr;
  size_t held_bytes_ = 0;  // request bytes of the running calls
  // StreamInbox::parsed_excess over this connection's streams (StreamParsedAllowance): also in
  // held_bytes_, but that is paused on, not refused on, and its handlers may all hold at once.
  size_t stream_excess_ = 0;
  uint64_t started_ = 0, finished_ = 0, activity_seen_ = 0;
  // REQUEST and CANCEL frames received (OnCancel): a caller cancels only what it requested.
  uint64_t requests_ = 0, cancels_ = 0;
  static constexpr uint64_t kCancelSlack = 64;
  int quiet_ticks_ = 0;
  bool counted_ = false;  // served (false: turned away at the connection limit)
  // Counted in ServerCore::peers under this address (max_connections_per_peer).
  bool peer_counted_ = false;
  std::string peer_host_;
  bool goaway_sent_ = false;
  bool idle_goaway_ = false;
  bool paused_ = false;  // receiving paused by Throttle (or WaitForRoom)
  // Messages still arriving (WaitForRoom): what this connection holds (or, over RDMA, is about
  // to take) for them; waiting for room; holding the server's receive token.
  const uint64_t id_ = core_->next_connection_id.fetch_add(1);
  size_t receiving_ = 0;          // as the transport last said
  bool unfinished_ = false;       // (both)
  size_t receiving_counted_ = 0;  // of that, what fitted and is counted in core_->receiving
  bool waiting_room_ = false;     // (counted in core_->room_waiters)
  bool has_receive_token_ = false;
  int room_backoff_ms_ = 1;
  // When the message arriving last advanced (or the server last let it: see WatchStall), and
  // whether stall_timer_ is set to look at it.
  std::chrono::steady_clock::time_point advanced_at_;
  bool watching_stall_ = false;
  bool writers_over_budget_ = false;  // a stream writer waits for the budget (OverBudget)
  size_t reported_ = 0;               // what this connection last added to core_->buffered (Report)
  // Below this a connection is over no bound and has nothing to report: the smaller of
  // kReportGrain and the per-connection budget (both bounds off: no limit at all). (A share of
  // the server-wide bound under kReportGrain is not kept: it is tracked to within that.)
  const size_t quiet_below_ = QuietBelow(core_->options);
  static size_t QuietBelow(const ServerOptions& o) {
    if (o.max_buffered_bytes_per_connection == 0 && o.max_buffered_bytes == 0) return SIZE_MAX;
    size_t q = size_t(kReportGrain);
    if (o.max_buffered_bytes_per_connection != 0) {
      q = std::min(q, o.max_buffered_bytes_per_connection + 1);
    }
    return q;
  }
  bool in_frame_ = false;          // inside OnFrame, which runs Throttle at its end
  bool broken_ = false;            // protocol error: closing once its calls are done
  CancelHook* running_ = nullptr;  // calls that a CANCEL may still reach
  // The streaming calls among them, by call id: their WINDOW and STREAM_MESSAGE frames come
  // often, so they are found without a walk. A tree, not a hash table: the ids are the peer's
  // choice, and a hash of an integer is the integer, so a peer could put all its streams in one
  // bucket and make each of its frames walk them (at the default 1,024 calls, ~5 us a frame
  // instead of ~50 ns; hostile_tcp_test). Here no choice of ids costs more than ~10 compares.
  std::map<uint64_t, CancelHook*> streams_;
};

asio::awaitable<bool> ServerStream::Writable() {
  for (;;) {
    if (Over()) co_return false;
    if (call_.hook().credit > 0 && !call_.sink()->OverBudget()) co_return true;
    // Out of credit: wait for the caller's WINDOW (or its cancel, or the connection's end).
    // Over the connection's budget: wait for its client to take what is queued.
    co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(
        [this](auto handler) {
          asio::any_completion_handler<void()>(std::move(handler)).swap(call_.hook().credit_waiter);
        },
        asio::use_awaitable);
  }
}

asio::awaitable<bool> ServerStream::Write(const google::protobuf::MessageLite& message) {
  // The usual case, credit and room, tested here without Writable's coroutine frame.
  if (Over()) co_return false;
  if (call_.hook().credit <= 0 || call_.sink()->OverBudget()) {
    if (!co_await Writable()) co_return false;
  }
  size_t cost = 0;
  if (!call_.sink()->SendStreamMessage(call_.call_id(), message, &cost, &error_)) co_return false;
  ContextAccess::CountSent(call_.context(), cost - kFrameHeaderBytes);
  call_.hook().credit -= static_cast<int64_t>(cost);
  // A Write with credit and room completes without suspending, so a handler writing in a loop
  // would keep its I/O thread until out of credit or over the budget -- 16 MiB by default for a
  // client that grants credit freely -- while the other connections on that thread wait. Every
  // kYieldEveryBytes it goes to the back of the thread's queue instead (the reactor looks for
  // other connections' data on the way), and what it wrote meanwhile is flushed.
  if ((unyielded_bytes_ += cost) >= kYieldEveryBytes) [[unlikely]] {
    unyielded_bytes_ = 0;
    co_await YieldTo(co_await asio::this_coro::executor);
    // Cancelled (or the connection gone) meanwhile: the call is over, and the handler must hear
    // it from this Write -- its next co_await would throw operation_aborted (Asio's rule for a
    // coroutine whose cancellation state is cancelled) instead of returning false.
    if (Over()) co_return false;
  }
  co_return true;
}

asio::awaitable<bool> ServerStream::Read(google::protobuf::MessageLite& out) {
  for (;;) {
    const StreamTry got = TryRead(out);
    if (got != StreamTry::kWait) co_return got == StreamTry::kDone;
    // Nothing yet: wait for the caller's next message, its half-close, or the call's end.
    StreamInbox& in = *call_.hook().inbox;
    co_await asio::async_initiate<decltype(asio::use_awaitable), void()>(
        [&in](auto handler) {
          asio::any_completion_handler<void()>(std::move(handler)).swap(in.reader);
        },
        asio::use_awaitable);
  }
}

StreamTry ServerStream::TryRead(google::protobuf::MessageLite& out) {
  StreamInbox& in = *call_.hook().inbox;
  if (Over()) return StreamTry::kOver;
  if (in.messages.empty()) return in.ended ? StreamTry::kOver : StreamTry::kWait;
  const size_t bytes = in.messages.FrontSize();
  size_t excess = 0;
  const size_t allowed = call_.sink()->StreamParsedAllowance(in);
  const StreamQueue::Popped popped = in.messages.PopInto(out, allowed, &excess);
  const size_t cost = kFrameHeaderBytes + bytes;
  in.buffered -= cost;
  call_.sink()->StreamMessageTaken(call_.call_id(), in, cost,
                                   popped == StreamQueue::Popped::kParsed ? excess : 0);
  ContextAccess::CountReceived(call_.context(), bytes);
  if (popped == StreamQueue::Popped::kParsed) [[likely]]
    return StreamTry::kDone;
  if (popped == StreamQueue::Popped::kTooLarge) {
    const bool shared = allowed < call_.sink()->ParsedAllowance();
    error_ = Status(StatusCode::kResourceExhausted,
                    ParsedTooLargeText("stream message", bytes, excess, allowed,
                                       shared ? kStreamAllowanceIs : kParsedAllowanceIs));
  } else {
    error_ = Status(StatusCode::kInvalidArgument,
                    "stream message does not parse as " + out.GetTypeName());
  }
  return StreamTry::kOver;
}

}  // namespace internal

const char* MethodKindName(MethodKind kind) {
  switch (kind) {
    case MethodKind::kUnary:
      return "unary";
    case MethodKind::kClientStreaming:
      return "client-streaming";
    case MethodKind::kServerStreaming:
      return "server-streaming";
    case MethodKind::kBidiStreaming:
      return "bidirectional-streaming";
  }
  return "unknown";
}

Server::Server(ServerOptions options) : core_(std::make_shared<internal::ServerCore>()) {
  if (options.io_threads < 1) options.io_threads = 1;
  core_->options = options;
  for (int i = 0; i < options.io_threads; ++i) {
    core_->threads.push_back(std::make_unique<internal::IoThread>());
  }
}

Server::~Server() { Shutdown(); }

Status Server::AddService(Service& service) {
  if (core_->started) {
    return Status(StatusCode::kFailedPrecondition, "AddService after Start");
  }
  for (const MethodEntry& m : service.rdmarpc_methods()) {
    auto it = core_->methods.find(m.info.id);
    if (it != core_->methods.end()) {
      return Status(StatusCode::kAlreadyExists, "method " + std::string(m.info.full_name) +
                                                    " has the same id as " +
                                                    std::string(it->second.entry->info.full_name));
    }
  }
  for (const MethodEntry& m : service.rdmarpc_methods()) {
    internal::ServerCore::HostedMethod hosted{&service, &m, {}};
    for (const auto& i : core_->options.interceptors) {
      auto bound = i->ForMethod(m.info);
      hosted.interceptors.push_back(bound ? std::move(bound) : i);
    }
    hosted.stats =
        internal::LeadingRecorderStats<internal::ServerStatsRecorder>(hosted.interceptors);
    if (hosted.stats) {
      hosted.recorder = std::move(hosted.interceptors.front());
      hosted.interceptors.erase(hosted.interceptors.begin());
    }
    hosted.observed = hosted.stats || !hosted.interceptors.empty();
    core_->methods.emplace(m.info.id, std::move(hosted));
  }
  core_->services.push_back(&service);
  return Status();
}

Result<std::string> Server::Listen(const std::string& uri) {
  if (core_->stopped) return Status(StatusCode::kFailedPrecondition, "server is shut down");
  std::vector<transport::Executor> executors;
  for (auto& t : core_->threads) executors.push_back(t->ioc.get_executor());
  internal::ServerCore* core = core_.get();
  transport::Options options = core_->options.transport;
  // At a connection limit a new client is refused in its handshake (busy: RESOURCE_EXHAUSTED)
  // before anything is set up for it; Begin's GOAWAY remains for clients that pass here
  // together and find the server full after. (The listener is closed before the core goes.)
  if (core_->options.max_connections > 0 || core_->options.max_connections_per_peer > 0) {
    options.full = [core](std::string_view peer) { return core->Full(peer); };
  }
  auto listener = transport::Listen(
      uri, executors,
      [core](std::shared_ptr<transport::Connection> conn) {
        if (core->draining) {
          conn->Close();
          return;
        }
        internal::IoThread* thread = nullptr;
        for (auto& t : core->threads) {
          if (t->ioc.get_executor() == conn->executor()) thread = t.get();
        }
        auto sc = std::make_shared<internal::ServerConnection>(core, thread, std::move(conn));
        sc->Begin();
      },
      options);
  if (!listener.ok()) return Status(StatusCode::kUnavailable, listener.error().message);
  std::string bound = listener.value()->uri();
  core_->listeners.push_back(std::move(listener.value()));
  spdlog::info("rdmarpc server listening on {}", bound);
  return bound;
}

void Server::Start() {
  if (core_->started.exchange(true)) return;
  for (auto& t : core_->threads) t->loop.Start();
}

void Server::RequestShutdown() { core_->WakeRun(); }

void Server::Run() {
  Start();
  std::optional<asio::signal_set> signals;
  if (core_->options.handle_signals) {
    signals.emplace(core_->threads[0]->ioc, SIGINT, SIGTERM);
    signals->async_wait([this](boost::system::error_code ec, int sig) {
      if (ec) return;
      spdlog::info("rdmarpc server: signal {} received; draining", sig);
      RequestShutdown();
    });
  }
  core_->WaitForShutdownRequest();
  if (signals) {
    asio::post(core_->threads[0]->ioc, [&signals] { signals->cancel(); });
  }
  Shutdown();
}

void Server::AddShutdownHook(std::function<void()> hook) {
  core_->shutdown_hooks.push_back(std::move(hook));
}

// How long Shutdown waits for a connection's last replies to leave before closing it anyway (a
// client that does not read would otherwise hold the shutdown up).
constexpr int kShutdownFlushMs = 2000;

void Server::Shutdown() {
  if (core_->stopped.exchange(true)) return;
  for (auto& hook : core_->shutdown_hooks) hook();
  if (core_->started && core_->options.shutdown_grace.count() > 0) {
    // Still serving, listeners included: whoever polls health sees NOT_SERVING and moves away.
    std::this_thread::sleep_for(core_->options.shutdown_grace);
  }
  core_->draining = true;
  for (auto& l : core_->listeners) l->Close();
  if (core_->started) {
    // GOAWAY first, so that clients stop sending here while the calls already running finish.
    for (auto& t : core_->threads) {
      asio::post(t->ioc, [th = t.get()] {
        for (auto& c : th->connections) c->SendGoAway(internal::ServerConnection::ShuttingDown());
      });
    }
    // Drain: let in-flight calls finish (requests that still arrive get UNAVAILABLE).
    {
      std::unique_lock<std::mutex> lock(core_->drain_mu);
      core_->drained.wait_for(lock, core_->options.drain_timeout,
                              [this] { return core_->in_flight.load() == 0; });
    }
    if (core_->in_flight.load() > 0) {
      spdlog::warn("rdmarpc server: {} calls still running after the drain timeout; closing",
                   core_->in_flight.load());
    }
    // Close every connection on its own thread once what it has queued (the last replies, the
    // GOAWAY) has left, and keep the loops running until every close has gone through: a loop
    // stopped earlier would drop replies still waiting for their end-of-turn flush.
    std::vector<std::future<void>> closed;
    for (auto& t : core_->threads) {
      // Shared with the handler: a loop too slow to run it before the deadline runs it later,
      // from the poll() below, after this scope is gone (TSan: heap-use-after-free on a starved
      // VM).
      auto all_closed = std::make_shared<std::promise<void>>();
      closed.push_back(all_closed->get_future());
      asio::post(t->ioc, [th = t.get(), all_closed] {
        if (th->connections.empty()) {
          all_closed->set_value();
          return;
        }
        th->all_closed = all_closed;
        auto conns = th->connections;  // closing mutates the set
        for (auto& c : conns) c->CloseAfterSending(kShutdownFlushMs);
      });
    }
    const auto flush_deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kShutdownFlushMs + 500);
    for (size_t i = 0; i < core_->threads.size(); ++i) {
      (void)closed[i].wait_until(flush_deadline);
      core_->threads[i]->loop.StopAndJoin();
    }
  }
  // Run what the loops left queued (close notifications) on this thread, now that theirs are
  // gone. Handlers still suspended are destroyed with their io_context later; their ServerCall
  // destructors find the connection closed and send nothing.
  for (auto& t : core_->threads) {
    t->ioc.restart();
    t->ioc.poll();
    t->connections.clear();
  }
  core_->listeners.clear();
  core_->WakeRun();
}

std::vector<const Service*> Server::services() const { return core_->services; }

std::vector<std::string> Server::listening_uris() const {
  std::vector<std::string> out;
  for (auto& l : core_->listeners) out.push_back(l->uri());
  return out;
}

int64_t Server::in_flight_calls() const { return core_->in_flight.load(); }

int64_t Server::connections_in_setup() const {
  int64_t n = 0;
  for (auto& l : core_->listeners) n += l->connections_in_setup();
  return n;
}

int64_t Server::connections() const { return core_->connections.load(); }

int64_t Server::throttle_events() const { return core_->throttled.load(); }
int64_t Server::buffered_bytes() const { return core_->buffered.load(); }
int64_t Server::receiving_bytes() const { return core_->receiving.load(); }
int64_t Server::stalled_messages() const { return core_->stalled.load(); }

}  // namespace rdmarpc

#include "rpc/channel.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdint>
#include <future>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rpc/internal/call_table.h"
#include "rpc/internal/decoded_size.h"
#include "rpc/internal/endpoint.h"
#include "rpc/internal/frame_writer.h"
#include "rpc/internal/keepalive.h"
#include "rpc/internal/parked.h"
#include "rpc/internal/parse.h"
#include "rpc/internal/reconnector.h"
#include "transport/factory.h"

namespace rdmarpc {
namespace asio = boost::asio;

namespace internal {

// A failed connection attempt as callers see it: RESOURCE_EXHAUSTED when the server refused
// for lack of room (connections, descriptors), else UNAVAILABLE.
Status ConnectError(const transport::Error& e) {
  return Status(e.busy ? StatusCode::kResourceExhausted : StatusCode::kUnavailable, e.message);
}

// A server's status text. Text beyond the protocol's kMaxStatusMessageBytes (a broken or hostile
// server's) is dropped, and the message says how much was: a caller's logs get the start of it,
// not megabytes.
std::string ServerText(std::string_view message) {
  const std::string_view kept = StatusTextCut(message);
  if (kept.size() == message.size()) return std::string(message);
  return std::string(kept) + " [" + std::to_string(message.size() - kept.size()) +
         " more bytes from the server not shown]";
}

// A failure status from the server's frame. A code this build does not define (a newer server's,
// or a broken one's) reads as UNKNOWN, as gRPC does, so that callers' switches over StatusCode
// stay exhaustive; the number the server sent is kept in the message.
Status ServerStatus(uint32_t code, std::string_view message) {
  if (code <= static_cast<uint32_t>(StatusCode::kUnauthenticated)) {
    return Status(static_cast<StatusCode>(code), ServerText(message));
  }
  return Status(StatusCode::kUnknown, ServerText(message) + " (status code " +
                                          std::to_string(code) + " from the server)");
}

// How long a call whose caller gave up (deadline, cancel) still counts against the server's
// concurrency limit while the server does not acknowledge its CANCEL. A handler that ignores
// cancellation keeps the server counting the call, so the channel waits for the answer rather
// than send a call the server would refuse; but a server that lost the call (or never answers:
// a hung or hostile one) would hold that room for good, and with every slot of its limit held
// so, no call could ever be sent again on the connection.
constexpr auto kAbandonedGrace = std::chrono::seconds(10);

// The client state of a channel: pending-call slots indexed by call id, the connection (replaced
// when it is lost and the channel reconnects), and the queue of calls waiting for room. Lives on
// one thread; no locks. A call id is (slot generation << 32 | slot index), so a late response for
// a slot that has since been reused is recognised and dropped. Slots are reused, so a steady
// state of calls allocates nothing here.
class ChannelCore final : public FrameEndpoint<ChannelCore>,
                          public ReconnectListener,
                          public std::enable_shared_from_this<ChannelCore> {
 public:
  // kHandshaking: connected, waiting for the server's SETTINGS. kDraining: the server sent GOAWAY;
  // calls in flight finish, new ones are not sent there. kDown: no connection, reconnect pending
  // (or not, with reconnect off). kIdle: the server closed the connection for being idle; the
  // next call reconnects (and waits for it). kShutdown: closed by the user; final.
  enum class State { kHandshaking, kReady, kDraining, kDown, kIdle, kShutdown };

  ChannelCore(std::string target, transport::Executor ex, ChannelOptions options)
      : FrameEndpoint(ex, nullptr),
        target_(std::move(target)),
        executor_(std::move(ex)),
        options_(std::move(options)),
        io_executor_(executor_.target<asio::io_context::executor_type>()),
        handshake_timer_(executor_),
        reconnector_(executor_, target_, options_.transport, options_.reconnect_backoff_initial,
                     options_.reconnect_backoff_max) {
    // Measured at least 16 times per bound (so a bound is overshot by at most a sixteenth and
    // one message), at most every 64 KiB; never without a bound.
    const size_t bound = options_.max_queued_bytes;
    queue_check_bytes_ = bound == 0 ? SIZE_MAX : std::clamp<size_t>(bound / 16, 1, 64u << 10);
    unbound_.interceptors = options_.interceptors;
    unbound_.rest = options_.interceptors;
  }

  const transport::Executor& executor() const { return executor_; }

  // Takes a freshly connected transport connection and waits for the server's SETTINGS (or its
  // refusal) in the background.
  void Adopt(std::shared_ptr<transport::Connection> conn) {
    conn_ = std::move(conn);
    state_ = State::kHandshaking;
    send_full_ = false;  // the send-queue bound starts over with each connection
    unmeasured_bytes_ = 0;
    goaway_.reset();
    idle_goaway_ = false;
    on_demand_ = false;
    conn_->Start(shared_from_this());
    handshake_timer_.expires_after(
        std::chrono::milliseconds(options_.transport.connect_timeout_ms));
    std::weak_ptr<ChannelCore> weak = shared_from_this();
    handshake_timer_.async_wait([weak](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->state_ != State::kHandshaking || !self->conn_) return;
      self->last_error_ = Status(StatusCode::kUnavailable, "no SETTINGS from " + self->target_ +
                                                               " within the connect timeout");
      self->conn_->Close();
    });
  }

  // For Channel::Connect: waits until the handshake of the first connection has an outcome.
  asio::awaitable<Status> AwaitFirstConnection() {
    while (state_ == State::kHandshaking) {
      first_ready_.expires_at(asio::steady_timer::time_point::max());
      co_await first_ready_.async_wait(asio::as_tuple(asio::use_awaitable));
    }
    if (state_ == State::kReady) co_return Status();
    co_return last_error_.ok()
        ? Status(StatusCode::kUnavailable, "connection to " + target_ + " lost")
        : last_error_;
  }

  // One unary call, with the interceptors' OnStart before it is sent and their OnFinish on
  // every way out (Intercepted), in this one coroutine frame: no second frame per call.
  asio::awaitable<Status> Call(const MethodInfo& method,
                               const google::protobuf::MessageLite& request,
                               google::protobuf::MessageLite& reply,
                               const CallOptions& caller_options) {
    // Channel::Call's awaitable is this coroutine itself (a wrapper would cost a second frame
    // per call, and with it a trip to malloc: Asio keeps only two frames per thread for reuse).
    // On the channel's thread already? For a channel on an io_context's own executor (ours, and
    // the usual case) a thread-local look-up; copying the caller's executor out of its frame
    // and comparing it with the channel's cost ~40 instructions per call.
    bool here;
    if (io_executor_) {
      here = io_executor_->running_in_this_thread();
    } else {
      here = (co_await asio::this_coro::executor) == executor_;
    }
    if (!here) {
      // Hop to the channel's thread and back; the caller stays suspended meanwhile, so request
      // and reply are touched by one thread at a time.
      co_return co_await asio::co_spawn(executor_, Call(method, request, reply, caller_options),
                                        asio::use_awaitable);
    }
    Interception ic;
    std::optional<CallOptions> copy;  // only with interceptors, which may add metadata
    if (!options_.interceptors.empty()) {
      const BoundMethod& b = InterceptorsFor(method);
      ic.start = Clock::now();
      ic.stats = b.stats;
      if (ic.stats) ic.stats->Started();
      if (!b.rest.empty()) {
        // Field by field: copying an empty metadata list through vector's copy constructor cost
        // ~50 instructions per call. Keep in step with CallOptions.
        copy.emplace();
        copy->timeout = caller_options.timeout;
        copy->deadline = caller_options.deadline;
        if (!caller_options.metadata.empty()) copy->metadata = caller_options.metadata;
        copy->wait_for_ready = caller_options.wait_for_ready;
        ic.list = &b.rest;
        if (Status s = StartInterceptors(b.rest, method, *copy, &ic.admitted); !s.ok()) {
          co_return Intercepted(method, ic, std::move(s));
        }
      }
    }
    const CallOptions& options = copy ? *copy : caller_options;
    if (state_ == State::kShutdown) {
      co_return Intercepted(
          method, ic, Status(StatusCode::kUnavailable, "channel to " + target_ + " is closed"));
    }
    auto self = shared_from_this();  // the channel may be dropped while we wait
    // The clock is read once for both the deadline and the timeout the request carries (when
    // sent at once: the few instructions between are not worth a second read, ~20 each).
    Clock::time_point now = ic.start;
    if (now == Clock::time_point{} && options.timeout.count() > 0) now = Clock::now();
    const auto deadline = EffectiveDeadline(options, now);
    const uint32_t index = AllocSlot();
    Slot& slot = calls_[index];
    slot.reply = &reply;
    slot.wait_for_ready = options.wait_for_ready;
    // Usually admitted at once: then no coroutine for the admission wait.
    Status sent;
    if (AdmitsNow()) {
      sent = SendAdmitted(index, method, &request, options, deadline, now);
    } else {
      sent = co_await SendRequest(index, method, &request, options, deadline);
    }
    if (!sent.ok()) [[unlikely]] {
      if (std::exchange(unheard_close_, false)) {  // nothing went out: wait as SendRequest does
        sent = co_await SendRequest(index, method, &request, options, deadline);
      }
      if (!sent.ok()) co_return Intercepted(method, ic, std::move(sent));
    }
    co_await Suspend(index, deadline);
    if (slot.done) {
      // The common case without the error path's renaming, and without moving the slot's
      // Status out (OnResponse leaves it OK, as FreeSlot does; the moves and calls cost ~75
      // instructions per call). Intercepted's test written out here rather than called:
      // `co_return Intercepted(method, ic, Status())` cost 33 more per call without
      // interceptors (callgrind, 64 B; with metrics this form took 2,827 -> 2,761).
      if (slot.status.ok()) {
        FreeSlot(index);
        if (ic.observed()) FinishInterceptedOk(method, ic);
        co_return Status();
      }
      co_return Intercepted(method, ic, EndUnary(index, method, options.timeout, false));
    }
    // The caller cancelled (e.g. through a cancellation slot bound to this call), or its
    // deadline passed.
    const bool cancelled =
        (co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none;
    co_return Intercepted(method, ic, EndUnary(index, method, options.timeout, cancelled));
  }

  // The Status of unary call `index` once its caller is woken, the slot freed (its reply came,
  // or the connection went: `done`) or abandoned (the caller gave up, `cancelled` or past its
  // deadline: the server is told with a CANCEL). `timeout`: the call's, for the message.
  Status EndUnary(uint32_t index, const MethodInfo& method, std::chrono::nanoseconds timeout,
                  bool cancelled) {
    Slot& slot = calls_[index];
    if (slot.done) {
      if (slot.status.ok()) {
        FreeSlot(index);
        return Status();
      }
      Status status = std::move(slot.status);
      FreeSlot(index);
      return NameUnknownMethod(std::move(status), method);
    }
    Status status = cancelled ? Status(StatusCode::kCancelled,
                                       "call to " + target_ + " cancelled by the caller")
                              : DeadlineStatus(timeout);
    SendCancel(CallId(index));
    Abandon(index);
    return status;
  }

  // Channel::TryCallParked: a unary call sent at once from the channel's thread, its caller's
  // handler kept in the slot (no coroutine frame; EndParked and WakeParked finish it). False
  // (nothing done, `handler` untouched) when it cannot go that way: off the channel's thread,
  // with interceptors, or not admitted at once; the caller then runs Call.
  bool TryCallParked(const MethodInfo& method, const google::protobuf::MessageLite& request,
                     google::protobuf::MessageLite& reply, const CallOptions& options,
                     internal::AwaitingHandler<Status>& handler) {
    if (!io_executor_ || !io_executor_->running_in_this_thread() || !AdmitsNow()) return false;
    // Of interceptors, only a metrics recorder alone (the usual case) is run here, as Call runs
    // it; others need Call.
    MethodStats* stats = nullptr;
    Clock::time_point now{};
    if (!options_.interceptors.empty()) {
      const BoundMethod& b = InterceptorsFor(method);
      if (!b.rest.empty()) return false;
      stats = b.stats;
      now = Clock::now();
    } else if (options.timeout.count() > 0) {
      now = Clock::now();
    }
    const auto deadline = EffectiveDeadline(options, now);
    const uint32_t index = AllocSlot();
    Slot& slot = calls_[index];
    slot.reply = &reply;
    slot.wait_for_ready = options.wait_for_ready;
    if (Status sent = SendAdmitted(index, method, &request, options, deadline, now); !sent.ok())
        [[unlikely]] {
      if (std::exchange(unheard_close_, false)) {
        FreeSlot(index);  // nothing went out: Call waits for the connection (and counts it)
        return false;
      }
      // (The slot is freed.) Not called from here: the caller has not finished suspending.
      if (stats) {
        stats->Started();
        stats->Finished(sent.code(), Clock::now() - now, 0, 0);
      }
      asio::post(executor_, [h = std::move(handler), s = std::move(sent)]() mutable {
        std::move(h)(std::move(s));
      });
      return true;
    }
    if (stats) stats->Started();  // (after the send: a call handed back to Call is not counted)
    slot.stats = stats;
    slot.intercepted_at = now;
    slot.method = &method;
    slot.timeout = options.timeout;
    slot.deadline = deadline;
    ArmDeadline(deadline);
    slot.parked.emplace(std::move(handler));
    if (auto cs = slot.parked->get_cancellation_slot(); cs.is_connected()) {
      cs.assign([this, index, gen = slot.generation](asio::cancellation_type) {
        // Invoked by the caller's emit, on this thread. The slot may have moved on.
        if (Slot* s = calls_.Find(index, gen); s && s->parked) {
          WakeParked(index, /*from_cancellation=*/true);
        }
      });
    }
    return true;
  }

  // A method's interceptors, bound on its first call by this channel (InterceptorsFor).
  struct BoundMethod {
    uint32_t id = 0;
    std::string name;
    const char* name_seen = nullptr;  // where the last caller's copy of `name` was
    ClientInterceptors interceptors;  // ForMethod's answers, in options order (streams)
    // Unary calls: a metrics recorder bound first (ClientStatsRecorder) is run by the channel
    // itself, into `stats` (null: none), and `rest` are the others.
    ClientInterceptors rest;
    MethodStats* stats = nullptr;
  };

  // A call's interceptors (null: none), how many let it through, the metrics recorder the
  // channel runs itself (null: none), and when they started.
  struct Interception {
    const ClientInterceptors* list = nullptr;
    size_t admitted = 0;
    MethodStats* stats = nullptr;
    std::chrono::steady_clock::time_point start;  // unset: no one observes the call
    bool observed() const { return start != std::chrono::steady_clock::time_point{}; }
  };

  // The interceptors for `method`'s calls: each one's ForMethod answer, asked on the method's
  // first call and kept (see ClientInterceptor::ForMethod). A second method with the same id
  // (which the server could not tell apart either) gets the interceptors themselves. The last
  // method's name is compared by address first: generated stubs pass the same constant each
  // time, so a call of the same method as the last one compares no characters.
  const BoundMethod& InterceptorsFor(const MethodInfo& method) {
    if (BoundMethod* b = last_bound_; b && b->id == method.id &&
                                      b->name_seen == method.full_name.data() &&
                                      b->name.size() == method.full_name.size()) {
      return *b;
    }
    return BindInterceptors(method);
  }
  // InterceptorsFor's look-up and first binding, out of line: the check above is what a call
  // of the same method as the last one runs.
  [[gnu::noinline]] const BoundMethod& BindInterceptors(const MethodInfo& method) {
    auto [it, added] = bound_.try_emplace(method.id);
    BoundMethod& b = it->second;
    if (added) {
      b.id = method.id;
      b.name = method.full_name;
      for (const auto& i : options_.interceptors) {
        auto one = i->ForMethod(method);
        b.interceptors.push_back(one ? std::move(one) : i);
      }
      b.rest = b.interceptors;
      b.stats = LeadingRecorderStats<ClientStatsRecorder>(b.rest);  // kept alive by b.interceptors
      if (b.stats) b.rest.erase(b.rest.begin());
    } else if (b.name != method.full_name) {
      return unbound_;
    }
    b.name_seen = method.full_name.data();
    last_bound_ = &b;
    return b;
  }

  // Runs the interceptors' OnStart in order until one rejects (its Status is returned);
  // `*admitted`: how many let the call through.
  static Status StartInterceptors(const ClientInterceptors& list, const MethodInfo& method,
                                  CallOptions& options, size_t* admitted) {
    for (*admitted = 0; *admitted < list.size(); ++*admitted) {
      Status s = list[*admitted]->OnStart(method, options);
      if (!s.ok()) return s;
    }
    return Status();
  }

  // OnFinish, in reverse order, for the first `admitted` interceptors, `elapsed` since the
  // first one's OnStart.
  static void FinishInterceptors(const ClientInterceptors& list, const MethodInfo& method,
                                 const Status& status, std::chrono::nanoseconds elapsed,
                                 size_t admitted) {
    while (admitted-- > 0) list[admitted]->OnFinish(method, status, elapsed);
  }

  // Tells a unary call's interceptors (OnFinish, in reverse order), then its metrics recorder,
  // how it ended. Out of line: inlined into FinishInterceptedOk, its loop made that function's
  // common case (a recorder alone) save six registers and build a frame (~8 instructions).
  [[gnu::noinline]] static void FinishIntercepted(const MethodInfo& method, const Interception& ic,
                                                  const Status& status) {
    const auto elapsed = Clock::now() - ic.start;
    if (ic.list) FinishInterceptors(*ic.list, method, status, elapsed, ic.admitted);
    if (ic.stats) ic.stats->Finished(status.code(), elapsed, 0, 0);
  }

  // FinishIntercepted for a call that succeeded. A metrics recorder alone (the usual case) gets
  // the OK code as a constant, and no Status is built for it.
  [[gnu::noinline]] static void FinishInterceptedOk(const MethodInfo& method,
                                                    const Interception& ic) {
    if (ic.list) return FinishIntercepted(method, ic, Status());
    if (ic.stats) ic.stats->Finished(StatusCode::kOk, Clock::now() - ic.start, 0, 0);
  }

  // The call's result, after telling its interceptors (if any) how it ended.
  static Status Intercepted(const MethodInfo& method, const Interception& ic, Status status) {
    if (ic.observed()) FinishIntercepted(method, ic, status);
    return status;
  }

  // --- streams (rpc/stream.h) ----------------------------------------------------------------
  // Sends the REQUEST of a streaming call (with its message for a server stream; `request` is
  // null for client streams); on success `*index` is its slot.
  asio::awaitable<Status> OpenStream(const MethodInfo& method,
                                     const google::protobuf::MessageLite* request,
                                     const CallOptions& options, uint32_t* index,
                                     uint32_t* generation) {
    if (options_.interceptors.empty()) {
      return OpenStreamUnintercepted(method, request, options, index, generation);
    }
    return InterceptedOpenStream(method, request, options, index, generation);
  }

  // A stream's interceptors hear its end from FinishStream or ReleaseStream (StreamEnded).
  asio::awaitable<Status> InterceptedOpenStream(const MethodInfo& method,
                                                const google::protobuf::MessageLite* request,
                                                CallOptions options, uint32_t* index,
                                                uint32_t* generation) {
    auto self = shared_from_this();
    const ClientInterceptors& list = InterceptorsFor(method).interceptors;
    const auto start = Clock::now();
    size_t admitted = 0;
    Status status = StartInterceptors(list, method, options, &admitted);
    if (status.ok()) {
      status = co_await OpenStreamUnintercepted(method, request, options, index, generation);
    }
    if (!status.ok()) {
      FinishInterceptors(list, method, status, Clock::now() - start, admitted);
      co_return status;
    }
    Slot& s = calls_[*index];
    s.interceptors = &list;
    s.intercepted_at = start;
    co_return status;
  }

  // Tells a stream's interceptors how it ended; once.
  void StreamEnded(uint32_t index, const Status& status) {
    Slot& s = calls_[index];
    if (!s.interceptors) return;
    const ClientInterceptors& list = *std::exchange(s.interceptors, nullptr);
    FinishInterceptors(list, *s.method, status, Clock::now() - s.intercepted_at, list.size());
  }

  asio::awaitable<Status> OpenStreamUnintercepted(const MethodInfo& method,
                                                  const google::protobuf::MessageLite* request,
                                                  const CallOptions& options, uint32_t* index,
                                                  uint32_t* generation) {
    if (state_ == State::kShutdown) {
      co_return Status(StatusCode::kUnavailable, "channel to " + target_ + " is closed");
    }
    auto self = shared_from_this();
    const auto deadline = EffectiveDeadline(options);
    const uint32_t i = AllocSlot();
    Slot& slot = calls_[i];
    slot.streaming = true;
    slot.method = &method;
    slot.stream_deadline = deadline;
    slot.timeout = options.timeout;
    slot.wait_for_ready = options.wait_for_ready;
    slot.send_credit = static_cast<int64_t>(kStreamWindowBytes);
    slot.unyielded_bytes = 0;
    if (Status s = co_await SendRequest(i, method, request, options, deadline); !s.ok()) {
      co_return s;
    }
    *index = i;
    *generation = slot.generation;
    co_return Status();
  }

  // The next message of stream `index` into `out`: true, or false once the stream is over (its
  // Status waits for FinishStream). Waits within the stream's deadline; the caller may cancel.
  asio::awaitable<bool> ReadStream(uint32_t index, uint32_t generation,
                                   google::protobuf::MessageLite& out) {
    auto self = shared_from_this();
    if (!IsStream(index, generation)) co_return false;
    Slot& s = calls_[index];
    for (;;) {
      if (const StreamTry got = ReadStep(index, out); got != StreamTry::kWait) {
        co_return got == StreamTry::kDone;
      }
      co_await Suspend(index, s.stream_deadline);
      if (!s.messages.empty() || s.done) continue;
      StopAfterEmptyWake(index, (co_await asio::this_coro::cancellation_state).cancelled());
      co_return false;
    }
  }

  // ReadStream's first step without a coroutine of its own (see StreamTry), for a reader on the
  // channel's thread (others go through ReadStream, which hops there).
  StreamTry TryReadStream(uint32_t index, uint32_t generation, google::protobuf::MessageLite& out) {
    if (!io_executor_ || !io_executor_->running_in_this_thread()) return StreamTry::kWait;
    if (!IsStream(index, generation)) return StreamTry::kOver;
    return ReadStep(index, out);
  }

  // What a read of stream `index` can do without waiting: take a buffered message into `out`,
  // find the stream over, or find nothing yet (kWait). For ReadStream and TryReadStream.
  StreamTry ReadStep(uint32_t index, google::protobuf::MessageLite& out) {
    Slot& s = calls_[index];
    if (!s.messages.empty())
      return TakeStreamMessage(index, out) ? StreamTry::kDone : StreamTry::kOver;
    return s.done ? StreamTry::kOver : StreamTry::kWait;
  }

  // Sends `message` on client stream `index` once its window has room: true, or false when the
  // stream is over (ended, cancelled, deadline passed, connection lost, or `message` over the
  // limit: FinishStream says which). Waits within the stream's deadline; the caller may cancel.
  asio::awaitable<bool> WriteStream(uint32_t index, uint32_t generation,
                                    const google::protobuf::MessageLite& message) {
    auto self = shared_from_this();
    if (!IsStream(index, generation)) co_return false;
    Slot& s = calls_[index];
    if (s.unyielded_bytes >= kYieldEveryBytes) {
      // A writer that never had to wait has had the thread for a while: the channel's other
      // calls (and the loop's other channels) go first. As on the server (ServerStream::Write).
      s.unyielded_bytes = 0;
      co_await YieldTo(executor_);
      if (!IsStream(index, generation)) co_return false;
    }
    for (;;) {
      if (const StreamTry sent = WriteStep(index, message); sent != StreamTry::kWait) {
        co_return sent == StreamTry::kDone;
      }
      // Out of window: wait for the server's WINDOW (or the stream's end, deadline, cancel).
      // Over the send-queue bound: wait for the server to take what is queued.
      co_await Suspend(index, s.stream_deadline, &Slot::write_resume);
      if (s.done || (s.send_credit > 0 && !send_full_)) continue;
      if ((co_await asio::this_coro::cancellation_state).cancelled() !=
          asio::cancellation_type::none) {
        StopStream(index, Status(StatusCode::kCancelled,
                                 "stream to " + target_ + " cancelled by the caller"));
        co_return false;
      }
      if (Clock::now() >= s.stream_deadline) {
        StopStream(index, WithQueueReason(DeadlineStatus(s.timeout)));
        co_return false;
      }
      // Woken for the reader's sake: wait again.
    }
  }

  // WriteStream's first step without a coroutine of its own (see StreamTry), for a writer on
  // the channel's thread with window left (others go through WriteStream).
  StreamTry TryWriteStream(uint32_t index, uint32_t generation,
                           const google::protobuf::MessageLite& message) {
    if (!io_executor_ || !io_executor_->running_in_this_thread()) return StreamTry::kWait;
    if (!IsStream(index, generation)) return StreamTry::kOver;
    if (calls_[index].unyielded_bytes >= kYieldEveryBytes) return StreamTry::kWait;  // its turn
    return WriteStep(index, message);
  }

  // What a write on stream `index` can do without waiting: send `message`, find the stream over,
  // or find no window left (kWait). For WriteStream and TryWriteStream.
  StreamTry WriteStep(uint32_t index, const google::protobuf::MessageLite& message) {
    Slot& s = calls_[index];
    if (s.done || s.writes_done || !conn_ || conn_->closed()) return StreamTry::kOver;
    if (s.send_credit <= 0 || send_full_) return StreamTry::kWait;
    return SendStreamMessage(index, message) ? StreamTry::kDone : StreamTry::kOver;
  }

  // Sends `message` on client stream `index`, which has window left: false when it is over the
  // message limit (the stream is stopped) or the connection is closing.
  bool SendStreamMessage(uint32_t index, const google::protobuf::MessageLite& message) {
    Slot& s = calls_[index];
    FrameHeader h;
    h.type = FrameType::kStreamMessage;
    h.call_id = CallId(index);
    internal::FrameWriter writer(h, nullptr, &message);
    if (const size_t max = MaxMessageBytes(); writer.size() > max) [[unlikely]] {
      StopStream(index, Status(StatusCode::kResourceExhausted,
                               OverLimitText("stream message", writer.size(), max)));
      return false;
    }
    if (!conn_->Send(writer)) return false;  // closing: the stream fails with UNAVAILABLE
    s.send_credit -= static_cast<int64_t>(writer.size());
    s.unyielded_bytes += writer.size();
    NoteQueued(writer.size());
    return true;
  }

  // Half-closes client stream `index`: the server's Read then ends after the messages sent.
  // False when the stream is over or already half-closed.
  bool HalfCloseStream(uint32_t index, uint32_t generation) {
    if (!IsStream(index, generation)) return false;
    Slot& s = calls_[index];
    if (s.done || s.writes_done || !conn_ || conn_->closed()) return false;
    if (!(static_cast<uint8_t>(s.method->kind) & kRequestFlagClientStream)) return false;
    s.writes_done = true;
    FrameHeader h;
    h.type = FrameType::kStreamMessage;
    h.flags = kStreamFlagEnd;
    h.call_id = CallId(index);
    return conn_->Send(internal::FrameWriter(h, std::string_view()));
  }

  // Waits for the end of stream `index` (half-closing it first, if the caller streams, and
  // dropping messages not read) and returns how it ended; the stream is released. `reply`, for
  // client-streaming calls, gets the server's reply when the Status is OK.
  asio::awaitable<Status> FinishStream(uint32_t index, uint32_t generation,
                                       google::protobuf::MessageLite* reply) {
    auto self = shared_from_this();
    if (!IsStream(index, generation)) {
      co_return Status(StatusCode::kFailedPrecondition, "stream already finished");
    }
    Slot& s = calls_[index];
    HalfCloseStream(index, generation);
    while (!s.done) {
      while (!s.messages.empty()) {
        TookStreamMessage(index, s.messages.FrontSize());
        s.messages.Pop();
      }
      if (s.done) break;
      co_await Suspend(index, s.stream_deadline);
      if (!s.messages.empty() || s.done) continue;
      StopAfterEmptyWake(index, (co_await asio::this_coro::cancellation_state).cancelled());
    }
    Status status = NameUnknownMethod(std::move(s.status), *s.method);
    if (status.ok() && reply != nullptr) {
      const auto payload = std::as_bytes(std::span(s.final_payload));
      if (const size_t excess = internal::DecodedExcess(*reply, payload);
          excess > ParsedAllowance()) {
        status = ParsedTooLarge("reply", payload.size(), excess);
      } else if (!reply->ParseFromString(s.final_payload)) {
        status = Status(StatusCode::kInternal, "reply does not parse as " + reply->GetTypeName());
      }
    }
    StreamEnded(index, status);
    ReleaseStream(index, generation);
    co_return status;
  }

  // The reader is gone or cancels: the server is told (CANCEL) unless the stream had ended, and
  // the slot goes once the server no longer counts the call. Idempotent.
  // Messages already buffered are dropped with it: a Read after Cancel() ends at once, as a
  // Read waiting at the time does, rather than handing out what arrived before. Cancel() after
  // the server's end changes nothing (the call is over; what it sent is still there to read).
  void CancelStream(uint32_t index, uint32_t generation) {
    if (!IsStream(index, generation)) return;
    Slot& s = calls_[index];
    if (s.done) return;
    StopStream(index, Status(StatusCode::kCancelled, "stream cancelled by the caller"));
    DropBuffered(index);
  }
  // The stream's buffered messages, gone unread; no WINDOW for them (the stream is done).
  void DropBuffered(uint32_t index) {
    Slot& s = calls_[index];
    while (!s.messages.empty()) {
      TookStreamMessage(index, s.messages.FrontSize());
      s.messages.Pop();
    }
  }
  void ReleaseStream(uint32_t index, uint32_t generation) {
    if (!IsStream(index, generation)) return;
    Slot& s = calls_[index];
    StopStream(index, Status(StatusCode::kCancelled, "stream cancelled by the caller"));
    StreamEnded(index, s.status);  // dropped without Finish: how it ended, or CANCELLED
    s.messages.Clear();
    s.buffered = 0;
    if (s.server_done) {
      FreeSlot(index);
    } else {
      Abandon(index);  // freed by the server's acknowledgement of the CANCEL
    }
  }

  // (Call's admission and sending, shared with OpenStream.)
  // Admits the call in slot `index` (waiting for room or the connection, in order, within its
  // deadline) and sends its request. On failure the slot is freed and the Status says why.
  asio::awaitable<Status> SendRequest(uint32_t index, const MethodInfo& method,
                                      const google::protobuf::MessageLite* request,
                                      const CallOptions& options,
                                      std::chrono::steady_clock::time_point deadline) {
    Slot& slot = calls_[index];
    // Admission: a ready connection with room under the concurrency limit, else wait in order
    // (or fail at once when not connected, unless the caller asked to wait for readiness). A
    // connection the transport has closed does not admit, even before the channel hears of it.
    for (;;) {
      while (!AdmitsNow() || conn_->closed()) {
        if (Status s = NotAdmitted(slot); !s.ok()) {
          FreeSlot(index);
          co_return s;
        }
        if (state_ == State::kIdle) StartOnDemandConnect();
        waiting_.PushBack(&slot);
        co_await Suspend(index, deadline);
        const bool woken = !slot.queued;
        if (!woken) waiting_.Remove(&slot);
        Status gave_up = WithLimitReason(WithQueueReason(GaveUp(deadline, options, woken)));
        if (!gave_up.ok()) {
          FreeSlot(index);
          WakeWaiters();  // pass on any room this call was woken for
          co_return gave_up;
        }
        if (state_ == State::kReady && HasRoom() && !conn_->closed()) break;
        // Woken but the room went to someone else, or the connection went down meanwhile.
      }
      Status sent = SendAdmitted(index, method, request, options, deadline);
      if (!std::exchange(unheard_close_, false)) co_return sent;
      // The transport had closed the connection and its OnClose is on its way: nothing went out,
      // so wait as for any connection that is down (for the reconnect, if wait_for_ready).
    }
  }

  // Whether a call may be sent at once (SendAdmitted) rather than wait (SendRequest).
  bool AdmitsNow() const { return state_ == State::kReady && waiting_.empty() && HasRoom(); }

  // Sends slot `index`'s REQUEST frame, once admitted. Not a coroutine: the usual call, admitted
  // at once, pays for no second coroutine frame. `now`: the clock as the caller read it just
  // before, or the epoch to read it here (after a wait for admission). On failure the slot is
  // freed, except when the transport refused the frame because it has closed the connection
  // and the channel has not heard yet (OnClose is posted): then unheard_close_ is set and the
  // slot kept, and the caller waits for admission again (SendRequest) as if the connection had
  // gone just before. (A flag, not a return value: the usual call pays nothing for it.)
  Status SendAdmitted(uint32_t index, const MethodInfo& method,
                      const google::protobuf::MessageLite* request, const CallOptions& options,
                      std::chrono::steady_clock::time_point deadline,
                      std::chrono::steady_clock::time_point now = {}) {
    Slot& slot = calls_[index];
    const uint8_t flags = static_cast<uint8_t>(method.kind);
    if ((flags & kRequestFlagClientStream) && !(server_features_ & kFeatureClientStreams)) {
      FreeSlot(index);
      WakeWaiters();
      return Status(StatusCode::kUnimplemented,
                    "server " + target_ +
                        " does not take client streams (it predates them), "
                        "so it cannot serve " +
                        MethodKindName(method.kind) + " method " + std::string(method.full_name));
    }
    const uint64_t call_id = CallId(index);
    FrameHeader h;
    h.type = FrameType::kRequest;
    h.flags = flags;
    h.method_id = method.id;
    h.call_id = call_id;
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
          deadline - (now == Clock::time_point{} ? Clock::now() : now));
      h.timeout_us = std::max<int64_t>(1, left.count());
    }
    if (!options.metadata.empty()) [[unlikely]] {
      // Over either limit the server would refuse the call (too many entries) or take the frame
      // as malformed and close the connection under every other call (too many bytes; a key
      // over 64 KiB would not even encode): the call fails here, alone.
      if (std::string why = MetadataOverLimit(options.metadata); !why.empty()) {
        FreeSlot(index);
        WakeWaiters();
        return Status(StatusCode::kResourceExhausted, std::move(why));
      }
    }
    internal::FrameWriter writer(h, options.metadata.empty() ? nullptr : &options.metadata,
                                 request);
    // The smaller of our limit and the one the server announced: a request over the server's
    // fails here, alone, instead of costing the connection every other call is using.
    const size_t max_message = MaxMessageBytes();
    if (writer.size() > max_message) {
      FreeSlot(index);
      WakeWaiters();
      return Status(StatusCode::kResourceExhausted,
                    OverLimitText("request", writer.size(), max_message) +
                        (max_message == conn_->max_message_bytes() ? "" : " set by the server"));
    }
    if (!conn_->Send(writer)) [[unlikely]] {
      if (conn_->closed()) {
        unheard_close_ = true;
        return Status(StatusCode::kUnavailable, "connection to " + target_ + " is closed");
      }
      FreeSlot(index);
      return Status(StatusCode::kUnavailable, "connection to " + target_ + " is closing");
    }
    slot.sent = true;
    ++in_flight_;
    NoteQueued(writer.size());
    return Status();
  }

  // After a request or stream message of `bytes` went to the transport: measures the send queue
  // now and then, and past ChannelOptions::max_queued_bytes makes new calls and stream writes
  // wait (see send_full_). A server that takes nothing (hung, or hostile: granting stream
  // credit it never reads) would otherwise make us queue every request and message we are
  // given.
  void NoteQueued(size_t bytes) {
    unmeasured_bytes_ += bytes;
    if (unmeasured_bytes_ >= queue_check_bytes_) [[unlikely]]
      MeasureQueue();
  }
  // (Never reached without a bound: queue_check_bytes_ is then SIZE_MAX.)
  [[gnu::noinline]] void MeasureQueue() {
    unmeasured_bytes_ = 0;
    if (send_full_ || !conn_) return;
    if (conn_->queued_send_bytes() <= options_.max_queued_bytes) return;
    send_full_ = true;
    conn_->WatchSendProgress(true);
    spdlog::debug(
        "channel {}: {} bytes queued that the server has not taken (bound {}): calls "
        "and stream writes wait",
        target_, conn_->queued_send_bytes(), options_.max_queued_bytes);
  }

  // A deadline that passed while the caller waited for the send queue to go down says so: the
  // server is reachable but not taking what we send, which "no reply" alone would hide.
  Status WithQueueReason(Status s) const {
    if (s.code() != StatusCode::kDeadlineExceeded || !send_full_ || !conn_) return s;
    return Status(s.code(), s.message() + "; waiting to send: the server has not taken the " +
                                std::to_string(conn_->queued_send_bytes()) +
                                " bytes queued for it (ChannelOptions::max_queued_bytes " +
                                std::to_string(options_.max_queued_bytes) + ")");
  }

  // A call that waited for a place under the concurrency limit until its deadline says so:
  // "no reply" alone would blame the server's speed for a wait that never reached it. (Only
  // for calls waiting to be admitted: a running call's deadline says nothing of the limit.)
  Status WithLimitReason(Status s) const {
    const uint32_t limit = Limit();
    if (s.code() != StatusCode::kDeadlineExceeded || send_full_ || state_ != State::kReady ||
        limit == 0 || in_flight_ < limit) {
      return s;
    }
    const bool servers = server_limit_ != 0 && server_limit_ == limit;
    return Status(s.code(),
                  s.message() + "; never sent: " + std::to_string(in_flight_) +
                      " calls in flight on the connection, the most " +
                      (servers ? "the server allows (its max_concurrent_calls_per_connection, " +
                                     std::to_string(limit) + ")"
                               : "ChannelOptions::max_concurrent_calls allows (" +
                                     std::to_string(limit) + ")"));
  }

  // The transport: queued bytes went out (reported while send_full_: WatchSendProgress). At
  // half the bound, the waiting calls and stream writers go on.
  void OnSendProgress() override {
    if (!send_full_ || !conn_ || conn_->queued_send_bytes() > options_.max_queued_bytes / 2) {
      return;
    }
    send_full_ = false;
    conn_->WatchSendProgress(false);
    WakeWaiters();
    for (uint32_t i = 0; i < calls_.size(); ++i) {
      Slot& s = calls_[i];
      if (s.active) ResumeWaiter(s, &Slot::write_resume);  // (if one waits)
    }
  }

  // FrameEndpoint: a frame from the server, decoded.
  // Inlined into FrameEndpoint::OnMessage, as it was before the two were split (a call and the
  // frame passed by reference cost ~20 instructions per message).
  [[gnu::always_inline]] void OnFrame(const DecodedFrame& f, size_t /*message_bytes*/) {
    switch (f.header.type) {
      case FrameType::kResponse:
        OnResponse(f);
        break;
      case FrameType::kStreamMessage:
        OnStreamMessage(f);
        break;
      case FrameType::kWindow:
        OnWindow(f);
        break;
      case FrameType::kPing:
        OnPing(f);
        break;
      case FrameType::kSettings:
        OnSettings(f);
        break;
      case FrameType::kGoAway:
        OnGoAway(f);
        break;
      default:
        // PONG needs no action beyond keepalive_.Heard(); a peer ignores frame types it does not
        // act on, as the protocol asks.
        break;
    }
  }

  // FrameEndpoint: nothing more from this connection can be trusted.
  void OnMalformedFrame(const std::string& err) {
    spdlog::warn("channel {}: malformed frame from server: {}; closing", target_, err);
    LoseConnection("server sent a malformed frame: " + err);
  }

  void OnClose(const transport::Error& reason) override {
    keepalive_.Stop();
    handshake_timer_.cancel();
    conn_.reset();  // breaks the connection <-> handler cycle
    FailSent(reason.message);
    const State before = state_;
    // The server closed an idle connection (GOAWAY flagged idle): nothing is wrong; reconnect
    // when a call needs it.
    const bool idle = before == State::kDraining && idle_goaway_ && options_.reconnect && started_;
    if (idle) {
      state_ = State::kIdle;
      last_error_ = Status();
      if (!waiting_.empty()) StartOnDemandConnect();
      WakeWaiters();
      return;
    }
    if (last_error_.ok() || state_ == State::kReady || state_ == State::kDraining) {
      last_error_ =
          Status(StatusCode::kUnavailable, "connection to " + target_ + " lost: " + reason.message);
    }
    if (state_ != State::kShutdown) state_ = State::kDown;
    first_ready_.cancel();  // wakes Channel::Connect, if it waits
    WakeWaiters();  // fail-fast waiters fail now; wait-for-ready ones wait for the reconnect
    if (state_ == State::kShutdown || !options_.reconnect || !started_) return;
    if (before == State::kReady || before == State::kDraining) {
      ScheduleReconnect(std::chrono::milliseconds(0));  // it worked a moment ago: try at once
    } else {
      ScheduleReconnect(reconnector_.NextBackoff());
    }
  }

  // Asks the channel to close for good (Channel::Close).
  void Close() {
    if (state_ == State::kShutdown) return;
    state_ = State::kShutdown;
    last_error_ = Status(StatusCode::kUnavailable, "channel to " + target_ + " was closed");
    reconnector_.Cancel();
    WakeWaiters();
    if (conn_) conn_->Close();
  }

  // For the Channel's destructor: nobody can be waiting on a call any more. Closes and lets go
  // of the connection now instead of in OnClose, which may never run if the loop stops first;
  // the connection <-> handler reference cycle would otherwise leak both (found by LSan).
  void Shutdown() {
    Close();
    keepalive_.Stop();
    handshake_timer_.cancel();
    deadline_timer_.cancel();
    deadline_armed_ = Clock::time_point::max();
    FailSent("channel destroyed");
    if (conn_) conn_.reset();
  }

  // From Channel::Connect once the first connection is up: later losses reconnect.
  void MarkStarted() { started_ = true; }

 private:
  using Clock = std::chrono::steady_clock;

  struct Slot {
    // The caller, suspended in Suspend() until Resume(): woken (room, reply, connection lost),
    // its deadline passed, or it cancelled. Empty while the caller runs.
    std::optional<Resumer> resume;
    // Instead, for a unary call started by TryCallParked: the awaiting caller's handler, called
    // with the call's Status, and the metrics recorder that hears how it ended (null: none)
    // with when it started (intercepted_at).
    std::optional<internal::AwaitingHandler<Status>> parked;
    MethodStats* stats = nullptr;
    // While suspended: when its caller gives up. Abandoned: when it stops counting
    // (kAbandonedGrace after the CANCEL).
    Clock::time_point deadline = Clock::time_point::max();
    google::protobuf::MessageLite* reply = nullptr;
    Status status;
    Slot* prev = nullptr;  // in waiting_, while queued
    Slot* next = nullptr;
    uint32_t generation = 1;  // these two are calls_' (CallTable)
    bool active = false;
    bool queued = false;  // in waiting_
    bool sent = false;    // on the wire; counted in in_flight_
    bool done = false;
    // The caller gave up (deadline, cancel) but the server still counts the call: the slot stays
    // counted in in_flight_ until the server's answer (its CANCELLED acknowledgement, or a
    // reply that crossed the CANCEL) or the end of the connection.
    bool abandoned = false;
    bool wait_for_ready = false;
    // Server streams: messages received and not read yet (with their frame bytes), frame bytes
    // read since the last WINDOW, and whether the server is done with the call (its final
    // RESPONSE came, or the connection went): only then may the slot be reused.
    bool streaming = false;
    bool server_done = false;
    const MethodInfo* method = nullptr;
    Clock::time_point stream_deadline = Clock::time_point::max();
    std::chrono::nanoseconds timeout{0};
    StreamQueue messages;
    uint64_t buffered = 0;
    uint64_t unreported = 0;
    // Client streams: the writer suspended for window (beside the reader in `resume`), the
    // frame bytes the server still lets us send, whether we half-closed, and the final reply's
    // bytes (client-streaming calls) until FinishStream parses them.
    std::optional<Resumer> write_resume;
    int64_t send_credit = 0;
    size_t unyielded_bytes = 0;  // sent since the writer last let the thread go (WriteStream)
    bool writes_done = false;
    std::string final_payload;
    // Streams with client interceptors: those that still have to hear the end (null: none, or
    // told already), and when they started.
    const ClientInterceptors* interceptors = nullptr;
    Clock::time_point intercepted_at;
  };

  uint32_t Limit() const {
    const uint32_t a = server_limit_, b = options_.max_concurrent_calls;
    if (a == 0) return b;
    if (b == 0) return a;
    return std::min(a, b);
  }
  bool HasRoom() const { return (Limit() == 0 || in_flight_ < Limit()) && !send_full_; }
  // Every call on the wire is abandoned: no caller waits for anything from the connection.
  bool NobodyWaits() const { return in_flight_ == abandoned_; }

  // Whether a call that is not wait_for_ready may wait now: a connection is on its way.
  bool ConnectionComing() const {
    return state_ == State::kHandshaking || state_ == State::kIdle ||
           (state_ == State::kDown && on_demand_) || (state_ == State::kDraining && idle_goaway_);
  }

  // After an idle close, the first call connects again (at once) and waits for the outcome.
  void StartOnDemandConnect() {
    if (state_ != State::kIdle) return;
    state_ = State::kDown;
    on_demand_ = true;
    ScheduleReconnect(std::chrono::milliseconds(0));
  }

  // Why a call that cannot go now must not wait either; OK when it may wait.
  Status NotAdmitted(const Slot& slot) const {
    if (state_ == State::kShutdown) {
      return Status(StatusCode::kUnavailable, "channel to " + target_ + " is closed");
    }
    if (state_ == State::kReady || slot.wait_for_ready) return Status();
    if (ConnectionComing()) return Status();  // ready in a moment, or down
    if (state_ == State::kDraining) {
      return Status(StatusCode::kUnavailable,
                    "server " + target_ + " is going away" +
                        (goaway_ ? ": " + goaway_->message() : std::string()));
    }
    return last_error_.ok()
               ? Status(StatusCode::kUnavailable, target_ + " is not connected")
               : Status(StatusCode::kUnavailable, last_error_.message() + " (reconnecting)");
  }

  // After a wait: the reason to stop waiting (deadline, cancellation), or OK to try again.
  Status GaveUp(Clock::time_point deadline, const CallOptions& options, bool woken) {
    if (deadline != Clock::time_point::max() && Clock::now() >= deadline) {
      return DeadlineStatus(options);
    }
    if (!woken) {  // the timer did not expire and nobody woke us: the caller cancelled
      return Status(StatusCode::kCancelled,
                    "call to " + target_ + " cancelled by the caller while waiting to be sent");
    }
    return Status();
  }

  // The earlier of the call's deadline and now + its timeout; a timeout too long for the clock
  // (e.g. nanoseconds::max()) means no deadline rather than an overflow into the past.
  // `now`: the call's start when the caller has read the clock already (else the epoch, and
  // the clock is read here if needed).
  static Clock::time_point EffectiveDeadline(const CallOptions& options,
                                             Clock::time_point now = {}) {
    auto deadline = options.deadline;
    if (options.timeout.count() > 0) {
      if (now == Clock::time_point{}) now = Clock::now();
      const auto room = Clock::time_point::max() - now;
      if (options.timeout < std::chrono::duration_cast<std::chrono::nanoseconds>(room)) {
        deadline =
            std::min(deadline, now + std::chrono::duration_cast<Clock::duration>(options.timeout));
      }
    }
    return deadline;
  }

  Status DeadlineStatus(const CallOptions& options) const {
    return DeadlineStatus(options.timeout);
  }
  Status DeadlineStatus(std::chrono::nanoseconds timeout) const {
    if (timeout.count() > 0) {
      return Status(
          StatusCode::kDeadlineExceeded,
          "no reply from " + target_ + " within " +
              std::to_string(
                  std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
              " ms");
    }
    return Status(StatusCode::kDeadlineExceeded,
                  "no reply from " + target_ + " before the deadline");
  }

  // Wakes the waiters that can make progress: as many as there is room for when ready; those
  // that must fail (connection down and not waiting for readiness, channel closed) otherwise.
  void WakeWaiters() {
    uint32_t room = ~0u;
    if (state_ == State::kReady && Limit() != 0) {
      room = in_flight_ < Limit() ? Limit() - in_flight_ : 0;
    }
    if (state_ == State::kReady && send_full_) room = 0;  // OnSendProgress wakes them
    const bool may_go = state_ == State::kReady;
    for (Slot* s = waiting_.front(); s && room > 0;) {
      Slot* next = s->next;
      const bool must_fail =
          state_ == State::kShutdown || (!s->wait_for_ready && !ConnectionComing());
      if (may_go || must_fail) {
        waiting_.Remove(s);
        Resume(*s);
        if (may_go) --room;
      }
      s = next;
    }
  }

  // Suspends the caller of slot `index` until Resume(): cheaper than a timer per call (no reactor
  // lock, no timer-queue insert and removal). Deadlines are kept by one timer per channel, armed
  // for the earliest one only: a call whose deadline is not the earliest costs no timer
  // operation at all. The caller's cancellation (a cancellation slot bound to the call) resumes
  // it too. What woke it is for the caller to find out (slot state, the clock, its
  // cancellation state).
  // `waiter`: where the handler waits, Slot::resume (calls, stream readers) or
  // Slot::write_resume (stream writers: a bidirectional stream may have both at once).
  using Waiter = std::optional<Resumer> Slot::*;
  struct Waiting;
  internal::Parker<Waiting> Suspend(uint32_t index, Clock::time_point deadline,
                                    Waiter waiter = &Slot::resume) {
    Slot& slot = calls_[index];
    slot.deadline = deadline;
    ArmDeadline(deadline);
    return internal::Park(Waiting{this, index, slot.generation, waiter});
  }
  // Where Suspend's caller waits, once suspended.
  struct Waiting {
    ChannelCore* core;
    uint32_t index, generation;
    Waiter waiter;
    void operator()(Resumer&& resume) const {
      core->Wait(index, generation, waiter, std::move(resume));
    }
  };
  void Wait(uint32_t index, uint32_t gen, Waiter waiter, Resumer&& resume) {
    Slot& s = calls_[index];
    (s.*waiter).emplace(std::move(resume));
    if (auto cs = (s.*waiter)->get_cancellation_slot(); cs.is_connected()) {
      cs.assign([this, index, gen, waiter](asio::cancellation_type) {
        // Invoked by the caller's emit, on this thread. The slot may have moved on.
        if (Slot* s = calls_.Find(index, gen)) {
          ResumeWaiter(*s, waiter, /*from_cancellation=*/true);
        }
      });
      // Cancelled before it got here (while it waited for room, say): no emit is coming, and
      // the caller ends with CANCELLED where a co_await would have thrown.
      if ((s.*waiter)->cancelled_before()) ResumeWaiter(s, waiter, /*from_cancellation=*/true);
    }
  }

  // Resumes whoever is suspended on `s` (the caller or stream reader, and a stream writer), from
  // the event loop: the callers of this one may be part way through the channel's state (waking
  // several waiters, failing every sent call), which a caller that starts another call or drops
  // the channel must not see. A unary call's reply takes the shorter way, ResumeCallerNow.
  void Resume(Slot& s) {
    ResumeWaiter(s, &Slot::resume);
    ResumeWaiter(s, &Slot::write_resume);
  }

  void ResumeWaiter(Slot& s, Waiter waiter, bool from_cancellation = false) {
    if (!(s.*waiter)) return;
    // The caller's coroutine runs on this channel's executor (Channel::Call hops here first).
    asio::post(executor_,
               [h = TakeWaiter(s, waiter, from_cancellation)]() mutable { std::move(h)(); });
  }

  // Takes the handler suspended on `s.*waiter` (present) out of the slot; the slot forgets its
  // deadline once nobody waits on it. The caller's cancellation handler is cleared, unless it is
  // what called us (`from_cancellation`: it must not be destroyed while it runs).
  Resumer TakeWaiter(Slot& s, Waiter waiter, bool from_cancellation) {
    Resumer h = TakeParked(s.*waiter);
    if (!s.resume && !s.write_resume) s.deadline = Clock::time_point::max();
    if (!from_cancellation) h.get_cancellation_slot().clear();
    return h;
  }

  // Resumes a unary call's caller here and now, rather than from a posted handler (an
  // event-loop turn, an allocation and a scheduler lock per call). Only as the last step of
  // OnMessage: the caller may start another call, close or drop the channel before this returns,
  // which the transports allow from inside OnMessage (Send and Close are re-entrant there, and a
  // connection keeps its handler alive until OnClose, which is posted). We are on executor_'s
  // thread: OnMessage runs on the connection's executor, which is the channel's, and the caller's
  // coroutine runs there too (Channel::Call hops there first).
  void ResumeCallerNow(Slot& s, uint32_t index) {
    if (s.parked) {
      EndParked(s, index);
      return;
    }
    if (!s.resume) return;
    Resumer h = TakeWaiter(s, &Slot::resume, /*from_cancellation=*/false);
    // What the caller's code throws does not come back through here: its coroutine's
    // completion is dispatched through its executor, which keeps an exception for
    // io_context::run() to rethrow (rpc_integration_test: "a caller resumed by its reply...").
    std::move(h)();
  }

  // ResumeCallerNow for a call started by TryCallParked: its Status to its caller, here and now.
  void EndParked(Slot& s, uint32_t index) {
    internal::AwaitingHandler<Status> h = TakeParkedHandler(s, /*from_cancellation=*/false);
    if (!s.status.ok()) return FinishParked(index, std::move(h), false);
    // The usual end, without EndUnary's Status moves.
    if (s.stats) s.stats->Finished(StatusCode::kOk, Clock::now() - s.intercepted_at, 0, 0);
    FreeSlot(index);
    std::move(h)(Status());
  }

  // Wakes a call started by TryCallParked for another reason than its reply (cancellation,
  // deadline, lost connection), from the event loop as ResumeWaiter does: its end (EndUnary) is
  // worked out there, where a reply that came meanwhile still counts.
  void WakeParked(uint32_t index, bool from_cancellation) {
    asio::post(executor_, [self = shared_from_this(), index,
                           h = TakeParkedHandler(calls_[index], from_cancellation),
                           from_cancellation]() mutable {
      const bool cancelled = from_cancellation || h.get_cancellation_state().cancelled() !=
                                                      asio::cancellation_type::none;
      self->FinishParked(index, std::move(h), cancelled);
    });
  }

  // The end of parked call `index` (EndUnary), told to its metrics recorder and then to its
  // caller, through `h` (taken from the slot).
  void FinishParked(uint32_t index, internal::AwaitingHandler<Status>&& h, bool cancelled) {
    Slot& s = calls_[index];
    MethodStats* const stats = s.stats;
    const Clock::time_point started = s.intercepted_at;
    Status status = EndUnary(index, *s.method, s.timeout, cancelled);
    if (stats) stats->Finished(status.code(), Clock::now() - started, 0, 0);
    std::move(h)(std::move(status));
  }

  // Resumes the caller waiting on call `index` (a parked one included): its deadline passed, or
  // its connection went.
  void WakeCaller(Slot& s, uint32_t index) {
    if (s.parked) {
      WakeParked(index, /*from_cancellation=*/false);
    } else {
      Resume(s);
    }
  }

  internal::AwaitingHandler<Status> TakeParkedHandler(Slot& s, bool from_cancellation) {
    internal::AwaitingHandler<Status> h = std::move(*s.parked);
    s.parked.reset();
    s.deadline = Clock::time_point::max();
    if (!from_cancellation) h.get_cancellation_slot().clear();
    return h;
  }

  // Arms the channel's deadline timer for `deadline` if it is earlier than the one it waits for.
  // The test inline, the arming out of line: most calls' deadlines come after the armed one,
  // and a function that may arm the timer saves and restores registers (~20 instructions) even
  // when it returns at once.
  void ArmDeadline(Clock::time_point deadline) {
    if (deadline < deadline_armed_) RearmDeadline(deadline);
  }
  [[gnu::noinline]] void RearmDeadline(Clock::time_point deadline) {
    deadline_armed_ = deadline;
    deadline_timer_.expires_at(deadline);
    std::weak_ptr<ChannelCore> weak = shared_from_this();
    deadline_timer_.async_wait([weak](boost::system::error_code ec) {
      if (auto self = weak.lock(); self && !ec) self->OnDeadlineTimer();
    });
  }

  // Resumes every caller whose deadline has passed, stops counting abandoned calls past their
  // grace, and arms the timer for the next of either.
  void OnDeadlineTimer() {
    deadline_armed_ = Clock::time_point::max();
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (uint32_t i = 0; i < calls_.size(); ++i) {
      Slot& s = calls_[i];
      if (s.active && s.abandoned) {
        if (s.deadline <= now) {
          FreeSlot(i);  // kAbandonedGrace passed: the server had its chance to answer
        } else {
          next = std::min(next, s.deadline);
        }
        continue;
      }
      if (!s.resume && !s.write_resume && !s.parked) continue;
      if (s.deadline <= now) {
        WakeCaller(s, i);
      } else {
        next = std::min(next, s.deadline);
      }
    }
    if (next != Clock::time_point::max()) ArmDeadline(next);
  }

  uint32_t AllocSlot() {
    const uint32_t index = calls_.Alloc();
    Slot& s = calls_[index];
    s.done = s.sent = s.queued = s.abandoned = false;
    s.streaming = s.server_done = s.writes_done = false;
    s.interceptors = nullptr;
    s.method = nullptr;
    s.buffered = s.unreported = 0;
    s.send_credit = 0;
    return index;
  }

  void FreeSlot(uint32_t index) {
    Slot& s = calls_[index];
    // What a finished unary call leaves behind is nothing of these; the clean-up of the rest
    // is out of line, so that the common path saves and restores fewer registers. (A stream queue's
    // clear costs even when empty, hence the test before it.)
    if (s.queued || !s.status.ok() || !s.status.message().empty() || !s.messages.empty()) {
      ClearSlotLeftovers(s);
    }
    const bool was_sent = s.sent;
    if (s.sent) --in_flight_;
    abandoned_ -= s.abandoned;  // only a sent call is abandoned
    s.sent = s.abandoned = false;
    s.reply = nullptr;
    s.final_payload.clear();
    calls_.Free(index);
    if (!was_sent) return;
    if (state_ == State::kDraining && NobodyWaits() && conn_) {
      conn_->Close();  // the server is going away and we owe it nothing more
      return;
    }
    if (!waiting_.empty()) WakeWaiters();
  }

  // FreeSlot's test has found something to clear: clearing the rest as well changes nothing.
  [[gnu::noinline]] void ClearSlotLeftovers(Slot& s) {
    if (s.queued) waiting_.Remove(&s);
    s.status = Status();
    s.messages.Clear();
  }

  // The slot of a call the server may still answer: `call_id` (generation << 32 | index) names
  // a slot in range, in use, sent, of the same generation. Null for late replies and forged ids.
  Slot* SentSlot(uint64_t call_id, uint32_t* index) {
    Slot* s = calls_.Find(call_id, index);
    return s && s->sent ? s : nullptr;
  }
  // The same for a stream the server has not ended yet (its STREAM_MESSAGE and WINDOW frames).
  Slot* OpenStreamSlot(uint64_t call_id, uint32_t* index) {
    Slot* s = SentSlot(call_id, index);
    return s && s->streaming && !s->server_done ? s : nullptr;
  }

  void OnResponse(const DecodedFrame& f) {
    uint32_t index = 0;
    Slot* found = SentSlot(f.header.call_id, &index);
    if (!found) return;  // late reply
    Slot& s = *found;
    if (s.streaming && !s.server_done) {
      OnStreamEnd(s, index, f);
      return;
    }
    if (s.done) return;  // late reply
    if (s.abandoned) {
      FreeSlot(index);  // the server is done with it too: it no longer counts
      return;
    }
    // s.status is OK already (FreeSlot leaves it so, and nothing else sets it on a call that
    // is not done): only a failure sets it, out of line (fewer registers saved on the way).
    if (f.header.status != static_cast<uint32_t>(StatusCode::kOk)) {
      SetReplyError(s, f);
    } else if (f.payload.size() >= internal::kDecodedCheckFromBytes && ReplyTooLarge(s, f)) {
      // s.status says so; not parsed
    } else if (!internal::ParsePayload(*s.reply, f.payload)) {
      SetReplyError(s, f);
    }
    s.done = true;
    ResumeCallerNow(s, index);  // the last step: nothing of this channel is touched after it
  }

  // The server's PING: answered unless more than kPongQueueLimitBytes wait to reach the server
  // already. A server that floods PINGs and reads nothing would otherwise grow our send queue by
  // a PONG per PING without bound, and a client cannot stop reading, as a server does with a
  // client that does not take its replies (ServerConnection::Throttle): its own replies come the
  // same way. Nothing is lost by not answering: what is queued reaches the server before any
  // PONG would, and tells its keepalive we are alive.
  void OnPing(const DecodedFrame& f) {
    if (conn_ && conn_->queued_send_bytes() <= kPongQueueLimitBytes) AnswerPing(f);
  }
  static constexpr size_t kPongQueueLimitBytes = 64 * 1024;

  // What a message from the server may take once parsed beyond its own bytes: the message limit
  // (a hostile server's reply of many small or unknown fields would otherwise take some 17-26
  // times its size; rpc/internal/decoded_size.h).
  size_t ParsedAllowance() const { return options_.transport.max_message_bytes; }
  [[gnu::noinline]] Status ParsedTooLarge(const char* what, size_t bytes, size_t excess) const {
    return Status(StatusCode::kResourceExhausted,
                  internal::ParsedTooLargeText(what, bytes, excess, ParsedAllowance(),
                                               "(the message limit) allowed beyond them"));
  }
  // True (with s.status set) when the reply in `f` would take too much parsed.
  [[gnu::noinline]] bool ReplyTooLarge(Slot& s, const DecodedFrame& f) {
    const size_t excess = internal::DecodedExcess(*s.reply, f.payload);
    if (excess <= ParsedAllowance()) return false;
    s.status = ParsedTooLarge("reply", f.payload.size(), excess);
    return true;
  }

  // A unary reply that failed (the server's status) or does not parse.
  [[gnu::noinline]] static void SetReplyError(Slot& s, const DecodedFrame& f) {
    if (f.header.status == static_cast<uint32_t>(StatusCode::kOk)) {
      s.status = Status(StatusCode::kInternal, "reply does not parse as " + s.reply->GetTypeName());
    } else {
      s.status = ServerStatus(
          f.header.status,
          std::string_view(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()));
    }
  }

  // The end of a stream: its status. A reader that stopped early keeps its own.
  [[gnu::noinline]] void OnStreamEnd(Slot& s, uint32_t index, const DecodedFrame& f) {
    s.server_done = true;
    if (s.abandoned) {
      FreeSlot(index);
      return;
    }
    if (!s.done) {
      const std::string_view payload(reinterpret_cast<const char*>(f.payload.data()),
                                     f.payload.size());
      if (f.header.status == static_cast<uint32_t>(StatusCode::kOk)) {
        s.status = Status();
        // A client-streaming call's reply, parsed by FinishStream into the caller's message.
        if (s.method->kind == MethodKind::kClientStreaming) s.final_payload.assign(payload);
      } else {
        s.status = ServerStatus(f.header.status, payload);
      }
      s.done = true;
    }
    Resume(s);
  }

  // One message of a stream, kept until the reader takes it. A server that sends past the
  // stream's window (it had no credit left when it sent this) breaks the protocol.
  void OnStreamMessage(const DecodedFrame& f) {
    uint32_t index = 0;
    Slot* found = OpenStreamSlot(f.header.call_id, &index);
    if (!found) return;
    Slot& s = *found;
    if (s.method->kind == MethodKind::kClientStreaming) {
      // Its only answer is the final RESPONSE: nobody would read these, and they would stay
      // buffered until the call ends. The server breaks the protocol (as a client does that
      // sends messages on a server stream).
      LoseConnection("server sent a stream message on a client-streaming call");
      return;
    }
    if (s.abandoned || s.done) return;  // the reader stopped; our CANCEL is on its way
    if (s.buffered + s.unreported >= kStreamWindowBytes) {
      LoseConnection("server sent past a stream's flow-control window");
      return;
    }
    s.messages.Push(f.payload);
    s.buffered += kFrameHeaderBytes + f.payload.size();
    Resume(s);
  }

  // The server read more of a client stream: the writer may send that much more.
  void OnWindow(const DecodedFrame& f) {
    uint64_t bytes = 0;
    if (!DecodeWindow(f.payload, &bytes).empty()) {
      LoseConnection("server sent a malformed WINDOW frame");
      return;
    }
    uint32_t index = 0;
    Slot* s = OpenStreamSlot(f.header.call_id, &index);
    if (!s) return;
    s->send_credit = AddStreamCredit(s->send_credit, bytes);
    ResumeWaiter(*s, &Slot::write_resume);
  }

  // The largest message we may send: the smaller of our transport's limit and the server's.
  size_t MaxMessageBytes() const {
    size_t max = conn_->max_message_bytes();
    if (server_max_message_ != 0 && server_max_message_ < max) max = server_max_message_;
    return max;
  }

  // The wire id of the call in slot `index`: (generation << 32) | index (see ChannelCore).
  uint64_t CallId(uint32_t index) const { return calls_.CallId(index); }

  bool IsStream(uint32_t index, uint32_t generation) const {
    const Slot* s = calls_.Find(index, generation);
    return s && s->streaming && !s->abandoned;
  }

  // The oldest buffered message of stream `index` into `out`; false when it does not parse:
  // the stream is over then, with INTERNAL, and the messages after it are dropped.
  bool TakeStreamMessage(uint32_t index, google::protobuf::MessageLite& out) {
    Slot& s = calls_[index];
    const size_t bytes = s.messages.FrontSize();
    size_t excess = 0;
    const auto popped = s.messages.PopInto(out, ParsedAllowance(), &excess);
    TookStreamMessage(index, bytes);
    if (popped == internal::StreamQueue::Popped::kParsed) [[likely]]
      return true;
    StreamMessageUnparsed(index,
                          popped == internal::StreamQueue::Popped::kTooLarge
                              ? ParsedTooLarge("stream message", bytes, excess)
                              : Status(StatusCode::kInternal,
                                       "stream message does not parse as " + out.GetTypeName()));
    return false;
  }
  [[gnu::noinline]] void StreamMessageUnparsed(uint32_t index, Status why) {
    Slot& s = calls_[index];
    if (s.done) {
      // The server's end had come already (its status is behind the message in the stream):
      // the caller still lost a message, which the status must say.
      s.status = std::move(why);
    } else {
      StopStream(index, std::move(why));
    }
    DropBuffered(index);
  }

  // The reader took a message of `payload_bytes`: once half a window has been read, tell the
  // server it may send that much more.
  void TookStreamMessage(uint32_t index, size_t payload_bytes) {
    Slot& s = calls_[index];
    const uint64_t cost = kFrameHeaderBytes + payload_bytes;
    s.buffered -= cost;
    s.unreported += cost;
    if (s.unreported >= kStreamWindowBytes / 2 && !s.done && conn_ && !conn_->closed()) {
      internal::SendWindow(*conn_, CallId(index), s.unreported);
      s.unreported = 0;
    }
  }

  // The reader stops the stream with `why` (unless it has ended already): the server is told.
  void StopStream(uint32_t index, Status why) {
    Slot& s = calls_[index];
    if (s.done) return;
    s.done = true;
    s.status = std::move(why);
    if (!s.server_done) SendCancel(CallId(index));
    Resume(s);  // a Read or Write waiting elsewhere (Cancel from another thread) ends too
  }

  // A reader woken with nothing new: the caller cancelled (`cancelled`, the coroutine's
  // cancellation state), or else the stream's deadline passed.
  void StopAfterEmptyWake(uint32_t index, asio::cancellation_type cancelled) {
    StopStream(index, cancelled != asio::cancellation_type::none
                          ? Status(StatusCode::kCancelled,
                                   "stream from " + target_ + " cancelled by the caller")
                          : DeadlineStatus(calls_[index].timeout));
  }

  // The wire carries only the method's hash; we know its name (issue 14).
  Status NameUnknownMethod(Status status, const MethodInfo& method) const {
    if (status.code() == StatusCode::kUnimplemented &&
        status.message().starts_with(kUnknownMethodPrefix)) {
      return Status(StatusCode::kUnimplemented, "method " + std::string(method.full_name) +
                                                    " is not served by " + target_ + " (" +
                                                    status.message() + ")");
    }
    return status;
  }

  void OnSettings(const DecodedFrame& f) {
    Settings settings;
    if (std::string err = DecodeSettings(f.payload, &settings); !err.empty()) {
      LoseConnection("server sent bad SETTINGS: " + err);
      return;
    }
    server_limit_ = settings.max_concurrent_calls;
    server_max_message_ = settings.max_message_bytes;
    server_features_ = settings.features;
    if (state_ != State::kHandshaking) {
      WakeWaiters();  // the limit may have grown
      return;
    }
    handshake_timer_.cancel();
    state_ = State::kReady;
    reconnector_.ResetBackoff();
    last_error_ = Status();
    WatchPeer(weak_from_this(), options_.keepalive_interval, options_.keepalive_timeout,
              [](ChannelCore& self, std::string why) {
                spdlog::warn("channel {}: {}; closing", self.target_, why);
                self.LoseConnection(why);
              });
    first_ready_.cancel();  // wakes Channel::Connect, if it waits
    WakeWaiters();
  }

  // GOAWAY: the server is shutting down (UNAVAILABLE) or turned this connection away
  // (RESOURCE_EXHAUSTED at its connection limit). Calls already sent finish; new ones are not
  // sent on this connection, which we close once nothing is left on it.
  void OnGoAway(const DecodedFrame& f) {
    const std::string_view reason(reinterpret_cast<const char*>(f.payload.data()),
                                  f.payload.size());
    goaway_ = f.header.status == static_cast<uint32_t>(StatusCode::kOk)
                  ? Status(StatusCode::kUnavailable, ServerText(reason))
                  : ServerStatus(f.header.status, reason);
    idle_goaway_ = (f.header.flags & kGoAwayFlagIdle) != 0;
    spdlog::info("channel {}: GOAWAY from server: {}", target_, goaway_->ToString());
    if (state_ == State::kHandshaking) {
      last_error_ = *goaway_;
      handshake_timer_.cancel();
      conn_->Close();
      return;
    }
    if (state_ != State::kReady) return;
    state_ = State::kDraining;
    last_error_ = Status(StatusCode::kUnavailable,
                         "server " + target_ + " is going away: " + goaway_->message());
    WakeWaiters();
    if (NobodyWaits()) conn_->Close();
  }

  void SendCancel(uint64_t call_id) {
    if (!conn_ || conn_->closed()) return;
    FrameHeader h;
    h.type = FrameType::kCancel;
    h.call_id = call_id;
    conn_->Send(internal::FrameWriter(h, std::string_view()));
  }

  // The connection cannot be trusted or the server is silent: fail what is on it and close it
  // (OnClose follows and reconnects).
  void LoseConnection(const std::string& why) {
    last_error_ = Status(StatusCode::kUnavailable, "connection to " + target_ + " lost: " + why);
    FailSent(why);
    if (conn_) conn_->Close();
  }

  // The caller of a sent call gave up on it; see Slot::abandoned.
  void Abandon(uint32_t index) {
    Slot& s = calls_[index];
    if (!conn_ || conn_->closed()) {
      FreeSlot(index);  // nobody on the other end counts it any more
      return;
    }
    if (!s.abandoned) ++abandoned_;
    s.abandoned = true;
    s.reply = nullptr;
    s.deadline = Clock::now() + kAbandonedGrace;  // then it stops counting (OnDeadlineTimer)
    ArmDeadline(s.deadline);
    // Draining, and no caller waits on this connection any more: nothing it could still bring
    // is wanted (OnClose frees the abandoned slots and reconnects).
    if (state_ == State::kDraining && NobodyWaits()) conn_->Close();
  }

  // Fails every call on the wire with UNAVAILABLE (their replies can no longer come), and frees
  // the abandoned ones (the server stopped counting them with the connection).
  void FailSent(const std::string& why) {
    for (uint32_t i = 0; i < calls_.size(); ++i) {
      if (calls_[i].active && calls_[i].abandoned) FreeSlot(i);
    }
    for (uint32_t i = 0; i < calls_.size(); ++i) {
      Slot& s = calls_[i];
      if (s.active && s.sent && s.streaming) s.server_done = true;
      if (s.active && s.sent && !s.done) {
        s.status = Status(StatusCode::kUnavailable, "connection to " + target_ + " lost: " + why);
        s.done = true;
        WakeCaller(s, i);
      }
    }
  }

  void ScheduleReconnect(std::chrono::milliseconds delay) {
    reconnector_.Schedule(weak_from_this(), delay);
  }

  // ReconnectListener: attempts go on while the channel is down (not closed, not connecting).
  bool WantsConnection() const override { return state_ == State::kDown; }

  void OnReconnected(std::shared_ptr<transport::Connection> conn) override {
    spdlog::info("channel {}: reconnected", target_);
    Adopt(std::move(conn));
  }

  void OnReconnectFailed(const transport::Error& error) override {
    last_error_ = ConnectError(error);
    spdlog::debug("channel {}: reconnect failed: {}", target_, error.message);
    if (on_demand_) {
      // The calls that woke the channel from idle learn now; later ones fail fast as usual.
      on_demand_ = false;
      WakeWaiters();
    }
  }

  std::string target_;
  transport::Executor executor_;
  ChannelOptions options_;
  // executor_'s io_context executor, when it is one (else null): see Call.
  const asio::io_context::executor_type* io_executor_;
  State state_ = State::kDown;
  // Set by SendAdmitted when the transport refused a request on a connection it has closed
  // before telling us; taken at once by SendAdmitted's caller.
  bool unheard_close_ = false;
  bool started_ = false;
  Status last_error_;
  std::optional<Status> goaway_;
  uint32_t server_limit_ = 0;
  uint32_t server_max_message_ = 0;  // from SETTINGS; 0 = not announced
  uint32_t server_features_ = 0;     // from SETTINGS: kFeature* bits
  bool idle_goaway_ = false;         // the GOAWAY said the server closes us for being idle
  bool on_demand_ = false;           // reconnecting because a call arrived while kIdle
  uint32_t in_flight_ = 0;
  // Of in_flight_, the calls whose callers gave up (Slot::abandoned): a draining connection
  // waits for the others only. A server that sent GOAWAY and never answers an abandoned call
  // (hung, or hostile) would otherwise hold the channel in kDraining for good: no reconnect,
  // and every new call UNAVAILABLE.
  uint32_t abandoned_ = 0;
  // The send-queue bound (ChannelOptions::max_queued_bytes): bytes sent since the queue was
  // last measured (it is measured every queue_check_bytes_, not on every send: a virtual call),
  // and whether it was found over the bound -- calls and stream writers then wait until the
  // transport reports it at half (OnSendProgress). Per connection: cleared by Adopt (without a
  // connection nothing reads them: every use needs conn_ or a ready state).
  size_t unmeasured_bytes_ = 0;
  size_t queue_check_bytes_ = 0;
  bool send_full_ = false;
  asio::steady_timer handshake_timer_;
  Reconnector reconnector_;
  asio::steady_timer first_ready_{executor_};     // Channel::Connect waits on it for SETTINGS
  asio::steady_timer deadline_timer_{executor_};  // for the earliest deadline of a suspended call
  Clock::time_point deadline_armed_ = Clock::time_point::max();
  CallTable<Slot> calls_;
  // InterceptorsFor's answers, by method id; grows by the methods this channel calls.
  std::unordered_map<uint32_t, BoundMethod> bound_;
  BoundMethod unbound_;  // a second method with an id already bound: the interceptors as given
  BoundMethod* last_bound_ = nullptr;  // the last method called: usually the next one too
  WaitList<Slot> waiting_;             // calls waiting for room or for the connection
};

}  // namespace internal

Channel::Channel(std::string target, transport::Executor ex,
                 std::shared_ptr<internal::ChannelCore> core, std::shared_ptr<EventLoopThread> loop)
    : target_(std::move(target)),
      executor_(std::move(ex)),
      core_(std::move(core)),
      own_loop_(std::move(loop)) {}

Channel::~Channel() {
  if (own_loop_ && !own_loop_->in_loop_thread()) {
    // Our reference to the core (and its timers) must go on the loop, before the loop and its
    // io_context do: a timer outliving its io_context touches freed memory (found by ASan).
    std::promise<void> closed;
    asio::post(executor_, [&, core = std::move(core_)]() mutable {
      core->Shutdown();
      core.reset();
      closed.set_value();
    });
    closed.get_future().wait();
    own_loop_.reset();
    return;
  }
  // At once when this runs on the channel's loop (a coroutine dropping its channel, the usual
  // case): a posted close could be abandoned by a loop stopping right after, leaving the
  // connection <-> core reference cycle to leak both (LSan, stream_test, 2026-12-02).
  asio::dispatch(executor_, [core = core_] { core->Shutdown(); });
}

void Channel::Close() {
  asio::post(executor_, [core = core_] { core->Close(); });
}

void Channel::CheckNotInLoopThread() const {
  if (own_loop_ && own_loop_->in_loop_thread()) {
    throw std::logic_error("rdmarpc: blocking call on a channel from its own event-loop thread");
  }
}

asio::awaitable<Result<std::shared_ptr<Channel>>> Channel::Connect(std::string uri,
                                                                   ChannelOptions options) {
  auto ex = co_await asio::this_coro::executor;
  auto conn = co_await transport::Connect(uri, ex, options.transport);
  if (!conn.ok()) co_return internal::ConnectError(conn.error());
  auto core = std::make_shared<internal::ChannelCore>(uri, ex, std::move(options));
  core->Adopt(conn.value());
  Status ready = co_await core->AwaitFirstConnection();
  if (!ready.ok()) {
    core->Shutdown();
    co_return ready;
  }
  core->MarkStarted();
  co_return std::shared_ptr<Channel>(new Channel(uri, ex, std::move(core), nullptr));
}

Result<std::shared_ptr<Channel>> Channel::ConnectBlocking(std::string uri, ChannelOptions options) {
  auto loop = std::make_shared<EventLoopThread>();
  auto r = asio::co_spawn(loop->executor(), Connect(uri, options), asio::use_future).get();
  if (!r.ok()) return r.status();
  r.value()->own_loop_ = std::move(loop);
  return r;
}

asio::awaitable<internal::StreamRef> Channel::OpenStream(
    const MethodInfo& method, const google::protobuf::MessageLite& request,
    const CallOptions& options) {
  return OpenStreamWith(method, &request, options);
}

asio::awaitable<internal::StreamRef> Channel::OpenStream(const MethodInfo& method,
                                                         const CallOptions& options) {
  return OpenStreamWith(method, nullptr, options);
}

asio::awaitable<internal::StreamRef> Channel::OpenStreamWith(
    const MethodInfo& method, const google::protobuf::MessageLite* request,
    const CallOptions& options) {
  internal::StreamRef ref;
  ref.core = core_;
  ref.executor = executor_;
  auto current = co_await asio::this_coro::executor;
  // (if/else, not ?: : GCC 12 mishandles a co_await in a conditional expression's operands.)
  Status s;
  if (current == executor_) {
    s = co_await core_->OpenStream(method, request, options, &ref.index, &ref.generation);
  } else {
    s = co_await asio::co_spawn(
        executor_, core_->OpenStream(method, request, options, &ref.index, &ref.generation),
        asio::use_awaitable);
  }
  if (!s.ok()) {
    ref.core.reset();
    ref.error = std::move(s);
  }
  co_return ref;
}

namespace internal {

StreamTry TryReadStream(const StreamRef& ref, google::protobuf::MessageLite& out) {
  return ref.core->TryReadStream(ref.index, ref.generation, out);
}

asio::awaitable<bool> ReadStream(const StreamRef& ref, google::protobuf::MessageLite& out) {
  auto current = co_await asio::this_coro::executor;
  if (current == ref.executor)
    co_return co_await ref.core->ReadStream(ref.index, ref.generation, out);
  co_return co_await asio::co_spawn(
      ref.executor, ref.core->ReadStream(ref.index, ref.generation, out), asio::use_awaitable);
}

StreamTry TryWriteStream(const StreamRef& ref, const google::protobuf::MessageLite& m) {
  return ref.core->TryWriteStream(ref.index, ref.generation, m);
}

asio::awaitable<bool> WriteStream(const StreamRef& ref, const google::protobuf::MessageLite& m) {
  auto current = co_await asio::this_coro::executor;
  if (current == ref.executor)
    co_return co_await ref.core->WriteStream(ref.index, ref.generation, m);
  co_return co_await asio::co_spawn(
      ref.executor, ref.core->WriteStream(ref.index, ref.generation, m), asio::use_awaitable);
}

asio::awaitable<bool> HalfCloseStream(const StreamRef& ref) {
  auto current = co_await asio::this_coro::executor;
  if (current == ref.executor) co_return ref.core->HalfCloseStream(ref.index, ref.generation);
  co_return co_await asio::co_spawn(
      ref.executor,
      [](StreamRef r) -> asio::awaitable<bool> {
        co_return r.core->HalfCloseStream(r.index, r.generation);
      }(ref),
      asio::use_awaitable);
}

asio::awaitable<Status> FinishStream(const StreamRef& ref, google::protobuf::MessageLite* reply) {
  auto current = co_await asio::this_coro::executor;
  if (current == ref.executor)
    co_return co_await ref.core->FinishStream(ref.index, ref.generation, reply);
  co_return co_await asio::co_spawn(
      ref.executor, ref.core->FinishStream(ref.index, ref.generation, reply), asio::use_awaitable);
}

void CancelStream(const StreamRef& ref) {
  asio::post(ref.executor,
             [core = ref.core, i = ref.index, g = ref.generation] { core->CancelStream(i, g); });
}

void ReleaseStream(const StreamRef& ref) {
  asio::post(ref.executor,
             [core = ref.core, i = ref.index, g = ref.generation] { core->ReleaseStream(i, g); });
}

}  // namespace internal

bool Channel::TryCallParked(const MethodInfo& method, const google::protobuf::MessageLite& request,
                            google::protobuf::MessageLite& reply, const CallOptions& options,
                            internal::AwaitingHandler<Status>& handler) {
  return core_->TryCallParked(method, request, reply, options, handler);
}

Status Channel::StatusOf(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const boost::system::system_error& error) {
    if (error.code() == asio::error::operation_aborted) {
      return Status(StatusCode::kCancelled, "call cancelled by the caller");
    }
    return Status(StatusCode::kInternal, std::string("call failed: ") + error.what());
  } catch (const std::exception& error) {
    return Status(StatusCode::kInternal, std::string("call failed: ") + error.what());
  } catch (...) {
    return Status(StatusCode::kInternal, "call failed: unknown exception");
  }
}

asio::awaitable<Status> Channel::Call(const MethodInfo& method,
                                      const google::protobuf::MessageLite& request,
                                      google::protobuf::MessageLite& reply,
                                      const CallOptions& options) {
  return core_->Call(method, request, reply, options);  // (hops to the channel's thread itself)
}

}  // namespace rdmarpc

// The server's call plumbing: what runs one call between the connection that read its REQUEST
// and the user's handler -- the call's handle (ServerCall), its job, the connection's side of it
// (CallSink), cancellation and stream state. Runtime internals: generated code reaches them only
// through the method handler templates in rpc/service.h; applications never name them.
#pragma once

#include <google/protobuf/message_lite.h>

#include <algorithm>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "rpc/context.h"
#include "rpc/interceptor.h"
#include "rpc/internal/call_stats.h"
#include "rpc/internal/frame.h"  // kStreamWindowBytes
#include "rpc/internal/parse.h"
#include "rpc/internal/stream_queue.h"
#include "rpc/status.h"
#include "transport/transport.h"

namespace rdmarpc::internal {

// What only the runtime may change in a handler's ServerContext.
struct ContextAccess {
  // On a CANCEL frame, an expired deadline or a lost connection.
  static void MarkCancelled(ServerContext& c) { c.cancelled_ = true; }
  static void CountReceived(ServerContext& c, uint64_t bytes) { c.bytes_received_ += bytes; }
  static void CountSent(ServerContext& c, uint64_t bytes) { c.bytes_sent_ += bytes; }
};

// Client streams on the server: the messages the caller sent that the handler has not read yet
// (at most kStreamWindowBytes of frames, plus one message), and the handler's Read waiting.
struct StreamInbox {
  StreamQueue messages;
  uint64_t buffered = 0;    // frame bytes of `messages`
  uint64_t unreported = 0;  // frame bytes read since the last WINDOW sent to the caller
  // What the message the handler read last takes parsed beyond its bytes (DecodedExcess): the
  // handler holds it, parsed, until its next read (or the call's end), so it counts until then.
  uint64_t parsed_excess = 0;
  bool ended = false;  // the caller half-closed: nothing more comes
  boost::asio::any_completion_handler<void()> reader;
};

// A running call its connection can cancel: a node of the connection's intrusive list (no
// allocation; it lives in the call's own state). Touched only on the connection's thread.
struct CancelHook {
  uint64_t call_id = 0;
  ServerContext* context = nullptr;
  boost::asio::cancellation_signal* signal = nullptr;
  CancelHook* prev = nullptr;
  CancelHook* next = nullptr;

  // Streams (any kind): found by call id for their WINDOW and STREAM_MESSAGE frames.
  bool streaming = false;
  // Server streams: the bytes the caller still lets us send (see kStreamWindowBytes; negative
  // after a message larger than what was left), and the writer waiting for more.
  int64_t credit = 0;
  boost::asio::any_completion_handler<void()> credit_waiter;
  // The connection's executor, where waiters resume (streams only). A pointer: the call holds
  // its connection, which owns the executor, and copying an any_io_executor into every call's
  // hook (then moving and destroying it with the call) cost ~60 instructions per call.
  const transport::Executor* executor = nullptr;
  StreamInbox* inbox = nullptr;  // client streams: what the caller sent

  // Marks the call cancelled and cancels what its handler awaits; once only.
  void Cancel() {
    if (context->cancelled()) return;
    ContextAccess::MarkCancelled(*context);
    signal->emit(boost::asio::cancellation_type::terminal);
    WakeWriter();
    WakeReader();
  }

  // A WINDOW frame: the caller read `bytes` more of the stream.
  void AddCredit(uint64_t bytes) {
    credit = AddStreamCredit(credit, bytes);
    WakeWriter();
  }

  // Resumes a writer waiting for credit (posted: never inside the frame that caused it).
  void WakeWriter() {
    if (!credit_waiter) return;
    boost::asio::any_completion_handler<void()> h;
    h.swap(credit_waiter);  // swap: Boost 1.81's move-assignment recurses
    boost::asio::post(*executor, [h = std::move(h)]() mutable { std::move(h)(); });
  }

  // Resumes a Read waiting for the caller's next message (posted, as above).
  void WakeReader() {
    if (!inbox || !inbox->reader) return;
    boost::asio::any_completion_handler<void()> h;
    h.swap(inbox->reader);
    boost::asio::post(*executor, [h = std::move(h)]() mutable { std::move(h)(); });
  }
};

// A parsed call ready to run: the user's handler, its request and reply, and its ServerCall.
class CallJob {
 public:
  virtual ~CallJob() = default;
  // Makes the call cancellable through `cancel` and returns the user's handler, not started yet.
  // The runner awaits it in its own coroutine (a wrapper coroutine here would cost a frame and
  // a resumption per call), turns what it throws into INTERNAL and passes the Status to Finish.
  virtual boost::asio::awaitable<Status> Begin(boost::asio::cancellation_signal* cancel) = 0;
  // Finishes the call with `status`, the handler's. Called once, after Begin's handler is done.
  virtual void Finish(Status status) = 0;
  // Disposes of the job once its call is over (CallJobPtr's deleter): deletes it, or keeps it
  // for a later call (unary jobs, see UnaryMethodHandler).
  virtual void Recycle() { delete this; }
};
// A shared_ptr to `p` that owns nothing (no control block: copying, moving and destroying it
// touch no reference count), for what is known to outlive every copy.
template <class T>
std::shared_ptr<T> Unowned(T* p) {
  return std::shared_ptr<T>(std::shared_ptr<void>(), p);
}

struct RecycleCallJob {
  void operator()(CallJob* job) const { job->Recycle(); }
};
using CallJobPtr = std::unique_ptr<CallJob, RecycleCallJob>;

// What became of a unary call's reply (CallSink::FinishCall).
enum class ReplyFate : uint8_t {
  kUnsized,      // none was serialized or sized: no reply (an error status, a stream)
  kSent,         // sized (its cached size is current) and sent
  kRefused,      // sized, and over the message limit: the caller got RESOURCE_EXHAUSTED instead
  kUndelivered,  // nothing sent: the connection is closed (see CallSink::CallerGone)
};

// Implemented by the server's connection: where a call runs and its response goes.
class CallSink {
 public:
  // Runs `job` on the connection's thread, starting now (it runs until its handler first
  // suspends, inside this call); the job is destroyed once the call is finished.
  virtual void Run(CallJobPtr job) = 0;
  virtual ~CallSink() = default;
  // Sends the response (reply when status is OK; when `deliver` is false because the caller
  // cancelled, only a CANCELLED acknowledgement, so that both ends stop counting the call at the
  // same moment) and releases the call's in-flight slot and the `request_bytes` it was charged.
  // Called once per call, on the connection's thread.
  virtual ReplyFate FinishCall(uint64_t call_id, size_t request_bytes, const Status& status,
                               const google::protobuf::MessageLite* reply, bool deliver) = 0;
  // The error FinishCall would send instead of a reply message of `message_bytes` (over the
  // message limit), or OK: for those told of a call's end before its reply goes out.
  virtual Status CheckReply(size_t message_bytes) const = 0;
  // The connection is closed: nothing more reaches the caller. Its close, once delivered on the
  // connection's thread, cancels the calls still running; a call that ends before that (its
  // completion was queued first) is treated as cancelled too.
  virtual bool CallerGone() const = 0;
  virtual void Track(CancelHook* hook) = 0;
  virtual void Untrack(CancelHook* hook) = 0;
  // Server streams: sends one message of call `call_id`'s stream and says what it cost in
  // stream credit. False when it cannot go: the connection is gone (stream over, `error`
  // untouched) or the message is over the limit (`error` says so).
  virtual bool SendStreamMessage(uint64_t call_id, const google::protobuf::MessageLite& message,
                                 size_t* cost, Status* error) = 0;
  // Client streams: the handler took a message of `bytes` (frame bytes) out of `inbox`: it no
  // longer counts against the connection's memory budget (with kStreamMessageHeldBytes), and
  // the caller is sent WINDOW when half a window has been read. `parsed_excess`: what it takes
  // parsed beyond its bytes, counted in place of the last one's (StreamInbox::parsed_excess).
  virtual void StreamMessageTaken(uint64_t call_id, StreamInbox& inbox, size_t bytes,
                                  size_t parsed_excess) = 0;
  // The most a request may take parsed beyond its own bytes (many small or unknown fields):
  // more is refused unparsed (RESOURCE_EXHAUSTED).
  virtual size_t ParsedAllowance() const = 0;
  // The same for the next client-stream message of `inbox`: less what the messages the
  // connection's other streams' handlers hold parsed take beyond theirs, so that many streams
  // together hold no more than one may (each handler holds the message it read last).
  virtual size_t StreamParsedAllowance(const StreamInbox& inbox) const = 0;
  // A stream's call ended while its handler held a message read (StreamInbox::parsed_excess):
  // that excess no longer counts against the connection's streams (ServerCall::End).
  virtual void StreamExcessReleased(size_t parsed_excess) = 0;
  // Server streams: the connection holds more than its memory budget (replies its client has
  // not taken): a writer waits, whatever stream credit it has, until the connection wakes it
  // (CancelHook::WakeWriter) below half the budget. Stream credit alone does not bound what is
  // queued: a client may grant any credit in WINDOW frames and then read nothing.
  virtual bool OverBudget() = 0;
  virtual const transport::Executor& executor() const = 0;
};
// One in-flight server call: move-only handle that must be finished once. If it is dropped
// unfinished (the server is tearing down), the caller gets UNAVAILABLE.
class ServerCall {
 public:
  // `request_bytes`: the request's size, charged to the connection's memory budget until the
  // call finishes.
  ServerCall(std::shared_ptr<CallSink> sink, uint64_t call_id, size_t request_bytes,
             ServerContext context)
      : sink_(std::move(sink)),
        call_id_(call_id),
        request_bytes_(request_bytes),
        context_(std::move(context)) {}
  // The same, with the context built in place from its parts (see ServerContext).
  ServerCall(std::shared_ptr<CallSink> sink, uint64_t call_id, size_t request_bytes,
             std::shared_ptr<const std::string> peer, std::string_view method,
             std::chrono::steady_clock::time_point deadline, Metadata metadata)
      : sink_(std::move(sink)),
        call_id_(call_id),
        request_bytes_(request_bytes),
        context_(std::move(peer), method, deadline, std::move(metadata)) {}
  ServerCall(ServerCall&&) = default;
  ServerCall& operator=(ServerCall&&) = delete;
  ~ServerCall() {
    // Moved-from and finished calls have no sink: no Status (and its string) to build for them.
    if (sink_) Drop();
  }

  ServerContext& context() { return context_; }
  const transport::Executor& executor() const { return sink_->executor(); }
  uint64_t call_id() const { return call_id_; }
  CancelHook& hook() { return hook_; }
  // Where the call runs (for the handler template); null once finished.
  CallSink* sink() const { return sink_.get(); }

  // Makes the call cancellable by the caller: a CANCEL frame marks context() cancelled and
  // emits `signal` (terminal), which cancels whatever the handler is awaiting. Call once the
  // ServerCall has its final address.
  void TrackCancellation(boost::asio::cancellation_signal* signal) {
    hook_.call_id = call_id_;
    hook_.context = &context_;
    hook_.signal = signal;
    sink_->Track(&hook_);
    tracked_ = true;
  }

  // For streaming calls, instead of TrackCancellation: also makes the call's stream frames
  // reach it. `inbox` is null for server streams (the caller sends no messages).
  void TrackStream(boost::asio::cancellation_signal* signal, StreamInbox* inbox) {
    hook_.streaming = true;
    hook_.credit = static_cast<int64_t>(kStreamWindowBytes);
    hook_.executor = &executor();
    hook_.inbox = inbox;
    TrackCancellation(signal);
  }

  // Who hears how the call ends, set by the server only when someone does: its interceptors
  // (OnFinish, in reverse order; null: none), then a metrics recorder the runtime runs itself
  // (internal::ServerStatsRecorder; null: none), with the time since `started`. Both outlive
  // the call.
  void Observe(const ServerInterceptors* interceptors, MethodStats* stats,
               std::chrono::steady_clock::time_point started) {
    interceptors_ = interceptors;
    stats_ = stats;
    started_ = started;
    observed_ = true;
  }

  // Ends the call with `status` (and `reply`, sent when the status is OK). Once; later calls do
  // nothing. True when `reply` was serialized, so that its GetCachedSize() is current.
  bool Finish(const Status& status, const google::protobuf::MessageLite* reply) {
    auto sink = std::move(sink_);
    if (!sink) return false;
    if (observed_) [[unlikely]]
      return FinishObserved(*sink, status, reply);
    return Sized(End(*sink, status, reply));
  }

 private:
  static bool Sized(ReplyFate fate) {
    return fate == ReplyFate::kSent || fate == ReplyFate::kRefused;
  }

  ReplyFate End(CallSink& sink, const Status& status, const google::protobuf::MessageLite* reply) {
    if (tracked_) sink.Untrack(&hook_);
    tracked_ = false;
    // Messages the handler left unread stop counting against the connection with the call.
    size_t held = request_bytes_;
    if (hook_.inbox) {
      held += hook_.inbox->buffered + hook_.inbox->messages.size() * kStreamMessageHeldBytes +
              hook_.inbox->parsed_excess;
      if (hook_.inbox->parsed_excess) sink.StreamExcessReleased(hook_.inbox->parsed_excess);
      hook_.inbox->buffered = 0;
      hook_.inbox->parsed_excess = 0;
      hook_.inbox->messages.Clear();
    }
    // A cancelled call gets no reply, only an acknowledgement: the caller has already moved on.
    return sink.FinishCall(call_id_, held, status, reply, !context_.cancelled());
  }

  // The destructor's rare path and Finish's observers, out of line: inlined, they made every
  // call's destructor and Finish save more registers and build a frame (~40 instructions per
  // call without interceptors; a call with them pays one function call more).
  [[gnu::noinline]] void Drop() {
    Finish(Status(StatusCode::kUnavailable, "call dropped by server"), nullptr);
  }
  [[gnu::noinline]] bool FinishObserved(CallSink& sink, const Status& status,
                                        const google::protobuf::MessageLite* reply) {
    bool cancelled = context_.cancelled();
    if (interceptors_) {
      // Told before the reply goes out, they learn of a closed connection here (the metrics
      // recorder below, after, from FinishCall).
      if (!cancelled && sink.CallerGone()) [[unlikely]]
        cancelled = true;
      if (cancelled) [[unlikely]] {
        FinishInterceptorsCancelled();
      } else if (reply && status.ok()) {
        // They hear what the caller will: a reply over the message limit goes out as an error.
        const size_t bytes = reply->ByteSizeLong();
        if (Status refused = sink.CheckReply(bytes); !refused.ok()) [[unlikely]] {
          TellInterceptors(refused);
        } else {
          ContextAccess::CountSent(context_, bytes);
          TellInterceptors(status);
        }
      } else {
        TellInterceptors(status);
      }
    }
    const ReplyFate fate = End(sink, status, reply);
    if (stats_) {
      // The reply's size from its serialization, unless the interceptors counted it already.
      uint64_t sent = context_.bytes_sent();
      if (fate == ReplyFate::kSent && !interceptors_) {
        sent += static_cast<uint64_t>(reply->GetCachedSize());
      }
      StatusCode code = status.code();
      if (cancelled || fate == ReplyFate::kUndelivered) [[unlikely]] {
        code = StatusCode::kCancelled;
      } else if (fate == ReplyFate::kRefused) [[unlikely]] {
        code = StatusCode::kResourceExhausted;
      }
      stats_->Finished(code, std::chrono::steady_clock::now() - started_, context_.bytes_received(),
                       sent);
    }
    return Sized(fate);
  }
  // The caller cancelled: the interceptors see CANCELLED whatever the handler returned. Apart,
  // so that the common path builds no Status of its own (inline, it kept an optional<Status>
  // on FinishInterceptors' stack, with the stack-protector check that comes with it: ~10
  // instructions per call).
  [[gnu::noinline, gnu::cold]] void FinishInterceptorsCancelled() {
    TellInterceptors(Status(StatusCode::kCancelled, "cancelled by the caller"));
  }
  [[gnu::always_inline]] void TellInterceptors(const Status& seen) {
    const auto elapsed = std::chrono::steady_clock::now() - started_;
    for (auto it = interceptors_->rbegin(); it != interceptors_->rend(); ++it) {
      (*it)->OnFinish(context_, seen, elapsed);
    }
  }

  std::shared_ptr<CallSink> sink_;
  uint64_t call_id_;
  size_t request_bytes_;
  ServerContext context_;
  CancelHook hook_;
  bool tracked_ = false;
  bool observed_ = false;  // Observe was called
  const ServerInterceptors* interceptors_ = nullptr;
  MethodStats* stats_ = nullptr;
  std::chrono::steady_clock::time_point started_;
};

// The non-template half of the server's stream handles (server.cc).
class ServerStream {
 public:
  explicit ServerStream(ServerCall& call) : call_(call) {}
  boost::asio::awaitable<bool> Write(const google::protobuf::MessageLite& message);
  // Until a Write would go without waiting; false once the stream is over (see
  // ServerWriter::Writable).
  boost::asio::awaitable<bool> Writable();
  // The caller's next message into `out`; false at the end (see ServerReader::Read).
  boost::asio::awaitable<bool> Read(google::protobuf::MessageLite& out);
  template <class Req>
  boost::asio::awaitable<std::optional<Req>> ReadAs() {
    std::optional<Req> message(std::in_place);
    StreamTry got = TryRead(*message);
    if (got == StreamTry::kWait)
      got = co_await Read(*message) ? StreamTry::kDone : StreamTry::kOver;
    if (got == StreamTry::kDone) co_return std::move(message);
    co_return std::nullopt;
  }
  // Read without waiting: a message already received (into `out`), the end, or kWait.
  StreamTry TryRead(google::protobuf::MessageLite& out);
  // Set when a message could not be sent or read for a reason of its own (too large, does not
  // parse): the call ends with it, whatever the handler returns.
  const Status& error() const { return error_; }

 private:
  // The stream can carry nothing more: a message failed (error_), the connection went, or the
  // caller cancelled.
  bool Over() const {
    return !error_.ok() || call_.sink() == nullptr || call_.context().cancelled();
  }

  ServerCall& call_;
  Status error_;
  // Frame bytes written since the handler last let its I/O thread go (see kYieldEveryBytes).
  size_t unyielded_bytes_ = 0;
};
// Runs the job on its call's connection.
template <class Job>
void RunJob(std::unique_ptr<Job> job) {
  CallSink* sink = job->call.sink();
  sink->Run(CallJobPtr(job.release()));
}

// Parses `payload` into `request`; when it does not parse, finishes `call` with
// INVALID_ARGUMENT and returns false.
inline bool ParseRequest(google::protobuf::MessageLite& request, std::span<const std::byte> payload,
                         ServerCall& call) {
  if (ParsePayload(request, payload)) return true;
  call.Finish(
      Status(StatusCode::kInvalidArgument, "request does not parse as " + request.GetTypeName()),
      nullptr);
  return false;
}

// Parses `payload` into the job's request and runs the job on its connection, or finishes the
// call with INVALID_ARGUMENT when the request does not parse.
template <class Job>
void ParseAndRun(std::unique_ptr<Job> job, std::span<const std::byte> payload) {
  if (ParseRequest(job->request, payload, job->call)) RunJob(std::move(job));
}

// A stream's Status: a stream error (a message too large, one that does not parse) wins over
// whatever the handler returned.
inline Status StreamStatus(Status handler_status, const Status& stream_error) {
  return stream_error.ok() ? std::move(handler_status) : stream_error;
}
}  // namespace rdmarpc::internal

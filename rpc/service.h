// What generated code builds on: method ids, method tables, the Service base class and the
// handler template that runs one unary call. Users rarely include this directly; generated
// headers do.
#pragma once

#include <google/protobuf/message_lite.h>

#include <algorithm>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>  // for users of generated code, as before
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "rpc/context.h"
#include "rpc/method_id.h"
#include "rpc/status.h"
#include "transport/transport.h"

namespace rdmarpc {

// Identifies a method for a client call. Static storage in generated code.
struct MethodInfo {
  std::string_view full_name;  // "/demo.Echo/Say"
  uint32_t id;
};

namespace internal {
// A running call its connection can cancel: a node of the connection's intrusive list (no
// allocation; it lives in the call's own state). Touched only on the connection's thread.
struct CancelHook {
  uint64_t call_id = 0;
  ServerContext* context = nullptr;
  boost::asio::cancellation_signal* signal = nullptr;
  CancelHook* prev = nullptr;
  CancelHook* next = nullptr;

  // Server streams: the bytes the caller still lets us send (see kStreamWindowBytes; negative
  // after a message larger than what was left), and the writer waiting for more.
  int64_t credit = 0;
  boost::asio::any_completion_handler<void()> credit_waiter;
  transport::Executor executor;  // the connection's: where the writer resumes (streams only)

  // Marks the call cancelled and cancels what its handler awaits; once only.
  void Cancel() {
    if (context->cancelled()) return;
    context->MarkCancelled();
    signal->emit(boost::asio::cancellation_type::terminal);
    WakeWriter();
  }

  // A WINDOW frame: the caller read `bytes` more of the stream.
  void AddCredit(uint64_t bytes) {
    credit += static_cast<int64_t>(std::min<uint64_t>(bytes, uint64_t(1) << 40));
    WakeWriter();
  }

  // Resumes a writer waiting for credit (posted: never inside the frame that caused it).
  void WakeWriter() {
    if (!credit_waiter) return;
    boost::asio::any_completion_handler<void()> h;
    h.swap(credit_waiter);  // swap: Boost 1.81's move-assignment recurses
    boost::asio::post(executor, [h = std::move(h)]() mutable { std::move(h)(); });
  }
};

// A parsed call ready to run: the user's handler, its request and reply, and its ServerCall.
class CallJob {
 public:
  virtual ~CallJob() = default;
  // Makes the call cancellable through `cancel`, runs the user's handler and finishes the call.
  // Never throws: a throwing handler finishes the call with INTERNAL.
  virtual boost::asio::awaitable<void> Run(boost::asio::cancellation_signal* cancel) = 0;
};

// Implemented by the server's connection: where a call runs and its response goes.
class CallSink {
 public:
  // Runs `job` on the connection's thread, starting now (it runs until its handler first
  // suspends, inside this call); the job is destroyed once the call is finished.
  virtual void Run(std::unique_ptr<CallJob> job) = 0;
  virtual ~CallSink() = default;
  // Sends the response (reply when status is OK; when `deliver` is false because the caller
  // cancelled, only a CANCELLED acknowledgement, so that both ends stop counting the call at the
  // same moment) and releases the call's in-flight slot and the `request_bytes` it was charged.
  // Called once per call, on the connection's thread.
  virtual void FinishCall(uint64_t call_id, size_t request_bytes, const Status& status,
                          const google::protobuf::MessageLite* reply, bool deliver) = 0;
  virtual void Track(CancelHook* hook) = 0;
  virtual void Untrack(CancelHook* hook) = 0;
  // Server streams: sends one message of call `call_id`'s stream and says what it cost in
  // stream credit. False when it cannot go: the connection is gone (stream over, `error`
  // untouched) or the message is over the limit (`error` says so).
  virtual bool SendStreamMessage(uint64_t call_id, const google::protobuf::MessageLite& message,
                                 size_t* cost, Status* error) = 0;
  virtual const transport::Executor& executor() const = 0;
};
}  // namespace internal

// One in-flight server call: move-only handle that must be finished once. If it is dropped
// unfinished (the server is tearing down), the caller gets UNAVAILABLE.
class ServerCall {
 public:
  // `request_bytes`: the request's size, charged to the connection's memory budget until the
  // call finishes.
  ServerCall(std::shared_ptr<internal::CallSink> sink, uint64_t call_id, size_t request_bytes,
             ServerContext context)
      : sink_(std::move(sink)),
        call_id_(call_id),
        request_bytes_(request_bytes),
        context_(std::move(context)) {}
  ServerCall(ServerCall&&) = default;
  ServerCall& operator=(ServerCall&&) = delete;
  ~ServerCall() {
    // Moved-from and finished calls have no sink: no Status (and its string) to build for them.
    if (sink_) Finish(Status(StatusCode::kUnavailable, "call dropped by server"), nullptr);
  }

  ServerContext& context() { return context_; }
  const transport::Executor& executor() const { return sink_->executor(); }
  uint64_t call_id() const { return call_id_; }
  internal::CancelHook& hook() { return hook_; }
  // Where the call runs (for the handler template); null once finished.
  internal::CallSink* sink() const { return sink_.get(); }

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

  void Finish(const Status& status, const google::protobuf::MessageLite* reply) {
    auto sink = std::move(sink_);
    if (!sink) return;
    if (tracked_) sink->Untrack(&hook_);
    tracked_ = false;
    // A cancelled call gets no reply, only an acknowledgement: the caller has already moved on.
    sink->FinishCall(call_id_, request_bytes_, status, reply, !context_.cancelled());
  }

 private:
  std::shared_ptr<internal::CallSink> sink_;
  uint64_t call_id_;
  size_t request_bytes_;
  ServerContext context_;
  internal::CancelHook hook_;
  bool tracked_ = false;
};

namespace internal {
// The non-template half of ServerWriter (server.cc).
class ServerStream {
 public:
  explicit ServerStream(ServerCall& call) : call_(call) {}
  boost::asio::awaitable<bool> Write(const google::protobuf::MessageLite& message);
  // Set when a message could not be sent for a reason of its own (too large): the call ends
  // with it, whatever the handler returns.
  const Status& error() const { return error_; }

 private:
  ServerCall& call_;
  Status error_;
};
}  // namespace internal

// The sending end of a server stream, handed to a server-streaming method's handler. Owned by
// the call; valid until the handler returns. Use from the handler's coroutine only.
template <class Resp>
class ServerWriter {
 public:
  explicit ServerWriter(ServerCall& call) : stream_(call) {}
  ServerWriter(const ServerWriter&) = delete;
  ServerWriter& operator=(const ServerWriter&) = delete;

  // Sends `message`, after those written before it. Waits while the caller's flow-control window
  // is used up (kStreamWindowBytes: a slow reader slows the writer down; memory stays bounded).
  // Returns false when the stream is over (the caller cancelled or its deadline passed, the
  // connection is gone) or `message` is over the message limit (the call then ends with
  // RESOURCE_EXHAUSTED, whatever the handler returns): stop writing and return.
  boost::asio::awaitable<bool> Write(const Resp& message) { return stream_.Write(message); }

  const Status& error() const { return stream_.error(); }

 private:
  internal::ServerStream stream_;
};

class Service;

// Runs one method: parses the request, calls the user's coroutine, sends the reply.
class MethodHandler {
 public:
  // `payload` is valid only during this call.
  virtual void Start(Service& service, ServerCall call,
                     std::span<const std::byte> payload) const = 0;

 protected:
  ~MethodHandler() = default;
};

struct MethodEntry {
  MethodInfo info;
  const MethodHandler* handler;
};

// Base of every generated service class. Register an implementation with Server::AddService;
// it must outlive the server. Handlers of one connection run on that connection's I/O thread;
// handlers of different connections may run concurrently on different threads, so state shared
// across calls needs its own synchronization.
class Service {
 public:
  virtual ~Service() = default;
  virtual std::string_view rdmarpc_service_name() const = 0;
  virtual std::span<const MethodEntry> rdmarpc_methods() const = 0;
};

namespace internal {
// Parses `payload` into the job's request and runs the job on its connection, or finishes the
// call with INVALID_ARGUMENT when the request does not parse.
template <class Job>
void ParseAndRun(std::unique_ptr<Job> job, std::span<const std::byte> payload) {
  CallSink* sink = job->call.sink();
  if (!job->request.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    job->call.Finish(Status(StatusCode::kInvalidArgument,
                            "request does not parse as " + job->request.GetTypeName()),
                     nullptr);
    return;
  }
  sink->Run(std::move(job));
}
}  // namespace internal

// The handler of a unary method with request Req and reply Resp. A generated constant.
template <class Req, class Resp>
class UnaryMethodHandler final : public MethodHandler {
 public:
  using Invoker = boost::asio::awaitable<Status> (*)(Service&, ServerContext&, const Req&, Resp&);
  explicit constexpr UnaryMethodHandler(Invoker invoke) : invoke_(invoke) {}

  void Start(Service& service, ServerCall call, std::span<const std::byte> payload) const override {
    // One allocation per call holds the context, request and reply.
    internal::ParseAndRun(std::make_unique<Job>(invoke_, service, std::move(call)), payload);
  }

 private:
  struct Job final : internal::CallJob {
    Job(Invoker i, Service& s, ServerCall c) : invoke(i), service(s), call(std::move(c)) {}
    boost::asio::awaitable<void> Run(boost::asio::cancellation_signal* cancel) override {
      call.TrackCancellation(cancel);
      Status status;
      try {
        status = co_await invoke(service, call.context(), request, reply);
      } catch (const std::exception& e) {
        status = Status(StatusCode::kInternal, std::string("handler threw: ") + e.what());
      } catch (...) {
        status = Status(StatusCode::kInternal, "handler threw a non-standard exception");
      }
      call.Finish(status, status.ok() ? &reply : nullptr);
    }
    Invoker invoke;
    Service& service;
    ServerCall call;
    Req request;
    Resp reply;
  };

  Invoker invoke_;
};

// The handler of a server-streaming method: one request, any number of replies written through
// a ServerWriter, then the handler's Status ends the stream. A generated constant.
template <class Req, class Resp>
class ServerStreamingMethodHandler final : public MethodHandler {
 public:
  using Invoker = boost::asio::awaitable<Status> (*)(Service&, ServerContext&, const Req&,
                                                     ServerWriter<Resp>&);
  explicit constexpr ServerStreamingMethodHandler(Invoker invoke) : invoke_(invoke) {}

  void Start(Service& service, ServerCall call, std::span<const std::byte> payload) const override {
    internal::ParseAndRun(std::make_unique<Job>(invoke_, service, std::move(call)), payload);
  }

 private:
  struct Job final : internal::CallJob {
    Job(Invoker i, Service& s, ServerCall c)
        : invoke(i), service(s), call(std::move(c)), writer(call) {}
    boost::asio::awaitable<void> Run(boost::asio::cancellation_signal* cancel) override {
      call.TrackCancellation(cancel);
      call.hook().credit = static_cast<int64_t>(kStreamWindowBytes);
      call.hook().executor = call.executor();  // set here, not per unary call
      Status status;
      try {
        status = co_await invoke(service, call.context(), request, writer);
      } catch (const std::exception& e) {
        status = Status(StatusCode::kInternal, std::string("handler threw: ") + e.what());
      } catch (...) {
        status = Status(StatusCode::kInternal, "handler threw a non-standard exception");
      }
      if (!writer.error().ok()) status = writer.error();
      call.Finish(status, nullptr);
    }
    Invoker invoke;
    Service& service;
    ServerCall call;
    ServerWriter<Resp> writer;  // after call: refers to it
    Req request;
  };

  Invoker invoke_;
};

}  // namespace rdmarpc

// What generated code builds on: method ids, method tables, the Service base class and the
// handler template that runs one unary call. Users rarely include this directly; generated
// headers do.
#pragma once

#include <google/protobuf/message_lite.h>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>  // for users of generated code, as before
#include <boost/asio/detached.hpp>
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

  // Marks the call cancelled and cancels what its handler awaits; once only.
  void Cancel() {
    if (context->cancelled()) return;
    context->MarkCancelled();
    signal->emit(boost::asio::cancellation_type::terminal);
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

// The handler of a unary method with request Req and reply Resp. A generated constant.
template <class Req, class Resp>
class UnaryMethodHandler final : public MethodHandler {
 public:
  using Invoker = boost::asio::awaitable<Status> (*)(Service&, ServerContext&, const Req&, Resp&);
  explicit constexpr UnaryMethodHandler(Invoker invoke) : invoke_(invoke) {}

  void Start(Service& service, ServerCall call, std::span<const std::byte> payload) const override {
    internal::CallSink* sink = call.sink();
    // One allocation per call holds the context, request and reply.
    auto job = std::make_unique<Job>(invoke_, service, std::move(call));
    if (!job->request.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      job->call.Finish(Status(StatusCode::kInvalidArgument,
                              "request does not parse as " + job->request.GetTypeName()),
                       nullptr);
      return;
    }
    sink->Run(std::move(job));
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

}  // namespace rdmarpc

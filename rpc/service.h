// What generated code builds on: method ids, method tables, the Service base class, the stream
// handles a streaming handler gets, and the handler templates that run one call of each kind.
// Users rarely include this directly; generated headers do. The plumbing the templates run on
// (the call's handle, its job, the connection's side) is internal: rpc/internal/dispatch.h.
#pragma once

#include <google/protobuf/message.h>
#include <google/protobuf/message_lite.h>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>  // for users of generated code, as before
#include <boost/asio/detached.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "rpc/context.h"
#include "rpc/internal/dispatch.h"  // the call plumbing the handler templates run on
#include "rpc/method_id.h"
#include "rpc/status.h"

namespace rdmarpc {

// Which way a method streams. The values are the REQUEST flags that announce it on the wire
// (kRequestFlagClientStream, kRequestFlagServerStream).
enum class MethodKind : uint8_t {
  kUnary = 0,
  kClientStreaming = 1,  // rpc Upload(stream Chunk) returns (Summary)
  kServerStreaming = 2,  // rpc Watch(Req) returns (stream Event)
  kBidiStreaming = 3,    // rpc Chat(stream Msg) returns (stream Msg)
};
const char* MethodKindName(MethodKind kind);

// Identifies a method for a client call. Static storage in generated code.
struct MethodInfo {
  std::string_view full_name;  // "/demo.Echo/Say"
  uint32_t id;
  MethodKind kind = MethodKind::kUnary;
};

// The sending end of a server stream, handed to a server-streaming method's handler. Owned by
// the call; valid until the handler returns. Use from the handler's coroutine only.
template <class Resp>
class ServerWriter {
 public:
  explicit ServerWriter(internal::ServerCall& call) : stream_(call) {}
  ServerWriter(const ServerWriter&) = delete;
  ServerWriter& operator=(const ServerWriter&) = delete;

  // Sends `message`, after those written before it. Waits while the caller's flow-control window
  // is used up (kStreamWindowBytes: a slow reader slows the writer down; memory stays bounded).
  // Returns false when the stream is over (the caller cancelled or its deadline passed, the
  // connection is gone) or `message` is over the message limit (the call then ends with
  // RESOURCE_EXHAUSTED, whatever the handler returns): stop writing and return.
  boost::asio::awaitable<bool> Write(const Resp& message) { return stream_.Write(message); }
  // Waits until a Write would go at once (the caller's window has room and its connection is
  // within its budget); false when the stream is over, as Write. For a handler that should not
  // build or hold its next message until the caller can take it -- one that copies it out of
  // shared state, say: waiting inside Write, it would hold that copy for as long as the caller
  // does not read. Nothing suspends between a true answer and the next Write on this stream.
  boost::asio::awaitable<bool> Writable() { return stream_.Writable(); }

  const Status& error() const { return stream_.error(); }

 private:
  internal::ServerStream stream_;
};

// The receiving end of a client stream, handed to a client-streaming method's handler. Owned by
// the call; valid until the handler returns. Use from the handler's coroutine only.
template <class Req>
class ServerReader {
 public:
  explicit ServerReader(internal::ServerCall& call) : stream_(call) {}
  ServerReader(const ServerReader&) = delete;
  ServerReader& operator=(const ServerReader&) = delete;

  // The caller's next message, in the order sent, or nullopt when there are no more: the caller
  // half-closed (WritesDone/Finish), cancelled, its deadline passed or its connection went (see
  // ServerContext::cancelled()), or a message did not parse (the call then ends with
  // INVALID_ARGUMENT, whatever the handler returns). The caller sends at most kStreamWindowBytes
  // ahead of what Read has taken: a handler that reads slowly holds the caller back.
  boost::asio::awaitable<std::optional<Req>> Read() { return stream_.ReadAs<Req>(); }
  // The same into `out`, which a loop can reuse: its fields keep their memory from message to
  // message (a new Req per message allocates its strings anew). True for a message, false
  // where Read() returns nullopt (then `out` is unspecified).
  boost::asio::awaitable<bool> Read(Req& out) { return stream_.Read(out); }

  const Status& error() const { return stream_.error(); }

 private:
  internal::ServerStream stream_;
};

// Both ends of a bidirectional stream, handed to its handler. One Read and one Write may be in
// progress at once (e.g. from two coroutines of the handler on the call's executor); reads and
// writes are independent: each direction has its own order and its own window.
template <class Req, class Resp>
class ServerReaderWriter {
 public:
  explicit ServerReaderWriter(internal::ServerCall& call) : stream_(call) {}
  ServerReaderWriter(const ServerReaderWriter&) = delete;
  ServerReaderWriter& operator=(const ServerReaderWriter&) = delete;

  // As ServerReader::Read.
  boost::asio::awaitable<std::optional<Req>> Read() { return stream_.ReadAs<Req>(); }
  boost::asio::awaitable<bool> Read(Req& out) { return stream_.Read(out); }
  // As ServerWriter::Write. Writing after the caller half-closed is fine: half-close ends only
  // the caller's direction.
  boost::asio::awaitable<bool> Write(const Resp& message) { return stream_.Write(message); }
  // As ServerWriter::Writable.
  boost::asio::awaitable<bool> Writable() { return stream_.Writable(); }

  const Status& error() const { return stream_.error(); }

 private:
  internal::ServerStream stream_;
};

class Service;

// Runs one method: parses the request, calls the user's coroutine, sends the reply.
class MethodHandler {
 public:
  // Takes `call` over (moved from once, into the call's job). `payload` is valid only during
  // this call.
  virtual void Start(Service& service, internal::ServerCall&& call,
                     std::span<const std::byte> payload) const = 0;
  // The request's message type, so that the server can tell what a request will take once
  // parsed before it parses it (rpc/internal/decoded_size.h); null for lite messages, which
  // have no descriptor.
  virtual const google::protobuf::Descriptor* request_type() const = 0;
  // Start finishes the call before it returns (an inline unary handler, rpc/options.proto).
  bool runs_inline() const { return runs_inline_; }

 protected:
  constexpr explicit MethodHandler(bool runs_inline = false) : runs_inline_(runs_inline) {}
  ~MethodHandler() = default;

  template <class Req>
  static const google::protobuf::Descriptor* DescriptorOf() {
    if constexpr (std::is_base_of_v<google::protobuf::Message, Req>) {
      // Once: descriptor() runs a std::call_once each time (~100 instructions).
      static const google::protobuf::Descriptor* const descriptor = Req::descriptor();
      return descriptor;
    } else {
      return nullptr;
    }
  }

 private:
  bool runs_inline_;
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
// The Status of a handler that threw (what it threw: `what`, null when not a std::exception).
Status HandlerThrew(const char* what);
}  // namespace internal

// The handler of a unary method with request Req and reply Resp. A generated constant.
// kInline: the method is marked `option (rdmarpc.inline_handler) = true;` in its .proto, and
// the user's handler is a plain function (returns Status, cannot suspend): it runs on the
// connection's I/O thread as soon as the request is parsed, and the reply goes out when it
// returns. No coroutine is resumed and none is kept waiting, which saves about a quarter of the
// server's work on a small call (docs/BENCHMARKS.md); the price is that the I/O thread serves
// nothing else until it returns.
template <class Req, class Resp, bool kInline = false>
class UnaryMethodHandler final : public MethodHandler {
 public:
  using Invoker =
      std::conditional_t<kInline, Status (*)(Service&, ServerContext&, const Req&, Resp&),
                         boost::asio::awaitable<Status> (*)(Service&, ServerContext&, const Req&,
                                                            Resp&)>;
  explicit constexpr UnaryMethodHandler(Invoker invoke) : MethodHandler(kInline), invoke_(invoke) {}
  const google::protobuf::Descriptor* request_type() const override { return DescriptorOf<Req>(); }

  void Start(Service& service, internal::ServerCall&& call,
             std::span<const std::byte> payload) const override {
    if constexpr (kInline) {
      StartInline(service, call, payload);
    } else {
      internal::CallJobPtr job(Job::Make(invoke_, service, std::move(call)));
      Job& j = static_cast<Job&>(*job);
      j.request_bytes = payload.size();  // at least what the parsed request holds
      if (!internal::ParseRequest(j.request, payload, *j.call)) return;
      internal::CallSink* sink = j.call->sink();
      sink->Run(std::move(job));
    }
  }

 private:
  static constexpr size_t kKeepBytes = 1024;  // request + reply, serialized

  // A finished call's reply size, for the limit above: from its serialization when it was sent
  // (`sized`: its cached size is current; computing it again, and the request's, cost ~45
  // instructions per call).
  static size_t ReplyBytes(const Resp& reply, bool sized) {
    return sized ? static_cast<size_t>(reply.GetCachedSize()) : reply.ByteSizeLong();
  }

  // An inline call's request and reply; its ServerCall stays where the server built it (the
  // call ends before Start returns). One is kept per thread for the next inline call of these
  // types, under the jobs' size limit; a call inside another's handler (a nested Start) gets
  // its own.
  struct Scratch {
    Req request;
    Resp reply;
  };
  struct ScratchSlot {
    Scratch* kept = nullptr;
    ~ScratchSlot() {
      scratch_gone = true;
      delete kept;
    }
  };
  static ScratchSlot& ThreadScratch() {
    static thread_local ScratchSlot slot;
    return slot;
  }
  // As Job::pool_gone, for ThreadScratch.
  static inline thread_local bool scratch_gone = false;

  void StartInline(Service& service, internal::ServerCall& call,
                   std::span<const std::byte> payload) const {
    std::unique_ptr<Scratch> s;
    if (!scratch_gone) s.reset(std::exchange(ThreadScratch().kept, nullptr));
    if (!s) s = std::make_unique<Scratch>();
    if (!internal::ParseRequest(s->request, payload, call)) return;
    // Nothing can cancel the call while it runs (no frame is read until it returns), so it is
    // not made cancellable: ServerContext::cancelled() stays false. A connection that closes
    // meanwhile (a send failed) gets no reply, as a coroutine's caller would not.
    Status status;
    try {
      status = invoke_(service, call.context(), s->request, s->reply);
    } catch (const std::exception& e) {
      status = internal::HandlerThrew(e.what());
    } catch (...) {
      status = internal::HandlerThrew(nullptr);
    }
    const bool sized = call.Finish(status, status.ok() ? &s->reply : nullptr);
    if (scratch_gone || payload.size() + ReplyBytes(s->reply, sized) > kKeepBytes) return;
    ScratchSlot& slot = ThreadScratch();
    if (slot.kept != nullptr) return;  // a nested call's was kept
    s->reply.Clear();                  // the request is cleared by the next parse (ParsePayload)
    slot.kept = s.release();
  }

  // One per call: the context (in `call`), the request and the reply. Finished jobs are kept
  // per thread for the next calls with the same request and reply types (at most kKeep),
  // unless their messages were large: a reused request parses into the strings it already
  // has and a reused reply is refilled in place (Clear keeps their capacity), which saves the
  // job's allocation and the payloads' on every call. The size limit bounds what a client can
  // leave pinned this way.
  struct Job final : internal::CallJob {
    static constexpr size_t kKeep = 32;

    static Job* Make(Invoker i, Service& s, internal::ServerCall&& c) {
      Job* j = nullptr;
      if (!pool_gone) {
        std::vector<Job*>& kept = ThreadPool().jobs;
        if (!kept.empty()) {
          j = kept.back();
          kept.pop_back();
        }
      }
      if (!j) j = new Job;
      j->invoke = i;
      j->service = &s;
      j->call.emplace(std::move(c));
      return j;
    }

    boost::asio::awaitable<Status> Begin(boost::asio::cancellation_signal* cancel) override {
      call->TrackCancellation(cancel);
      return invoke(*service, call->context(), request, reply);
    }
    void Finish(Status status) override {
      reply_sized = call->Finish(status, status.ok() ? &reply : nullptr);
    }

    void Recycle() override {
      call.reset();
      const size_t reply_bytes = ReplyBytes(reply, reply_sized);
      reply_sized = false;
      if (pool_gone || ThreadPool().jobs.size() >= kKeep ||
          request_bytes + reply_bytes > kKeepBytes) {
        delete this;
        return;
      }
      // The request is not cleared here: the next call's parse (ParsePayload) clears it first
      // anyway (a second Clear cost ~17 instructions per call).
      reply.Clear();
      ThreadPool().jobs.push_back(this);
    }

    Invoker invoke = nullptr;
    Service* service = nullptr;
    std::optional<internal::ServerCall> call;
    Req request;
    Resp reply;
    size_t request_bytes = 0;  // the request's serialized size
    bool reply_sized = false;  // reply was serialized when sent: GetCachedSize() is current

   private:
    struct Pool {
      std::vector<Job*> jobs;
      ~Pool() {
        pool_gone = true;
        for (Job* j : jobs) delete j;
      }
    };
    static Pool& ThreadPool() {
      static thread_local Pool pool;
      return pool;
    }
    // Set when this thread's pool is destroyed (thread exit): jobs finished on the thread after
    // that are deleted. Trivial, so it can still be read then.
    static inline thread_local bool pool_gone = false;
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
  const google::protobuf::Descriptor* request_type() const override { return DescriptorOf<Req>(); }

  void Start(Service& service, internal::ServerCall&& call,
             std::span<const std::byte> payload) const override {
    internal::ParseAndRun(std::make_unique<Job>(invoke_, service, std::move(call)), payload);
  }

 private:
  struct Job final : internal::CallJob {
    Job(Invoker i, Service& s, internal::ServerCall&& c)
        : invoke(i), service(s), call(std::move(c)), writer(call) {}
    boost::asio::awaitable<Status> Begin(boost::asio::cancellation_signal* cancel) override {
      call.TrackStream(cancel, nullptr);
      return invoke(service, call.context(), request, writer);
    }
    void Finish(Status status) override {
      call.Finish(internal::StreamStatus(std::move(status), writer.error()), nullptr);
    }
    Invoker invoke;
    Service& service;
    internal::ServerCall call;
    ServerWriter<Resp> writer;  // after call: refers to it
    Req request;
  };

  Invoker invoke_;
};

// The handler of a client-streaming method: any number of requests read through a ServerReader,
// then one reply with the handler's Status. The REQUEST frame carries no message. A generated
// constant.
template <class Req, class Resp>
class ClientStreamingMethodHandler final : public MethodHandler {
 public:
  using Invoker = boost::asio::awaitable<Status> (*)(Service&, ServerContext&, ServerReader<Req>&,
                                                     Resp&);
  explicit constexpr ClientStreamingMethodHandler(Invoker invoke) : invoke_(invoke) {}
  const google::protobuf::Descriptor* request_type() const override { return DescriptorOf<Req>(); }

  void Start(Service& service, internal::ServerCall&& call,
             std::span<const std::byte>) const override {
    internal::RunJob(std::make_unique<Job>(invoke_, service, std::move(call)));
  }

 private:
  struct Job final : internal::CallJob {
    Job(Invoker i, Service& s, internal::ServerCall&& c)
        : invoke(i), service(s), call(std::move(c)), reader(call) {}
    boost::asio::awaitable<Status> Begin(boost::asio::cancellation_signal* cancel) override {
      call.TrackStream(cancel, &inbox);
      return invoke(service, call.context(), reader, reply);
    }
    void Finish(Status status) override {
      status = internal::StreamStatus(std::move(status), reader.error());
      call.Finish(status, status.ok() ? &reply : nullptr);
    }
    Invoker invoke;
    Service& service;
    internal::ServerCall call;
    internal::StreamInbox inbox;
    ServerReader<Req> reader;  // after call: refers to it
    Resp reply;
  };

  Invoker invoke_;
};

// The handler of a bidirectional-streaming method: messages both ways through a
// ServerReaderWriter, then the handler's Status ends the call. A generated constant.
template <class Req, class Resp>
class BidiStreamingMethodHandler final : public MethodHandler {
 public:
  using Invoker = boost::asio::awaitable<Status> (*)(Service&, ServerContext&,
                                                     ServerReaderWriter<Req, Resp>&);
  explicit constexpr BidiStreamingMethodHandler(Invoker invoke) : invoke_(invoke) {}
  const google::protobuf::Descriptor* request_type() const override { return DescriptorOf<Req>(); }

  void Start(Service& service, internal::ServerCall&& call,
             std::span<const std::byte>) const override {
    internal::RunJob(std::make_unique<Job>(invoke_, service, std::move(call)));
  }

 private:
  struct Job final : internal::CallJob {
    Job(Invoker i, Service& s, internal::ServerCall&& c)
        : invoke(i), service(s), call(std::move(c)), stream(call) {}
    boost::asio::awaitable<Status> Begin(boost::asio::cancellation_signal* cancel) override {
      call.TrackStream(cancel, &inbox);
      return invoke(service, call.context(), stream);
    }
    void Finish(Status status) override {
      call.Finish(internal::StreamStatus(std::move(status), stream.error()), nullptr);
    }
    Invoker invoke;
    Service& service;
    internal::ServerCall call;
    internal::StreamInbox inbox;
    ServerReaderWriter<Req, Resp> stream;  // after call: refers to it
  };

  Invoker invoke_;
};

}  // namespace rdmarpc

// Interceptors: code that sees every call of a server or a channel, before and after it runs
// (authentication, access logs, metrics, tracing), without touching the handlers or stubs.
//
// Server (ServerOptions::interceptors): OnStart runs for each call, in list order, on the
// call's I/O thread, after the request arrived and before the handler starts (for streams:
// before the first message is read). It may read the call's metadata, add metadata the handler
// will see (ServerContext::AddMetadata, e.g. an authenticated identity), or reject the call by
// returning a non-OK Status, which the caller gets instead of running the handler. OnFinish runs
// when the call has ended, in reverse order, for every interceptor whose OnStart let the call
// through (after a rejection: those before the one that rejected), with the Status the caller
// is sent (the handler's; CANCELLED when the caller cancelled or its connection closed first;
// RESOURCE_EXHAUSTED when the reply is over the message limit) and how long it took since
// OnStart.
//
// Client (ChannelOptions::interceptors): OnStart runs before a call is sent (streams: opened),
// in list order, on the channel's thread; it may add metadata to the call's options or reject
// it (the caller gets that Status). OnFinish runs when the call completes (a stream: when its
// Finish returns or it is dropped), in reverse order, with the Status the caller gets and the
// time since OnStart.
//
// Per method: before a method's first call, each interceptor's ForMethod may hand over another
// interceptor for that method's calls (e.g. one holding that method's metrics), so that nothing
// is looked up by name per call.
//
// Threading and cost: interceptors are shared by every I/O thread (server) or used on the
// channel's thread (client), so their state needs its own synchronization; they run inline on
// the call path and must not block. With none configured a call pays one empty-list check.
// rdmarpc::Metrics' interceptors are the one exception to "called like any other": where one
// comes first in a list, the runtime records into its counters itself at the same points
// (first to start, last to finish), without the virtual calls (rpc/metrics.h).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "rpc/context.h"
#include "rpc/status.h"

namespace rdmarpc {

struct MethodInfo;

class ServerInterceptor {
 public:
  virtual ~ServerInterceptor() = default;
  // Called once for each method of each service added (Server::AddService, on that thread),
  // before any call: returns the interceptor that sees that method's calls, or null for this
  // one. Lets an interceptor find its per-method state (a metrics series, a policy) once
  // instead of on every call. What it returns is kept, and used from every I/O thread, as long
  // as the server lives.
  virtual std::shared_ptr<ServerInterceptor> ForMethod(const MethodInfo& method) {
    (void)method;
    return nullptr;
  }
  virtual Status OnStart(ServerContext& context) {
    (void)context;
    return Status();
  }
  virtual void OnFinish(const ServerContext& context, const Status& status,
                        std::chrono::nanoseconds elapsed) {
    (void)context, (void)status, (void)elapsed;
  }
};
using ServerInterceptors = std::vector<std::shared_ptr<ServerInterceptor>>;

class ClientInterceptor {
 public:
  virtual ~ClientInterceptor() = default;
  // Called the first time a channel calls (or opens a stream of) a method, on the channel's
  // thread: returns the interceptor that sees the channel's calls of that method, or null for
  // this one (as ServerInterceptor::ForMethod). A channel keeps what it returns until the
  // channel is destroyed, for each method it calls (methods are told apart by id and name).
  virtual std::shared_ptr<ClientInterceptor> ForMethod(const MethodInfo& method) {
    (void)method;
    return nullptr;
  }
  virtual Status OnStart(const MethodInfo& method, CallOptions& options) {
    (void)method, (void)options;
    return Status();
  }
  virtual void OnFinish(const MethodInfo& method, const Status& status,
                        std::chrono::nanoseconds elapsed) {
    (void)method, (void)status, (void)elapsed;
  }
};
using ClientInterceptors = std::vector<std::shared_ptr<ClientInterceptor>>;

// A server interceptor writing one line per call to the log (level info, logger "access"):
// peer, method, status code and duration, e.g.
//   access tcp://127.0.0.1:50312 /demo.Echo/Say OK 0.041 ms
// The sample servers install it with --access-log.
class AccessLogInterceptor final : public ServerInterceptor {
 public:
  void OnFinish(const ServerContext& context, const Status& status,
                std::chrono::nanoseconds elapsed) override;
};

}  // namespace rdmarpc

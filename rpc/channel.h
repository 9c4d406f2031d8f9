// Channel: the client side of one connection to a server, multiplexing any number of concurrent
// calls by call id. Generated stubs call through it.
//
// Threading: a channel lives on one executor (an io_context run by one thread). Calls may be
// awaited from coroutines on any executor: from elsewhere they hop to the channel's executor and
// back. The blocking API (Run, BlockingStub) must not be used from the channel's own thread.
//
// Errors: every call completes with a Status, never hangs: UNAVAILABLE when the connection is
// gone (calls in flight on it fail; the channel reconnects in the background, see
// ChannelOptions), DEADLINE_EXCEEDED when the timeout passes, RESOURCE_EXHAUSTED for an
// oversized request, or whatever the server's handler returned. A failed call is never retried
// by the channel: it may or may not have run on the server.
//
// Cancellation: a call is cancelled with Asio's per-operation cancellation (a cancellation slot
// bound to the co_await, e.g. asio::bind_cancellation_slot, or the awaitable operators' `||`).
// It completes at once with CANCELLED, and the server is told (a CANCEL frame): the handler sees
// ServerContext::cancelled(), what it awaits is cancelled, and no reply is sent. A passed
// deadline does the same on the server side.
#pragma once

#include <google/protobuf/message_lite.h>

#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/use_future.hpp>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>

#include "rpc/context.h"
#include "rpc/event_loop.h"
#include "rpc/interceptor.h"
#include "rpc/internal/parked.h"
#include "rpc/service.h"
#include "rpc/status.h"
#include "transport/transport.h"

namespace rdmarpc {

struct ChannelOptions {
  // transport.max_message_bytes also bounds what a reply or stream message may take once parsed
  // beyond its bytes (many small or unknown fields): one that would take more fails its call or
  // stream with RESOURCE_EXHAUSTED, unparsed.
  transport::Options transport;
  // Keepalive: when nothing has arrived from the server for `keepalive_interval`, send a PING;
  // when nothing at all arrives within `keepalive_timeout` after it, the server is taken for
  // dead (process stopped, machine gone, link cut without a close): the connection is closed
  // and every call in flight fails with UNAVAILABLE. Zero interval = off (the default).
  std::chrono::milliseconds keepalive_interval{0};
  std::chrono::milliseconds keepalive_timeout{5000};
  // Reconnect: after a lost connection (server restarted, keepalive timeout, GOAWAY) the channel
  // connects again in the background: at once, then after reconnect_backoff_initial, growing
  // 1.6x per failure (+-20% jitter) up to reconnect_backoff_max. Meanwhile calls fail at once
  // with UNAVAILABLE, or wait if they set CallOptions::wait_for_ready. false = a lost connection
  // is final (every later call fails with UNAVAILABLE).
  bool reconnect = true;
  std::chrono::milliseconds reconnect_backoff_initial{100};
  std::chrono::milliseconds reconnect_backoff_max{5000};
  // The most calls this channel keeps in flight; more wait their turn, in order, within their
  // deadlines (backpressure, not failure). The server's per-connection limit applies as well and
  // the smaller one wins. 0 = only the server's.
  uint32_t max_concurrent_calls = 0;
  // The most bytes of requests and stream messages the connection may hold that the server has
  // not taken yet (it is slow, or hostile: granting stream credit it never reads). Over it, new
  // calls and stream Writes wait (in order, within their deadlines) until it falls to half,
  // instead of queuing without bound. A single message larger than this still goes (alone).
  // 0 = no bound.
  size_t max_queued_bytes = 16u << 20;
  // Run around every call and stream, in order (see rpc/interceptor.h). Empty = none.
  ClientInterceptors interceptors;
};

namespace internal {
class ChannelCore;

// A client stream's place in its channel (the stream handles of rpc/stream.h hold one). `core`
// is null when the stream did not start; `error` then says why.
struct StreamRef {
  std::shared_ptr<ChannelCore> core;
  transport::Executor executor;
  uint32_t index = 0, generation = 0;
  Status error;
};
boost::asio::awaitable<bool> ReadStream(const StreamRef& ref, google::protobuf::MessageLite& out);
// ReadStream without waiting or hopping threads (kWait: off the channel's thread, or nothing
// received yet; ReadStream then). `ref.core` must be set.
StreamTry TryReadStream(const StreamRef& ref, google::protobuf::MessageLite& out);
boost::asio::awaitable<bool> WriteStream(const StreamRef& ref,
                                         const google::protobuf::MessageLite& message);
// WriteStream without waiting or hopping threads (kWait: off the channel's thread, or out of
// window; WriteStream then). `ref.core` must be set.
StreamTry TryWriteStream(const StreamRef& ref, const google::protobuf::MessageLite& message);
boost::asio::awaitable<bool> HalfCloseStream(const StreamRef& ref);
// `reply`: filled from the final answer of a client-streaming call when OK; else null.
boost::asio::awaitable<Status> FinishStream(const StreamRef& ref,
                                            google::protobuf::MessageLite* reply = nullptr);
void CancelStream(const StreamRef& ref);   // thread-safe
void ReleaseStream(const StreamRef& ref);  // thread-safe; cancels a running stream
}  // namespace internal

class Channel {
 public:
  // Connects to `uri` ("tcp://host:port" or "rdma://host:port") and waits for the server's
  // SETTINGS; the channel lives on the calling coroutine's executor, whose io_context must be
  // run by a single thread. Fails with UNAVAILABLE when the server cannot be reached or refuses
  // us (the reason says which, e.g. a wrong secret), RESOURCE_EXHAUSTED when the server is at its
  // connection limit (or, over RDMA, flooded with connections in set-up).
  static boost::asio::awaitable<Result<std::shared_ptr<Channel>>> Connect(std::string uri,
                                                                          ChannelOptions options);
  // (An overload, not a default argument: GCC 12 destroys a coroutine's defaulted class-type
  // argument twice.)
  static boost::asio::awaitable<Result<std::shared_ptr<Channel>>> Connect(std::string uri) {
    return Connect(std::move(uri), ChannelOptions{});
  }

  // Connects from ordinary (non-coroutine) code; the channel gets its own event-loop thread.
  static Result<std::shared_ptr<Channel>> ConnectBlocking(std::string uri,
                                                          ChannelOptions options = {});

  // Closes the connection; calls still in flight fail with UNAVAILABLE. The close runs on the
  // channel's executor: keep its io_context running until it has (ioc.run() returning is
  // enough), or the connection and the channel's state are never freed.
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // One unary call. `request` and `reply` must stay alive until the returned awaitable
  // completes; `reply` is filled only when the Status is OK. The caller resumes on the
  // channel's executor, straight from the delivery of its reply (no event-loop turn between):
  // it may start more calls or drop the channel there, but work that blocks delays the other
  // replies of that connection. The channel must outlive the awaitable's start (co_await it
  // at once).
  boost::asio::awaitable<Status> Call(const MethodInfo& method,
                                      const google::protobuf::MessageLite& request,
                                      google::protobuf::MessageLite& reply,
                                      const CallOptions& options);

  // The same call as an Asio asynchronous operation of signature void(Status), completing
  // through `token`. With boost::asio::deferred, co_awaited at once from an asio::awaitable
  // coroutine on the channel's thread:
  //   Status s = co_await channel->Call(method, request, reply, options, asio::deferred);
  // the call costs no coroutine frame of its own: the caller is resumed, with the Status, from
  // the delivery of its reply (13-18% of a 64 B call's instructions on the client; see
  // docs/BENCHMARKS.md). Any other token works too (a callback, use_future, use_awaitable),
  // through the coroutine above, as does deferred off the channel's thread or on a channel
  // with interceptors other than a metrics recorder alone. `request`, `reply` and `options` must
  // stay alive until the operation completes, and the channel until it starts. Cancellation as
  // above, through the token's cancellation slot.
  template <class CompletionToken>
  auto Call(const MethodInfo& method, const google::protobuf::MessageLite& request,
            google::protobuf::MessageLite& reply, const CallOptions& options,
            CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(Status)>(
        [](auto&& handler, Channel* channel, const MethodInfo* m,
           const google::protobuf::MessageLite* req, google::protobuf::MessageLite* rep,
           const CallOptions* o) {
          channel->StartCall(std::forward<decltype(handler)>(handler), *m, *req, *rep, *o);
        },
        token, this, &method, &request, &reply, &options);
  }

  // Starts a server-streaming call: sends the request and returns the stream's handle, which a
  // ClientReader reads (generated stubs wrap this). `request` must outlive the co_await.
  boost::asio::awaitable<internal::StreamRef> OpenStream(
      const MethodInfo& method, const google::protobuf::MessageLite& request,
      const CallOptions& options);
  // Starts a client-streaming or bidirectional call (no request: messages follow through the
  // handle, a ClientWriter or ClientReaderWriter). Fails with UNIMPLEMENTED when the server
  // predates client streams (its SETTINGS lack kFeatureClientStreams).
  boost::asio::awaitable<internal::StreamRef> OpenStream(const MethodInfo& method,
                                                         const CallOptions& options);

  // Runs `work` on the channel's executor and waits for its result. For blocking stubs; must
  // not be called from the channel's own thread (it would deadlock, so it throws instead).
  template <class T>
  T Run(boost::asio::awaitable<T> work) {
    CheckNotInLoopThread();
    return boost::asio::co_spawn(executor_, std::move(work), boost::asio::use_future).get();
  }

  // Closes the connection for good (no reconnect); calls in flight and later calls fail with
  // UNAVAILABLE. Thread-safe.
  void Close();

  const transport::Executor& executor() const { return executor_; }
  const std::string& target() const { return target_; }

 private:
  Channel(std::string target, transport::Executor ex, std::shared_ptr<internal::ChannelCore> core,
          std::shared_ptr<EventLoopThread> loop);
  boost::asio::awaitable<internal::StreamRef> OpenStreamWith(
      const MethodInfo& method, const google::protobuf::MessageLite* request,
      const CallOptions& options);
  void CheckNotInLoopThread() const;

  // The completion-token Call: the handler of a co_awaiting coroutine goes straight into the
  // call's slot when the call can be sent at once from here (TryCallParked); any other handler,
  // or a call that must wait, hop threads or pass interceptors, gets the coroutine's result.
  template <class Handler>
  void StartCall(Handler&& handler, const MethodInfo& method,
                 const google::protobuf::MessageLite& request, google::protobuf::MessageLite& reply,
                 const CallOptions& options) {
    using H = std::decay_t<Handler>;
    if constexpr (std::is_same_v<H, internal::AwaitingHandler<Status>>) {
      if (TryCallParked(method, request, reply, options, handler)) return;
    }
    H h(std::forward<Handler>(handler));
    auto slot = boost::asio::get_associated_cancellation_slot(h);
    auto ex = boost::asio::get_associated_executor(h, executor_);
    boost::asio::co_spawn(
        executor_, Call(method, request, reply, options),
        boost::asio::bind_cancellation_slot(
            slot, boost::asio::bind_executor(
                      ex, [h = std::move(h)](std::exception_ptr e, Status s) mutable {
                        if (e) s = StatusOf(e);
                        std::move(h)(std::move(s));
                      })));
  }
  // Sends the call and keeps `handler` (moved from) for its reply, when it can go at once from
  // this thread with no interceptor but a metrics recorder; false (`handler` untouched)
  // otherwise.
  bool TryCallParked(const MethodInfo& method, const google::protobuf::MessageLite& request,
                     google::protobuf::MessageLite& reply, const CallOptions& options,
                     internal::AwaitingHandler<Status>& handler);
  // What a call that threw (out of memory, say) completes with.
  static Status StatusOf(std::exception_ptr e);

  std::string target_;
  transport::Executor executor_;
  std::shared_ptr<internal::ChannelCore> core_;
  std::shared_ptr<EventLoopThread> own_loop_;  // set for ConnectBlocking channels
};

}  // namespace rdmarpc

// The scheme factory: Listen and Connect for any URI, dispatching on its scheme to the
// transport that serves it (tcp://, rdma://, inproc://). Here, not in transport.h, so that the
// interface does not depend on its implementations: //transport:interface is what a transport
// implements, //transport (this) is what the RPC layer calls.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>
#include <vector>

#include "transport/expected.h"
#include "transport/transport.h"

namespace rdmarpc::transport {

// Binds `uri` and accepts connections, spreading them round-robin over `executors` (one per
// I/O thread). Fails at once, with a message, if the address cannot be bound or the scheme's
// transport is unavailable (e.g. rdma:// without an RDMA device).
Expected<std::unique_ptr<Listener>> Listen(const std::string& uri,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options);

// Connects to `uri`; the connection lives on `executor`. Bounded by options.connect_timeout_ms.
boost::asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const std::string& uri,
                                                                      Executor executor,
                                                                      const Options& options);

// Runs `ioc` on the calling thread as ioc.run() does (returning when it is stopped or out of
// work), with the transports' own event loop: their descriptors are handled straight from an
// epoll_wait of the loop, and Asio (timers, sockets, handlers posted from any thread) runs as
// under run(). A wake-up costs ~300 instructions less (transport/poller.h says how). Once run
// this way, an io_context must be run only this way, by one thread at a time. Throws
// std::system_error if the loop's epoll set cannot be made; handlers may throw out of it as
// out of run().
void RunEventLoop(boost::asio::io_context& ioc);

}  // namespace rdmarpc::transport

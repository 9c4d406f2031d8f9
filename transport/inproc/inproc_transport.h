// The in-process transport: "inproc://NAME:PORT" connects a Channel to a Server in the same
// process without sockets or devices, with the same contract as tcp:// and rdma://
// (transport/transport.h): ordered messages delivered once, the same set-up refusals (the
// shared-secret check runs the real Authenticator), pause/resume, close notices.
//
// What it is for: testing the RPC protocol (admission, GOAWAY, keepalive, reconnection,
// deadlines, limits) without a network, and with faults a test injects at an exact message
// instead of waiting on timers (SetFaultHook below). It copies every message once and takes a
// mutex per message: it is not a fast path, and not a substitute for the tcp:// and rdma://
// suites, which run the same tests over the real transports.
//
// Addresses: NAME is any name without ':'; PORT 0 picks an unused number (Listener::uri() says
// which). Connecting to an address nobody listens on fails at once ("connection refused").
//
// Threading: as for every transport, a connection is used on its own executor only. The fault
// functions below may be called from any thread.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/expected.h"
#include "transport/transport.h"
#include "transport/uri.h"

namespace rdmarpc::transport::inproc {

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options);

boost::asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                                      Executor executor,
                                                                      const Options& options);

// --- fault injection (tests) -------------------------------------------------------------------

enum class Direction { kToServer, kToClient };

// What happens to one message a connection sends.
enum class Fault {
  kDeliver,  // as normal
  kDrop,     // lost without a trace: Send reports success, the peer never sees it
  kHold,     // kept back until ReleaseHeld (a delay with an explicit end); every later message
             // in the same direction queues behind it, so order is kept
  kReset,    // the connection breaks: both ends get OnClose at once, undelivered messages lost
};
// There is no "reorder": transports deliver in order, and the protocol relies on it.

// Decides each message's fate; called on the sending connection's thread, so it must be
// thread-safe when connections live on several threads. `message` is the whole message (for
// the RPC layer: one frame, header first).
using FaultHook = std::function<Fault(Direction direction, std::span<const std::byte> message)>;

// Installs `hook` for every connection, present and future, to listener `name` (the NAME of
// inproc://NAME:PORT, any port); an empty function removes it.
void SetFaultHook(std::string_view name, FaultHook hook);

// Lets every message held on connections to `name` go on, in order; returns how many.
size_t ReleaseHeld(std::string_view name);

// Messages currently held on connections to `name`.
size_t HeldCount(std::string_view name);

}  // namespace rdmarpc::transport::inproc

// Server: hosts services on one or more listening addresses, with N I/O threads.
//
// Threading: each I/O thread runs its own io_context; an accepted connection, and every handler
// coroutine of its calls, stays on one thread (no locks on the call path). AddService and Listen
// are for set-up, before Start; Shutdown and RequestShutdown may be called from any thread.
//
// Lifetime: services passed to AddService must outlive the server.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rpc/interceptor.h"
#include "rpc/service.h"
#include "rpc/status.h"
#include "transport/transport.h"

namespace rdmarpc {

struct ServerOptions {
  // I/O threads, each with its own event loop; connections are spread over them round-robin.
  int io_threads = 1;
  transport::Options transport;
  // Shutdown waits this long for in-flight calls before closing connections under them.
  std::chrono::milliseconds drain_timeout{5000};
  // Run() returns on SIGINT or SIGTERM (after draining) when true.
  bool handle_signals = false;
  // The most calls one connection may have running at once. Sent to the client at connection
  // set-up (SETTINGS), whose channel queues calls beyond it (backpressure, not failure); a client
  // that ignores it gets RESOURCE_EXHAUSTED for the excess. 0 = no limit.
  uint32_t max_concurrent_calls_per_connection = 1024;
  // The most client connections served at once, over all listeners and threads; one more is
  // refused as busy in its handshake, before anything is set up for it (or, when it passed the
  // handshake together with others and finds the server full after, turned away with GOAWAY),
  // and its Channel::Connect fails with RESOURCE_EXHAUSTED. 0 = no limit.
  uint32_t max_connections = 0;
  // The most connections served at once from one client address (the IP address, whatever the
  // port), so that one client cannot take every connection, every descriptor (each connection
  // holds one, over rdma:// too: its CM event channel) or, over rdma://, pinned memory without
  // end (a ring and a queue pair each, ~360 KiB on Soft-RoCE), and keep the others out. One more
  // is refused as busy in its handshake, as for max_connections, naming this option. On by
  // default: a client needs one connection per Channel, and a limit an operator must know to
  // set is one a hostile client finds first. Clients behind one NAT or proxy share an address:
  // size it for them (0 = no limit). An IPv6 client may hold many addresses: max_connections
  // bounds what all of them hold.
  uint32_t max_connections_per_peer = 256;
  // Keepalive towards clients (see ChannelOptions::keepalive_interval): a client silent for the
  // interval is pinged, and its connection closed when nothing arrives within the timeout; its
  // running handlers are cancelled. Zero interval = off (the default).
  std::chrono::milliseconds keepalive_interval{0};
  std::chrono::milliseconds keepalive_timeout{5000};
  // Memory one client can make the server hold: the requests of its running calls (each
  // counted with 3 KiB for what the runtime holds for it, 96 bytes per metadata entry, and its
  // client-stream messages not read yet with 64 bytes each beside their frames; a request of
  // 256 bytes or more at what it will take once parsed where that is more than its bytes, as
  // with many small or unknown fields, and refused with RESOURCE_EXHAUSTED before it is parsed
  // when that is more than this beyond its bytes -- or than max_buffered_bytes, when this is
  // 0; a client-stream message likewise when its handler reads it, counted until its next read
  // or the call's end, the messages all the connection's handlers hold together within that
  // bound) plus the
  // replies (and PONGs, and error answers) queued for it that it has not taken yet. Over this,
  // the server stops reading from that client (TCP: its socket; RDMA: no ring credit goes back)
  // until the figure falls to half: backpressure, not unbounded memory, and never a lost call.
  // Calls already running still finish, so the worst case is this plus the replies of at most
  // max_concurrent_calls_per_connection calls. 0 = no bound (not recommended).
  size_t max_buffered_bytes_per_connection = 16u << 20;
  // The same for all clients together, so that many connections (each within the bound above)
  // cannot add up to more: while the server holds more than this, a connection holding more
  // than its share (this / connections served) is not read until it is back under half its
  // share or the server under this (looked at again whenever its client takes replies or its
  // calls finish: a client that takes nothing stays paused). Tracked per connection to within
  // 32 KiB. 0 = no bound.
  // Large messages are held to it as well, apart: one arrives in pieces (over TCP into a read
  // buffer grown for it, kept after it for the next one; over RDMA a rendezvous read into a
  // buffer of its size), and a peer may send most of one and stop, or send one and go quiet.
  // A connection whose message needs more than fits in what is left is not read until it
  // fits, except for one connection at a time, whose message goes on so that large calls that
  // together exceed the bound still all arrive (one larger than the bound too); a TCP buffer
  // kept for the next large message is given back while the server is over the bound. Until
  // a message has arrived the idle timeout applies to its connection, and the next option.
  size_t max_buffered_bytes = size_t{1} << 30;
  // While some connection waits for room for a large message (see max_buffered_bytes), a large
  // message arriving elsewhere must keep arriving: one that has not advanced for this long is
  // given up and its connection sent GOAWAY (UNAVAILABLE, naming the stall) and closed, so that
  // a peer cannot keep its part of the bound, or the one turn past it (which would hold every
  // other large message back), by sending part of a message and stopping. It advances when its
  // buffer fills and must grow (TCP: it doubles, so a message must double what has arrived of
  // it within each period) or a chunk arrives (RDMA; a rendezvous read, at the network's pace,
  // is never a stall); time the server itself did not read from the connection does not count.
  // Nothing is closed while no one waits: a slow peer then holds only its part of the bound.
  // Zero = never (such a peer keeps it until idle_timeout).
  std::chrono::milliseconds stalled_message_timeout{10000};
  // A connection on which no call has started or finished for this long, with none running, is
  // sent GOAWAY (flagged idle) and closed: it frees the descriptor and, over RDMA, the pinned
  // rings. Our channels then reconnect on their next call, so a legitimate client only pays a
  // reconnect; keepalive PINGs do not count as activity. Checked twice per period, so the
  // GOAWAY goes after between 1 and 1.5 times this; a client that does not close then is closed
  // one period later. Zero = never.
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(5)};
  // Shutdown() first runs the shutdown hooks (HealthService turns NOT_SERVING), then keeps
  // serving, listeners included, for this long before it sends GOAWAY and drains: time for load
  // balancers and orchestrators that poll health to stop sending here. Zero = none (default).
  std::chrono::milliseconds shutdown_grace{0};
  // Run around every call, in order (see rpc/interceptor.h). Empty = none (no cost).
  ServerInterceptors interceptors;
};

namespace internal {
struct ServerCore;
}

class Server {
 public:
  explicit Server(ServerOptions options = {});
  // Shuts down (draining) if still running.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Registers every method of `service`. Fails with ALREADY_EXISTS if a method id is taken
  // (two methods whose names hash alike, or the same service twice), FAILED_PRECONDITION after
  // Start.
  Status AddService(Service& service);

  // Binds `uri` ("tcp://127.0.0.1:7471", "rdma://0.0.0.0:7471"; port 0 picks a free one) and
  // returns the bound URI. Fails with UNAVAILABLE and the transport's reason.
  Result<std::string> Listen(const std::string& uri);

  // Starts the I/O threads and returns. Idempotent.
  void Start();

  // Start()s, then blocks until Shutdown()/RequestShutdown() (or a signal, with
  // handle_signals), drains and returns.
  void Run();

  // Asks a Run() in progress to shut down; returns at once. Safe from handlers and signal context.
  void RequestShutdown();

  // Stops accepting, sends GOAWAY on every connection (clients stop sending new calls here and
  // reconnect elsewhere or later), answers calls that still arrive with UNAVAILABLE, waits up to
  // drain_timeout for in-flight calls, then closes every connection once its queued replies
  // have left (at most 2 s more for a client that does not read; callers of calls still running
  // get UNAVAILABLE) and joins the I/O threads. Blocking; do not call from a handler (use
  // RequestShutdown).
  void Shutdown();

  // Runs `hook` when Shutdown() begins (before shutdown_grace), on the thread calling it. Add
  // hooks before Start(); they must not call Shutdown().
  void AddShutdownHook(std::function<void()> hook);

  // The services added with AddService, in that order. Fixed once Start() has run (then safe
  // from any thread, e.g. from a handler).
  std::vector<const Service*> services() const;

  // The bound URIs of all listeners, in Listen order.
  std::vector<std::string> listening_uris() const;

  // Calls currently being handled, over all threads.
  int64_t in_flight_calls() const;
  // Client connections currently served (not counting ones turned away at the limit).
  int64_t connections() const;
  // Connections accepted whose set-up (handshake) has not ended, over all listeners. Per
  // listener, ServerOptions::transport.max_handshakes once the set-ups given up for newer ones
  // have gone (they count until then; twice the bound at most). Any thread, but not while
  // Listen runs (as listening_uris).
  int64_t connections_in_setup() const;
  // How many times a connection went over max_buffered_bytes_per_connection (or its share of
  // max_buffered_bytes), or waited for room for a large message still arriving (see
  // max_buffered_bytes), and was paused.
  int64_t throttle_events() const;
  // What the connections hold together (requests of running calls, replies not yet taken), as
  // counted against max_buffered_bytes: to within 32 KiB per connection.
  int64_t buffered_bytes() const;
  // What the connections hold for large messages beyond their usual buffers (arriving, or a
  // TCP buffer kept for the next one), as bounded by max_buffered_bytes (see there).
  int64_t receiving_bytes() const;
  // Connections closed because their large message stopped arriving while others waited for
  // room (see stalled_message_timeout).
  int64_t stalled_messages() const;

 private:
  std::shared_ptr<internal::ServerCore> core_;
};

}  // namespace rdmarpc

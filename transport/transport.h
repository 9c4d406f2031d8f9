// The transport interface: the only thing the RPC layer knows about moving bytes. Which
// transport serves a URI is decided in transport/factory.h (Listen, Connect).
//
// A transport carries opaque messages (whole byte strings) between two peers, in order, each
// delivered exactly once or the connection fails. Message boundaries are preserved. Transports
// know nothing of protobuf, services or calls.
//
// Threading: every Connection lives on one executor (one I/O thread's io_context). All of its
// methods must be called from that executor's thread, and every callback arrives there. There
// are no locks on this path by design (shared-nothing, one event loop per thread).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/busy_reason.h"
#include "transport/expected.h"

namespace rdmarpc::transport {

using Executor = boost::asio::any_io_executor;

// Tunables shared by all transports. Defaults are chosen for latency-critical services.
struct Options {
  // Largest message a connection accepts or sends. 64 MiB of payload plus room for headers.
  size_t max_message_bytes = (64u << 20) + 4096;
  // How long Connect may take before it fails.
  int connect_timeout_ms = 5000;
  // RDMA only: spin on the completion queue instead of sleeping on its channel fd. Lowest
  // latency, at the price of one core per I/O thread kept at 100% while it has connections.
  // While busy-polling (or spinning, below) the thread's timers and TCP connections on the same
  // loop wait for the end of a burst of polling, up to 20 us; work posted from another thread
  // ends the burst at once. Defaults to on when the environment has RDMARPC_BUSY_POLL=1, so that
  // deployments can switch it without recompiling.
  bool busy_poll = BusyPollFromEnvironment();
  // RDMA only, when not busy-polling: adaptive polling. After its completion queues drain, an
  // I/O thread keeps polling them for this long after the last completion before it sleeps on
  // the completion channel, so a reply that comes back within the window costs no wake-up. An
  // idle thread sleeps (no CPU); a thread with traffic spends up to this long per gap between
  // messages spinning. 0 = pure events (lowest CPU, a wake-up per message on each side).
  // RDMARPC_POLL_SPIN_US sets the default. The first RDMA connection or listener on an I/O
  // thread sets that thread's polling, busy_poll included; later ones share it.
  int poll_spin_us = PollSpinFromEnvironment();
  // Shared secret for connection set-up ("" = none). A server with a secret refuses, before any
  // message flows, a client that cannot prove it knows the same one; a client with a secret
  // refuses a server that cannot prove it. Proofs are HMAC-SHA256 challenge-responses (the
  // secret never travels, and no proof can be replayed). Not encryption: see
  // transport/handshake.h for what it does and does not protect. Use a long random secret.
  std::string auth_secret;
  // Listeners: connections in set-up at once (accepted, handshake not finished). Each one holds
  // a descriptor until its client completes the set-up, goes away, or the set-up times out
  // (TCP: the HELLO exchange, within connect_timeout_ms; RDMA: the CM exchange, up to 30 s,
  // with a queue pair and its receive ring pinned), so without a bound a client that opens
  // connections and never completes them would hold the server's descriptors (and pinned
  // memory) without end. At the bound a new connection makes the oldest set-up give up (a real
  // client completes within milliseconds, so a flood of half-open connections cannot keep it
  // out); a flood faster than that is turned away at twice the bound before anything is
  // allocated (RDMA: refused as busy, Channel::Connect fails with RESOURCE_EXHAUSTED; TCP:
  // closed at once, UNAVAILABLE; a channel that is reconnecting retries with its backoff).
  // Established connections are not affected. 0 = no bound.
  int max_handshakes = 128;
  // Listeners: asked for each new connection once its HELLO has passed, before anything more is
  // set up for it (over RDMA: before its queue pair and ring), with the client's address (a URI,
  // as Connection::peer() gives it). A reason turns it away as busy (the client hears
  // RESOURCE_EXHAUSTED naming that limit, and the server logs it); kUnstated lets it in. The RPC
  // server answers whether it is at max_connections or, for this client's address, at
  // max_connections_per_peer, so that a client over a limit costs a refusal, not a connection set
  // up only to be told GOAWAY and held for a moment (which a flood of connects could repeat without
  // end; the GOAWAY stays for those that pass here together and find the server full after). Any
  // thread; must be cheap. Empty: never full.
  std::function<BusyReason(std::string_view peer)> full;

  static constexpr int kDefaultPollSpinUs = 200;
  static int PollSpinFromEnvironment() {
    const char* v = std::getenv("RDMARPC_POLL_SPIN_US");
    if (v == nullptr || *v == '\0') return kDefaultPollSpinUs;
    char* end = nullptr;
    long us = std::strtol(v, &end, 10);
    if (*end != '\0' || us < 0 || us > 10'000'000) return kDefaultPollSpinUs;
    return static_cast<int>(us);
  }
  static bool BusyPollFromEnvironment() {
    const char* v = std::getenv("RDMARPC_BUSY_POLL");
    return v != nullptr && (std::string_view(v) == "1" || std::string_view(v) == "true");
  }
};

// Takes a message piece by piece, in order (MessageWriter::WritePieces).
class PieceSink {
 public:
  // Bytes the writer built (headers, small fields): copied before Copy returns.
  virtual void Copy(std::span<const std::byte> bytes) = 0;
  // Bytes the writer only points at (a large payload it holds): the sink may keep the span, which
  // must stay valid and unchanged until the Connection::Send that asked for pieces returns.
  virtual void Borrow(std::span<const std::byte> bytes) = 0;

 protected:
  ~PieceSink() = default;
};

// Writes one outgoing message straight into transport-owned memory (the TCP write buffer, or a
// registered RDMA send buffer), so that the RPC layer serializes without an extra copy.
class MessageWriter {
 public:
  virtual size_t size() const = 0;
  // Writes exactly size() bytes to dst.
  virtual void WriteTo(std::byte* dst) const = 0;
  // Optional: hands the same size() bytes to `sink` as pieces, large payloads borrowed where they
  // lie, so that a transport can give them to the kernel without copying them into its own
  // buffer first (TCP does for large messages: one payload copy fewer). False, having handed over
  // nothing, when the writer cannot (the default); the transport then calls WriteTo.
  virtual bool WritePieces(PieceSink& /*sink*/) const { return false; }

 protected:
  ~MessageWriter() = default;
};

// Every message handed to ConnectionHandler::OnMessage is followed in memory by at least this
// many readable bytes, of unspecified content (the next message, or padding that is part of the
// buffer's allocation). Protobuf's parser reads up to 16 bytes ahead of where it is parsing; with
// these bytes there it parses a message to its end in place instead of copying its tail first
// (rpc/internal/parse.h). Every transport guarantees it, for every delivery path.
inline constexpr size_t kMessageSlopBytes = 16;

// Receives what arrives on a connection. Implemented by the layer above.
class ConnectionHandler {
 public:
  virtual ~ConnectionHandler() = default;
  // One complete message. `message` points into the transport's receive buffer or ring and is
  // valid only until this returns: parse or copy it first. At least kMessageSlopBytes readable
  // bytes follow it (see there).
  virtual void OnMessage(std::span<const std::byte> message) = 0;
  // The connection is closed, by either side or by an error; `reason` says which. Called exactly
  // once, never from inside Send or Close, and no OnMessage follows.
  virtual void OnClose(const Error& reason) = 0;
  // Some queued bytes reached the peer (queued_send_bytes() went down). Called only while
  // receiving is paused (Connection::PauseReceiving), so that a handler that paused because its
  // peer was not taking replies learns when to resume, or while it watches its send queue
  // (Connection::WatchSendProgress). Never from inside Send.
  virtual void OnSendProgress() {}
  // Memory the connection holds for receiving large messages, past the buffers every
  // connection has, in bytes (a large message comes in pieces: TCP's read buffer grown for it,
  // reported as its whole capacity and kept after it for the next one; RDMA's buffers for its
  // rendezvous reads or chunks), and whether a message is still arriving (`unfinished`);
  // called when either changes, which only large messages make them do. Told before the
  // memory is taken where the transport can (TCP: before its read buffer grows; RDMA: before a
  // rendezvous read starts), and a pause from here (PauseReceiving) keeps it from being taken
  // until receiving resumes. With no message arriving, false asks the connection to give back
  // what it keeps (TCP shrinks its buffer and tells again). A peer decides how much of a
  // message to send, and when: a server counts this against its memory bound, so that many
  // peers cannot add unfinished messages, or buffers kept after finished ones, up past it.
  // Never from inside OnMessage or Send.
  virtual bool OnReceiveHeld(size_t /*bytes*/, bool /*unfinished*/) { return true; }
};

class Connection {
 public:
  virtual ~Connection() = default;

  virtual const Executor& executor() const = 0;

  // Starts delivering messages. The connection keeps `handler` alive until it has called
  // OnClose, then drops it (so handler -> connection references do not leak).
  virtual void Start(std::shared_ptr<ConnectionHandler> handler) = 0;

  // Queues one message for sending; never blocks. Messages queued in one event-loop turn are
  // gathered into as few writes as possible. Returns false, sending nothing, when the
  // connection is closed or the message is larger than max_message_bytes().
  virtual bool Send(const MessageWriter& message) = 0;

  // Closes the connection; queued messages may be lost. OnClose follows (posted).
  virtual void Close() = 0;

  // Stops receiving and closes once every message already queued has reached the peer (e.g. a
  // GOAWAY and the last replies after a protocol error). Gives up and closes anyway after
  // `limit_ms`. OnClose follows as for Close.
  virtual void CloseAfterSending(int limit_ms) = 0;

  // Memory held for messages accepted by Send that have not reached the peer yet (TCP: not yet
  // written to the socket, with the buffers' slack; RDMA: waiting for ring credit, with a
  // per-message overhead). What a peer that does not read makes us hold.
  virtual size_t queued_send_bytes() const = 0;

  // Receive-side flow control, so that a server stops taking work from a peer that does not take
  // its replies. While paused, no OnMessage is delivered and the peer is given no room to send
  // more: TCP stops reading the socket (the kernel's window closes, the peer's writes block);
  // RDMA stops returning ring credits (the peer may fill its ring once, then must wait; one that
  // writes past its credits is closed as a protocol violation). ResumeReceiving delivers what
  // arrived meanwhile, in order (posted, never from inside the call). Both are idempotent.
  virtual void PauseReceiving() = 0;
  virtual void ResumeReceiving() = 0;
  // While on, OnSendProgress reports the send queue going down whether or not receiving is
  // paused: for a sender that stopped queuing over a bound of its own and must not stop
  // receiving (a client needs the replies and WINDOWs of its other calls). Off by default.
  virtual void WatchSendProgress(bool on) = 0;

  // Whether the transport itself is fetching a message's bytes from the peer (RDMA: a
  // rendezvous read in flight), at the network's pace rather than the peer's: a peer cannot
  // stall such a message (ConnectionHandler::OnReceiveHeld hears of it when it has arrived).
  virtual bool fetching_message() const { return false; }

  virtual bool closed() const = 0;
  virtual size_t max_message_bytes() const = 0;
  // The peer's address, e.g. "tcp://127.0.0.1:51234", for logs and ServerContext.
  virtual std::string peer() const = 0;
};

// Accepts connections until closed.
class Listener {
 public:
  virtual ~Listener() = default;
  // Stops accepting. Thread-safe; idempotent.
  virtual void Close() = 0;
  // The bound address, with the real port when 0 was asked for.
  virtual std::string uri() const = 0;
  // Connections accepted whose set-up has not ended yet (Options::max_handshakes bounds them;
  // a set-up given up for a newer one counts until it has gone). Any thread.
  virtual int connections_in_setup() const = 0;
};

// Called with each accepted connection, on that connection's executor, before Start.
using AcceptHandler = std::function<void(std::shared_ptr<Connection>)>;

}  // namespace rdmarpc::transport

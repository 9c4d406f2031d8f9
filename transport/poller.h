// Internal to the transport layer: readiness events for descriptors that a transport reads and
// writes itself (raw non-blocking syscalls), delivered on the descriptor's event loop.
//
// Why not an Asio socket: every async_read_some costs an operation, a speculative recv that
// fails with EAGAIN when the peer has not answered yet, the reactor's per-descriptor lock twice,
// and a trip through the scheduler's locked queue -- about 1,400 instructions and one wasted
// syscall per message received, a third of a small call. Here each descriptor is registered
// once, edge-triggered, in an epoll set of our own per io_context; that set is itself one
// descriptor in the io_context's reactor, registered as an internal descriptor whose operation
// never completes, so a wake-up costs the reactor's epoll_wait, one epoll_wait of ours and then
// the reads themselves, and nothing is re-armed.
//
// The price: it uses Asio's detail API (epoll_reactor, reactor_op), checked against the Boost
// version this project builds with (Debian 12's 1.81), and handlers run inside the reactor's
// processing of our descriptor (with its lock held, which only this class ever takes).
//
// Threading: a Poller belongs to one io_context (an Asio service); Add, Remove and the events
// happen on that io_context's thread, which must be a single thread (as for every transport
// connection, transport.h).
#pragma once

#include <sys/epoll.h>

#include <boost/asio/execution_context.hpp>
#include <cstdint>
#include <memory>

#include "transport/transport.h"

namespace rdmarpc::transport {

class Poller final : public boost::asio::execution_context::service {
 public:
  // What a registered descriptor's owner implements.
  class Client {
   public:
    // `events`: EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP as epoll reported them. Edge-triggered:
    // read (or write) until EAGAIN, or until a short read/write says the kernel has no more.
    virtual void OnReady(uint32_t events) = 0;

   protected:
    ~Client() = default;
  };
  struct Registration;

  static boost::asio::execution_context::id id;

  explicit Poller(boost::asio::execution_context& context);
  ~Poller() override;
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  // The poller of `executor`'s io_context (made on first use).
  static Poller& For(const Executor& executor);

  // Registers `fd` for `events` (edge-triggered is added). The poller keeps `client` alive until
  // Remove, or until the io_context shuts down. Events already pending are reported at once
  // (from the event loop, never from inside Add). Null, with *error = errno, on failure.
  Registration* Add(int fd, uint32_t events, std::shared_ptr<Client> client, int* error);
  // Stops events for `r` at once and hands back the client reference the poller held: the
  // caller decides when it may be dropped (never inside the client's own method). `r` is
  // invalid afterwards. Does nothing after the io_context's shutdown.
  std::shared_ptr<Client> Remove(Registration* r);

 private:
  struct Op;
  void shutdown() override;
  void Drain();

  int epfd_ = -1;
  void* reactor_ = nullptr;          // boost::asio::detail::epoll_reactor
  void* reactor_data_ = nullptr;     // its per-descriptor state for epfd_
  std::unique_ptr<Op> op_;           // the never-completing operation that calls Drain
  Registration* live_ = nullptr;     // registered, not removed
  Registration* removed_ = nullptr;  // removed during a Drain: freed at its end
  bool draining_ = false;
  bool shut_down_ = false;
};

}  // namespace rdmarpc::transport

// Internal to the transport layer: readiness events for descriptors that a transport reads
// itself (raw non-blocking syscalls), delivered on the descriptor's event loop.
//
// Why not an Asio socket: every async_read_some costs an operation, a speculative recv, the
// reactor's per-descriptor lock twice and a trip through the scheduler's locked queue -- about
// 1,400 instructions per message received, a third of a small call. Here a descriptor is
// registered once in the io_context's own reactor, edge-triggered, as an "internal descriptor"
// whose read operation never completes: when it becomes readable the reactor calls us straight
// from its processing of the event, with nothing queued, allocated or re-armed. (An epoll set of
// our own nested in the reactor's did the same with one registration per thread, but cost an
// extra epoll_wait on the path from a message's arrival to its handler: 10% more latency.)
//
// The price: it uses Asio's detail API (epoll_reactor, reactor_op), checked against the Boost
// version this project builds with (Debian 12's 1.81), and clients run inside the reactor's
// processing of their own descriptor, with that descriptor's lock held; hence Remove's rules.
//
// The loop of our own (RunOwnLoop): for an io_context that rdmarpc runs itself (its server's I/O
// threads, EventLoopThread) the wake-ups through Asio's scheduler -- its mutex taken twice, the
// descriptor's state queued and dequeued, perform_io -- were ~350 instructions of each
// message's ~2,700 on the server. Such a loop blocks in an epoll set of its own instead, with
// the registered descriptors in it and the reactor's epoll set nested in it: a message's
// descriptor is handled straight from epoll_wait, and Asio (timers, its own sockets, handlers
// posted from any thread) is run with poll_one(), at most 64 handlers before the descriptors'
// next turn, only when the reactor's set says it has something or a handler was queued. That
// needs Asio's scheduler to interrupt its reactor for a post from another thread while the loop
// sleeps outside it, which Asio does only when its task_interrupted_ flag is clear: the loop
// clears it, under the scheduler's lock, before it sleeps (private members, reached as the
// descriptor's events are, below). The price: a wake-up for Asio's sake (a post from another
// thread, a timer) takes two epoll_waits, the loop's and the reactor's, where run() took one;
// handlers posted while the loop slept run before the second (a BlockingStub call, whose request
// and reply each cross threads: +0.7 us, ~1%; +1.5 us with the second first).
//
// Threading: a Poller belongs to one io_context (an Asio service); Add, Remove and the events
// happen on that io_context's thread, which must be a single thread (as for every transport
// connection, transport.h).
#pragma once

#include <boost/asio/execution_context.hpp>
#include <boost/asio/io_context.hpp>
#include <memory>

#include "transport/transport.h"

namespace rdmarpc::transport {

class Poller final : public boost::asio::execution_context::service {
 public:
  // What a registered descriptor's owner implements.
  class Client {
   public:
    // The descriptor became readable, or failed or hung up (which a read reports). Edge-
    // triggered: read until EAGAIN (or end of stream), or until a read's TCP_INQ says the
    // socket is empty (it counts a received FIN as something); nothing more is reported until
    // new data arrives after that. `failed`: this event includes an error or hang-up
    // (EPOLLERR, EPOLLHUP): read on until a read reports it, whatever TCP_INQ says -- it does
    // not count a reset, and a reset raises no other event. Writability is not watched: wait
    // for it some other way (it is rare).
    virtual void OnReady(bool failed) = 0;
    // The io_context is going away: the poller closes the descriptor and drops the client
    // right after this. Forget both (the number may be reused at once).
    virtual void OnPollerGone() {}

   protected:
    ~Client() = default;
  };
  struct Registration;

  static boost::asio::execution_context::id id;

  explicit Poller(boost::asio::execution_context& context);
  ~Poller() override;
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  // The poller of `executor`'s io_context (made on first use; `executor` is kept for the
  // poller's own posted work).
  static Poller& For(const Executor& executor);

  // Watches `fd` and takes it over: the poller closes it once it is removed (only then, so that
  // the number cannot be reused while the reactor still knows it). Keeps `client` alive until
  // Remove or the io_context's shutdown. Data already pending is reported from the event loop,
  // never from inside Add. Null, with *error = errno, on failure (fd is then closed too).
  Registration* Add(int fd, std::shared_ptr<Client> client, int* error);
  // Stops events for `r` at once and hands back the client reference the poller held: the
  // caller decides when to drop it (never inside the client's own OnReady). The descriptor is
  // closed now, or, when called from inside `r`'s own OnReady (whose reactor lock is held),
  // from a posted handler; in the loop of our own, when called while it handles a batch of
  // events, once the batch is done. `r` is invalid afterwards. After the io_context's
  // shutdown: nothing.
  std::shared_ptr<Client> Remove(Registration* r);

  // Runs `ioc` on the calling thread as io_context::run() would (until it is stopped or runs
  // out of work), with the loop of our own described above; descriptors added before move
  // over. From then on the io_context must be run only this way (its descriptors are no longer
  // in the reactor's set), by one thread at a time. Handlers may throw out of it, as out of
  // run(); std::system_error if the epoll set cannot be made.
  static void RunOwnLoop(boost::asio::io_context& ioc);

 private:
  struct Op;
  void shutdown() override;
  void Deregister(Registration* r);  // and close its fd, and free it

  void StartOwnLoop();
  bool WatchInOwnSet(Registration* r);  // false, with errno, if epoll_ctl failed
  void Run(boost::asio::io_context& ioc);

  void* reactor_ = nullptr;  // boost::asio::detail::epoll_reactor
  Executor executor_;
  Registration* live_ = nullptr;  // registered (removed ones included until deregistered)
  bool shut_down_ = false;
  // The loop of our own: its epoll set (-1: the reactor's mode), whether it is handling a
  // batch of events (Remove then keeps the registration until the batch is done: a later event
  // of the batch may point at it), and the registrations so kept.
  int own_epoll_ = -1;
  bool in_batch_ = false;
  Registration* removed_in_batch_ = nullptr;
};

}  // namespace rdmarpc::transport

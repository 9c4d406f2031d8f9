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
// Receives through io_uring (the loop of our own only): a stream socket added with
// `receives` is not watched for readiness at all; its client hands the poller a buffer
// (Receive), the kernel receives into it, and the client hears of the bytes (OnReceived). The
// loop then sleeps in io_uring_enter instead of epoll_wait, with the epoll set and the reactor's
// set each watched by a poll in the ring: a message's wake-up brings its bytes with it, and the
// next receive is submitted by the same system call that sleeps -- one system call per message
// where readiness took two (epoll_wait, then recv), as a blocking recv does. The ring is made by
// the first such Add while the loop runs (DEFER_TASKRUN: the kernel finishes receives only inside
// the loop thread's io_uring_enter, which is what makes a buffer's lifetime ours to decide); it
// belongs to that thread. Without io_uring (an old kernel, io_uring_disabled, or
// RDMARPC_IO_URING=0 in the environment) such sockets are watched for readiness as before.
// The price, in a loop that also has descriptors watched for readiness (an RDMA completion
// channel beside TCP connections): each of their wake-ups takes io_uring_enter and then an
// epoll_wait on the loop's set, one system call more than before. A loop without TCP
// connections never makes a ring.
//
// Threading: a Poller belongs to one io_context (an Asio service); Add, Remove and the events
// happen on that io_context's thread, which must be a single thread (as for every transport
// connection, transport.h).
#pragma once

#include <boost/asio/execution_context.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>

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
    // Receiving through io_uring (Completes): the Receive asked for finished. `result`: bytes
    // received (> 0), 0 at the end of the stream, or -errno. Its buffer is the client's again.
    virtual void OnReceived(int /*result*/) {}
    // Receiving through io_uring: the WatchHangUp asked for fired (the peer's FIN, a reset or an
    // error on the socket).
    virtual void OnHangUp() {}

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
  // `receives`: fd is a stream socket its client would rather receive from through io_uring
  // (above); Completes(r) says whether it does.
  Registration* Add(int fd, std::shared_ptr<Client> client, int* error, bool receives = false);
  // Whether r's client receives through io_uring (Receive, OnReceived, WatchHangUp) instead of
  // being told of readiness (OnReady).
  static bool Completes(const Registration* r);
  // Receiving through io_uring: receive into `into` (at most one Receive at a time per
  // registration). The kernel writes there until OnReceived, even after Remove, so the poller
  // keeps the client alive until then; the client must keep `into` as it is meanwhile.
  // `expect_wait`: the socket is probably empty now (skips a first attempt). False if it could
  // not be queued (the submission queue is full and this is not the loop's thread).
  bool Receive(Registration* r, std::span<std::byte> into, bool expect_wait);
  // Receiving through io_uring: OnHangUp once the peer hangs up or the socket fails, data or
  // not (at most one watch at a time). For a client that stopped receiving. False as Receive.
  bool WatchHangUp(Registration* r);

  // Stops events for `r` at once (a receive through io_uring still in flight ends without a
  // call: the socket is shut down, and r's client is kept until the kernel lets go of its
  // buffer) and hands back the client reference the poller held: the
  // caller decides when to drop it (never inside the client's own OnReady). The descriptor is
  // closed now, or, when called from inside `r`'s own OnReady (whose reactor lock is held),
  // from a posted handler; in the loop of our own, when called while it handles a batch of
  // events, once the batch is done. `r` is invalid afterwards. After the io_context's
  // shutdown: nothing.
  std::shared_ptr<Client> Remove(Registration* r);

  // Asio's count of the io_context's outstanding work. While one handler of the loop's thread
  // runs (RDMA busy-polling spins in one for up to a burst), it changes only when another thread
  // posts work or drops a work guard: such a handler reads it to let that work run at once rather
  // than after its burst. Any thread; one atomic load.
  long WorkCount() const;

  // Runs `ioc` on the calling thread as io_context::run() would (until it is stopped or runs
  // out of work), with the loop of our own described above; descriptors added before move
  // over. From then on the io_context must be run only this way (its descriptors are no longer
  // in the reactor's set), by one thread at a time. Handlers may throw out of it, as out of
  // run(); std::system_error if the epoll set cannot be made.
  static void RunOwnLoop(boost::asio::io_context& ioc);

 private:
  struct Op;
  struct Ring;
  void shutdown() override;
  void Deregister(Registration* r);  // and close its fd, and free it
  void Dispose(Registration* r);     // close and free, now or at the batch's end
  bool UseRing();                    // makes the ring if it can (on the loop's thread)
  void ArmSetPolls();
  int Enter(bool sleep);  // one io_uring_enter: -errno or what it returned
  void Completed(uint64_t user_data, int result, bool* run_asio);
  void CompletedOther(uint64_t user_data, int result, bool* run_asio);
  void Reap(unsigned most, bool* run_asio);  // the ring's completions (at most `most`)
  void Bury();                               // closes and frees what was removed during a batch
  void DeliverEvents(const struct epoll_event* events, int n, bool* run_asio);

  void StartOwnLoop();
  bool WatchInOwnSet(Registration* r);  // false, with errno, if epoll_ctl failed
  void Run(boost::asio::io_context& ioc);

  void* reactor_ = nullptr;    // boost::asio::detail::epoll_reactor
  void* scheduler_ = nullptr;  // boost::asio::detail::scheduler (the io_context's)
  Executor executor_;
  Registration* live_ = nullptr;  // registered (removed ones included until deregistered)
  bool shut_down_ = false;
  // The loop of our own: its epoll set (-1: the reactor's mode), whether it is handling a
  // batch of events (Remove then keeps the registration until the batch is done: a later event
  // of the batch may point at it), and the registrations so kept.
  int own_epoll_ = -1;
  bool in_batch_ = false;
  Registration* removed_in_batch_ = nullptr;
  // Receiving through io_uring (null until the first Add that asks for it; ring_off_: it cannot
  // or must not be made), the thread running the loop now, and registrations removed while the
  // kernel still held an operation of theirs (freed as those complete, or at shutdown).
  std::unique_ptr<Ring> ring_;
  bool ring_off_ = false;
  std::thread::id run_thread_;
  Registration* draining_ = nullptr;
};

}  // namespace rdmarpc::transport

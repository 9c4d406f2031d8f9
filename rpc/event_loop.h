// EventLoopThread: one io_context run by one dedicated thread, with RunLoop (below). Used by
// blocking clients (Channel::ConnectBlocking), tests, and the server, whose I/O threads are each
// one of these (IoThread in server.cc adds its handler pool and connection set).
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <thread>

namespace rdmarpc {

// The concurrency hint rdmarpc's own io_contexts are built with (EventLoopThread: the server's
// I/O threads, blocking channels' loops): one thread runs the loop, and each socket, descriptor
// and timer of it is created, registered and used by that thread only, so the reactor takes no
// lock per I/O readiness (~55 instructions per message on each side). Posting to the loop from
// any thread stays safe. Not safe: registering a descriptor with the loop from another thread
// (Asio reuses the reactor's per-descriptor state, and that thread's writes would race with the
// loop's reads of a reused state) -- the TCP listener hands accepted sockets over as bare
// descriptors for that reason. An io_context of your own that runs channels may use this hint
// if its other I/O objects follow the same rule; if unsure, construct it with 1.
inline constexpr int kLoopConcurrencyHint = BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO;

// Runs `ioc` on the calling thread as ioc.run() does -- until it is stopped or runs out of work
// -- with rdmarpc's own event loop, which hands a connection's data to rdmarpc without going
// through Asio's scheduler (~300 instructions less per wake-up, about a tenth of a small call's
// cost). Everything else behaves as under run(): timers, Asio sockets, handlers posted from any
// thread. Use it for an io_context whose thread serves channels (the server's I/O threads and
// EventLoopThread use it). Rules: one thread at a time; once run this way, an io_context must
// be run only this way (connections made on it are watched by the loop, no longer by Asio's
// reactor). Throws std::system_error if the loop cannot be set up; a handler's exception leaves
// it as it leaves run(). What costs more than under run(): a wake-up for Asio's own sake (a
// handler posted from another thread, a timer) takes two epoll_waits instead of one, the second
// after the posted handlers (a BlockingStub call, whose request and reply each cross threads,
// measured +0.7 us, ~1%).
//
// TCP connections on such a loop receive through io_uring where the kernel allows it (Linux 6.1
// or later, io_uring not disabled): the loop sleeps in io_uring_enter, a message's wake-up brings
// its bytes, and the next receive is submitted by the call that sleeps -- one system call per
// message received instead of two (epoll_wait, recv): a 64 B call's round trip ~6% shorter on
// this project's machines. The ring belongs to the thread that made it: once a TCP connection
// has been opened on the loop, run it on that same thread only (another thread gets
// std::logic_error). RDMARPC_IO_URING=0 in the environment turns it off (readiness, as before);
// under valgrind it is off unless RDMARPC_IO_URING=1.
void RunLoop(boost::asio::io_context& ioc);

class EventLoopThread {
 public:
  // Starts the thread at once, or, with start = false, at Start().
  explicit EventLoopThread(bool start = true);
  // Starts the thread if it has not started. Not thread-safe against itself or StopAndJoin.
  void Start();
  // Stops the loop now, leaving what is queued on it queued (run it afterwards with
  // context().restart() and poll(), on the caller's thread), and joins. For an owner that has
  // already let its work finish, as the server does once its connections are closed. Does
  // nothing if the thread never started or was stopped already. Not from the loop thread.
  void StopAndJoin();
  // Lets the loop finish by itself (its queued work run, other threads' work on it released),
  // waiting at most 200 ms; then stops it, abandoning what is still attached (open sockets,
  // timers), and joins. Safe to run on the loop thread itself: then the loop is stopped, the
  // thread detached and the context deliberately leaked instead of self-joined. Nothing to do
  // after StopAndJoin.
  ~EventLoopThread();
  EventLoopThread(const EventLoopThread&) = delete;
  EventLoopThread& operator=(const EventLoopThread&) = delete;

  // How many EventLoopThreads of this process have had to stop their loop at the destructor's
  // limit, abandoning work still attached to it. Any thread. For tests and diagnostics: a loop
  // whose owner closed everything on it ends by itself, so a count that grows after such a
  // close means something (an armed timer, a watch, a queued close) kept it busy -- 200 ms
  // lost in the destructor, and whatever that work would have freed leaked.
  static uint64_t StoppedAtLimit();

  boost::asio::io_context& context() { return *ioc_; }
  boost::asio::io_context::executor_type executor() { return ioc_->get_executor(); }
  bool in_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  std::unique_ptr<boost::asio::io_context> ioc_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::future<void> finished_;  // ready once run() returned
  std::thread thread_;
};

}  // namespace rdmarpc

// EventLoopThread: one io_context run by one dedicated thread, started at once. Used by blocking
// clients (Channel::ConnectBlocking) and tests; the server runs its own I/O threads (IoThread in
// server.cc: started by Server::Start, with a handler pool and a connection set).
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <future>
#include <memory>
#include <optional>
#include <thread>

namespace rdmarpc {

class EventLoopThread {
 public:
  // Starts the thread at once.
  EventLoopThread();
  // Lets the loop finish by itself (its queued work run, other threads' work on it released),
  // waiting at most 200 ms; then stops it, abandoning what is still attached (open sockets,
  // timers), and joins. Safe to run on the loop thread itself: then the loop is stopped, the
  // thread detached and the context deliberately leaked instead of self-joined.
  ~EventLoopThread();
  EventLoopThread(const EventLoopThread&) = delete;
  EventLoopThread& operator=(const EventLoopThread&) = delete;

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

#include "rpc/event_loop.h"

namespace rdmarpc {

EventLoopThread::EventLoopThread()
    : ioc_(std::make_unique<boost::asio::io_context>(1)), work_(ioc_->get_executor()) {
  thread_ = std::thread([ctx = ioc_.get()] { ctx->run(); });
}

EventLoopThread::~EventLoopThread() {
  work_.reset();
  ioc_->stop();
  if (in_loop_thread()) {
    thread_.detach();
    (void)ioc_.release();  // the detached thread is still inside run(): never free under it
    return;
  }
  thread_.join();
}

}  // namespace rdmarpc

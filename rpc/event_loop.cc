#include "rpc/event_loop.h"

#include <atomic>
#include <chrono>
#include <future>

#include "transport/factory.h"

namespace rdmarpc {

namespace {
// How long the destructor lets the loop finish by itself before stopping it.
constexpr auto kDrainLimit = std::chrono::milliseconds(200);
std::atomic<uint64_t> g_stopped_at_limit{0};
}  // namespace

uint64_t EventLoopThread::StoppedAtLimit() {
  return g_stopped_at_limit.load(std::memory_order_relaxed);
}

void RunLoop(boost::asio::io_context& ioc) { transport::RunEventLoop(ioc); }

EventLoopThread::EventLoopThread(bool start)
    : ioc_(std::make_unique<boost::asio::io_context>(kLoopConcurrencyHint)),
      work_(ioc_->get_executor()) {
  if (start) Start();
}

void EventLoopThread::Start() {
  if (finished_.valid()) return;  // started before (and maybe stopped)
  std::promise<void> ran;
  finished_ = ran.get_future();
  thread_ = std::thread([ctx = ioc_.get(), ran = std::move(ran)]() mutable {
    RunLoop(*ctx);
    ran.set_value();
  });
}

void EventLoopThread::StopAndJoin() {
  work_.reset();
  if (!thread_.joinable()) return;
  ioc_->stop();
  thread_.join();
}

EventLoopThread::~EventLoopThread() {
  work_.reset();
  if (!thread_.joinable()) return;  // never started, or StopAndJoin ran
  if (in_loop_thread()) {
    ioc_->stop();
    thread_.detach();
    (void)ioc_.release();  // the detached thread is still inside run(): never free under it
    return;
  }
  // First let run() return by itself: it does once the queued work has run (e.g. the close a
  // destroyed Channel posted, which breaks its connection <-> handler cycle) and no other thread
  // holds work on this context (a channel of another loop completing a call made from here: it
  // touches this context just after the caller resumed, and stopping and freeing the context
  // under it crashed stream_test, 2026-12-02). Only what stays attached (open sockets, timers)
  // makes it wait the limit; then the loop is stopped and that work abandoned.
  if (finished_.wait_for(kDrainLimit) != std::future_status::ready) {
    g_stopped_at_limit.fetch_add(1, std::memory_order_relaxed);
    ioc_->stop();
  }
  thread_.join();
}

}  // namespace rdmarpc

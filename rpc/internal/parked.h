// A coroutine the runtime has suspended and will resume itself (a server handler runner waiting
// for its next call, a client caller waiting for its reply).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/post.hpp>
#include <boost/version.hpp>
#include <cstddef>
#include <optional>
#include <utility>

// Park reaches into Asio's coroutine machinery (awaitable_thread, awaitable_frame_base, and the
// frame's await_transform for a function of the frame, which use_awaitable's own initiation is
// built on): read it again before moving to another Boost.
static_assert(BOOST_VERSION == 108100, "rpc/internal/parked.h was written against Boost 1.81");

namespace rdmarpc::internal {

// A suspended coroutine: the whole awaitable thread it runs on (its frames, executor and
// cancellation state), taken from it as it suspended. Call it to resume the coroutine, here and
// now, until it next suspends or ends; destroying it unwinds the coroutine through its executor
// (as Asio does with a completion handler it never calls).
class Resumer {
 public:
  using Thread = boost::asio::detail::awaitable_thread<boost::asio::any_io_executor>;
  explicit Resumer(Thread* thread) : thread_(std::move(*thread)) {}
  Resumer(Resumer&&) = default;
  Resumer& operator=(Resumer&&) = delete;

  // As a use_awaitable handler does, the cancellation handler installed while suspended goes
  // before the coroutine runs on.
  void operator()() && {
    thread_.get_cancellation_slot().clear();
    thread_.launch();
  }
  // The coroutine's cancellation slot: a handler assigned to it runs when the coroutine's
  // caller cancels it while suspended.
  boost::asio::cancellation_slot get_cancellation_slot() const noexcept {
    return thread_.get_cancellation_slot();
  }
  // Whether the coroutine was cancelled before it suspended and wants such a cancellation to
  // stop what it awaits next (Asio's default, throw_if_cancelled: co_await on an awaitable
  // would have thrown operation_aborted instead of suspending).
  bool cancelled_before() const {
    return thread_.throw_if_cancelled() &&
           thread_.get_cancellation_state().cancelled() != boost::asio::cancellation_type::none;
  }

 private:
  Thread thread_;
};

// `co_await Park(store)` suspends the calling coroutine (an asio::awaitable on an
// any_io_executor) and passes its Resumer to `store(Resumer&&)`, which keeps it somewhere; the
// co_await completes when that Resumer is called. `store` runs once the coroutine has suspended,
// so it may hand the Resumer to anyone; to resume it at once, post that (as Asio's handlers,
// it is not meant to be resumed from inside the initiation).
//
// Why not async_initiate with use_awaitable: that builds a second coroutine frame for the
// initiation (allocated, resumed, destroyed), then completes through a handler that pops it,
// on every suspension: ~200 instructions per call on each side, client and server.
// Unlike co_await on an awaitable, this does not throw when the coroutine's cancellation state
// is already cancelled: the store function can tell (Resumer::cancelled_before) and act on it.
template <class Store>
struct Parker {
  using Frame = boost::asio::detail::awaitable_frame_base<boost::asio::any_io_executor>;
  Store store;
  Resumer::Thread* operator()(Frame* frame) {
    store(Resumer(frame->detach_thread()));
    return nullptr;
  }
};
template <class Store>
Parker<Store> Park(Store store) {
  return Parker<Store>{std::move(store)};
}

// `co_await YieldTo(ex)` lets `ex`'s thread run what is queued on it (an I/O thread also looks
// for other connections' data on the way) before the calling coroutine goes on. Parked, so no
// frame is allocated and, unlike a co_await on an awaitable, it does not throw when the
// coroutine was cancelled meanwhile: the caller checks for that itself after it.
inline auto YieldTo(boost::asio::any_io_executor ex) {
  return Park([ex = std::move(ex)](Resumer&& resume) {
    boost::asio::post(ex, [r = std::move(resume)]() mutable { std::move(r)(); });
  });
}

// How much a stream writer that never has to wait (credit and room to spare) writes between two
// YieldTo: large enough that the turn costs nothing measurable (one post per 64 KiB), small
// enough that the other work of its thread waits tens of microseconds, not milliseconds.
inline constexpr size_t kYieldEveryBytes = 64 << 10;

// The handler Asio hands an async operation of signature void(T) that an asio::awaitable
// co_awaits (`co_await op(asio::deferred)`: awaitable_frame_base::await_transform): the awaiting
// coroutine, suspended, with where its result goes. Calling it with the result resumes the
// coroutine, here and now, and the co_await yields that result; no coroutine frame is built for
// the operation itself. Destroying it uncalled unwinds the coroutine, as a Resumer does.
template <class T>
using AwaitingHandler =
    boost::asio::detail::awaitable_async_op_handler<void(T), boost::asio::any_io_executor>;

// Takes the Resumer out of `parked` (which holds one), leaving it empty. Take it out before
// resuming or destroying it: either may free whatever holds `parked`.
inline Resumer TakeParked(std::optional<Resumer>& parked) {
  Resumer h = std::move(*parked);
  parked.reset();
  return h;
}

}  // namespace rdmarpc::internal

// A coroutine the runtime has suspended and will resume itself (a server handler runner waiting
// for its next call, a client caller waiting for its reply), held by its own completion handler.
#pragma once

#include <boost/asio/use_awaitable.hpp>
#include <optional>
#include <utility>

namespace rdmarpc::internal {

// The completion handler of an `async_initiate<use_awaitable_t<>, void()>`, kept as its concrete
// type: an any_completion_handler would allocate, and install a cancellation forwarder in the
// coroutine's slot, on every suspension. Call it to resume the coroutine; destroying it
// unwinds the coroutine through its executor.
using Resumer = boost::asio::async_result<boost::asio::use_awaitable_t<>, void()>::handler_type;

// Takes the handler out of `parked` (which holds one), leaving it empty. Take it out before
// resuming or destroying it: either may free whatever holds `parked`.
inline Resumer TakeParked(std::optional<Resumer>& parked) {
  Resumer h = std::move(*parked);
  parked.reset();
  return h;
}

}  // namespace rdmarpc::internal

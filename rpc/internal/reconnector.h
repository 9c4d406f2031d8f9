// Internal: how a channel gets a new connection after losing one. Attempts run on the channel's
// executor, one at a time: after a delay (at once when the connection worked a moment ago, else
// the backoff: reconnect_backoff_initial, growing 1.6x per failure with +-20% jitter so that the
// clients of one restarted server do not come back in lockstep, up to reconnect_backoff_max),
// until one succeeds or the listener no longer wants a connection. Use only on that executor.
#pragma once

#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <random>
#include <string>

#include "transport/factory.h"
#include "transport/transport.h"

namespace rdmarpc::internal {

// Whoever the reconnector works for (the channel); it owns the Reconnector.
class ReconnectListener {
 public:
  // Whether a connection is still wanted; asked when a delay ends (no attempt starts if not) and
  // when an attempt ends (a connection no longer wanted is closed, a failure not retried).
  virtual bool WantsConnection() const = 0;
  // An attempt connected (the transport's handshake done, the RPC one not started).
  virtual void OnReconnected(std::shared_ptr<transport::Connection> conn) = 0;
  // An attempt failed; the next one follows after the backoff.
  virtual void OnReconnectFailed(const transport::Error& error) = 0;

 protected:
  ~ReconnectListener() = default;
};

class Reconnector {
 public:
  Reconnector(const transport::Executor& ex, std::string target, transport::Options options,
              std::chrono::milliseconds backoff_initial, std::chrono::milliseconds backoff_max)
      : executor_(ex),
        target_(std::move(target)),
        options_(std::move(options)),
        initial_(backoff_initial),
        max_(backoff_max),
        backoff_(backoff_initial),
        rng_(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(this))) {}
  Reconnector(const Reconnector&) = delete;
  Reconnector& operator=(const Reconnector&) = delete;

  // Tries to connect after `delay`, instead of an attempt already scheduled; not while one is in
  // progress (its end asks the listener again, and retries after a failure). `listener` owns this
  // Reconnector: nothing happens once it is gone.
  void Schedule(std::weak_ptr<ReconnectListener> listener, std::chrono::milliseconds delay) {
    timer_.expires_after(delay);
    timer_.async_wait([this, listener](boost::system::error_code ec) {
      auto owner = listener.lock();
      if (ec || !owner || !owner->WantsConnection()) return;
      if (attempting_) return;  // one in progress: its end decides what follows
      attempting_ = true;
      // Cancel() stops an attempt in progress, so that a closed channel does not keep its event
      // loop busy until the connect timeout (a frozen server took 5 s to give up on). The
      // completion handler owns the signal: it must outlive the coroutine's completion.
      auto cancel = std::make_shared<boost::asio::cancellation_signal>();
      cancel_ = cancel;
      boost::asio::co_spawn(executor_, Attempt(this, listener, target_, executor_, options_),
                            boost::asio::bind_cancellation_slot(
                                cancel->slot(), [cancel](const std::exception_ptr&) {}));
    });
  }

  // The delay before the next attempt after a failure, then grows the backoff.
  std::chrono::milliseconds NextBackoff() {
    std::uniform_real_distribution<double> jitter(0.8, 1.2);
    const auto delay = std::chrono::milliseconds(
        static_cast<int64_t>(static_cast<double>(backoff_.count()) * jitter(rng_)));
    backoff_ = std::min(max_, std::chrono::milliseconds(static_cast<int64_t>(
                                  static_cast<double>(backoff_.count()) * 1.6)));
    return delay;
  }

  // A connection worked: the next failure waits the initial backoff again.
  void ResetBackoff() { backoff_ = initial_; }

  // Nothing more: the scheduled attempt does not start, one in progress is cancelled.
  void Cancel() {
    timer_.cancel();
    attempting_ = false;
    if (auto cancel = cancel_.lock()) cancel->emit(boost::asio::cancellation_type::terminal);
  }

 private:
  // One attempt. Holds copies of what it needs: the Reconnector is reached again (through
  // `self`) only while its listener, which owns it, is alive.
  static boost::asio::awaitable<void> Attempt(Reconnector* self,
                                              std::weak_ptr<ReconnectListener> listener,
                                              std::string target, transport::Executor ex,
                                              transport::Options options) {
    auto conn = co_await transport::Connect(target, ex, options);
    auto owner = listener.lock();
    if (owner) self->attempting_ = false;
    if (!owner || !owner->WantsConnection()) {
      if (conn.ok()) conn.value()->Close();
      co_return;
    }
    if (!conn.ok()) {
      owner->OnReconnectFailed(conn.error());
      if (owner->WantsConnection()) self->Schedule(listener, self->NextBackoff());
      co_return;
    }
    owner->OnReconnected(std::move(conn.value()));
  }

  transport::Executor executor_;
  std::string target_;
  transport::Options options_;
  std::chrono::milliseconds initial_, max_, backoff_;
  std::minstd_rand rng_;
  boost::asio::steady_timer timer_{executor_};
  std::weak_ptr<boost::asio::cancellation_signal> cancel_;  // of the attempt in progress
  bool attempting_ = false;  // between the timer's expiry and the attempt's outcome
};

}  // namespace rdmarpc::internal

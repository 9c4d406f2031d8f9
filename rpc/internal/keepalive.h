// Internal: the keepalive watch both ends of a connection use (Channel and server connection).
// When nothing has arrived from the peer for `interval`, send a PING; when still nothing at all
// has arrived `timeout` after it, the peer is taken for dead (process stopped, machine gone, link
// cut without a close). One timer per connection; use only on the connection's thread.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "transport/transport.h"

namespace rdmarpc::internal {

class Keepalive {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Keepalive(const transport::Executor& ex) : timer_(ex) {}

  // Starts watching; does nothing when `interval` is zero. `owner` is the object that holds this
  // Keepalive: the timer does nothing once it is gone. `send_ping` sends one PING; `on_dead` is
  // called once, with the reason, when the timeout passes.
  void Start(std::weak_ptr<void> owner, std::chrono::milliseconds interval,
             std::chrono::milliseconds timeout, std::function<void()> send_ping,
             std::function<void(std::string)> on_dead) {
    if (interval.count() <= 0) return;
    owner_ = std::move(owner);
    interval_ = interval;
    timeout_ = timeout;
    send_ping_ = std::move(send_ping);
    on_dead_ = std::move(on_dead);
    last_heard_ = Clock::now();
    ping_sent_.reset();
    Schedule(interval);
  }

  // Anything arrived from the peer.
  void Heard() {
    if (send_ping_) last_heard_ = Clock::now();
  }

  void Stop() {
    send_ping_ = nullptr;
    on_dead_ = nullptr;
    timer_.cancel();
  }

 private:
  void Schedule(Clock::duration after) {
    timer_.expires_after(after);
    timer_.async_wait([this, owner = owner_](boost::system::error_code ec) {
      auto alive = owner.lock();
      if (ec || !alive || !send_ping_) return;
      Tick();
    });
  }

  void Tick() {
    using Duration = Clock::duration;
    const auto now = Clock::now();
    // While a PING is unanswered, look often enough to notice the timeout soon after it passes.
    const Duration watch = std::min<Duration>(interval_, timeout_) / 4;
    if (ping_sent_ && last_heard_ >= *ping_sent_) ping_sent_.reset();  // something arrived
    if (ping_sent_) {
      if (now - *ping_sent_ < timeout_) {
        Schedule(watch);
        return;
      }
      auto on_dead = std::move(on_dead_);
      Stop();
      on_dead("no reply to a keepalive ping within " + std::to_string(timeout_.count()) + " ms");
      return;
    }
    const Duration quiet = now - last_heard_;
    if (quiet < interval_) {
      // Sleep until the connection could first have been quiet for a whole interval.
      Schedule(interval_ - quiet + std::chrono::milliseconds(1));
      return;
    }
    send_ping_();
    ping_sent_ = now;
    Schedule(watch);
  }

  boost::asio::steady_timer timer_;
  std::weak_ptr<void> owner_;
  std::chrono::milliseconds interval_{0}, timeout_{0};
  std::function<void()> send_ping_;
  std::function<void(std::string)> on_dead_;
  Clock::time_point last_heard_ = Clock::now();
  std::optional<Clock::time_point> ping_sent_;
};

}  // namespace rdmarpc::internal

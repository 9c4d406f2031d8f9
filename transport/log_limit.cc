#include "transport/log_limit.h"

namespace rdmarpc::transport {

bool LogLimit::Allow(std::chrono::steady_clock::time_point now, uint64_t* left_out) {
  std::lock_guard lock(mu_);
  if (in_window_ == 0 || now - window_start_ >= kLogInterval) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ == kLogBurst) {
    ++left_out_;
    return false;
  }
  ++in_window_;
  *left_out = std::exchange(left_out_, 0);
  return true;
}

}  // namespace rdmarpc::transport

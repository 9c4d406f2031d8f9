// Warnings that a peer can cause -- a refused handshake, a malformed frame, a connection over a
// limit -- are limited per place in the code that logs them: one client opening connections and
// sending garbage made a server write 2,000 lines in 0.09 s (one per connection), which over hours
// fills a disk, and a slow log sink (stderr to a pipe) blocks the I/O thread that writes each.
//
//   static transport::LogLimit limit;  // one per logging site
//   transport::WarnLimited(limit, "tcp: refusing connection from {}: {}", peer, why);
//
// Each site logs at most kLogBurst lines per kLogInterval; the first line it logs after leaving
// some out says how many. Debug-level logging is not limited (an operator who turns it on asks
// for every line). Threading: any thread; Allow takes a mutex, so use it on error paths only.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace rdmarpc::transport {

inline constexpr uint32_t kLogBurst = 10;
inline constexpr std::chrono::seconds kLogInterval{5};

class LogLimit {
 public:
  // Whether an occurrence at `now` is logged. If so, *left_out is how many this site did not log
  // since the last line it did.
  bool Allow(std::chrono::steady_clock::time_point now, uint64_t* left_out);
  bool Allow(uint64_t* left_out) { return Allow(std::chrono::steady_clock::now(), left_out); }

 private:
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_start_{};
  uint32_t in_window_ = 0;
  uint64_t left_out_ = 0;
};

// spdlog::warn(fmt, args...) within `limit`; a line after some were left out ends by saying so.
template <class... Args>
void WarnLimited(LogLimit& limit, spdlog::format_string_t<Args...> fmt, Args&&... args) {
  if (!spdlog::should_log(spdlog::level::warn)) return;
  uint64_t left_out = 0;
  if (!limit.Allow(&left_out)) return;
  if (left_out == 0) {
    spdlog::warn(fmt, std::forward<Args>(args)...);
    return;
  }
  spdlog::warn("{} ({} more like this not logged: at most {} per {} s)",
               fmt::format(fmt, std::forward<Args>(args)...), left_out, kLogBurst,
               kLogInterval.count());
}

}  // namespace rdmarpc::transport

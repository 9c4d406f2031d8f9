// The clock of an RDMA I/O thread's own time accounting (the kRdma*Nanos stats: time asleep on
// the completion channel, spinning, busy-polling) and of its spin window. It is read on every
// wake-up and every spin step, so it has to be cheap: steady_clock's read (libstdc++, glibc and
// the vDSO) cost ~20 instructions, two per wake-up (callgrind in the VM).
//
// Where the kernel itself keeps time with the CPU's time-stamp counter (its clocksource is
// "tsc": the counter runs at a constant rate and agrees across CPUs) a tick is that counter, one
// instruction to read; ticks become nanoseconds at the rate measured against steady_clock since
// the clock was made, re-measured by Calibrate, so the longer it runs the finer the rate.
// Elsewhere (another clocksource, another architecture) a tick is a steady_clock nanosecond.
//
// Threading: Now() from any thread; Calibrate and the conversions from the owner's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace rdmarpc::transport::rdma {

class TickClock {
 public:
  TickClock() : TickClock(KernelUsesTsc()) {}
  // `cpu_ticks`: count the time-stamp counter whatever the kernel's clocksource (tests); ignored
  // where there is none.
  explicit TickClock(bool cpu_ticks) : use_tsc_(cpu_ticks && HasTsc()) {
    anchor_ns_ = SteadyNanos();
    anchor_ticks_ = Now();
    if (use_tsc_) {
      // A first rate for the spin window, over ~20 us; Calibrate refines it.
      uint64_t ns;
      do {
        ns = SteadyNanos();
      } while (ns - anchor_ns_ < 20'000);
      Measure(ns, Now());
    }
  }

  uint64_t Now() const noexcept {
#if defined(__x86_64__)
    if (use_tsc_) return __rdtsc();
#endif
    return SteadyNanos();
  }

  // Re-measures ticks per nanosecond over the clock's whole life so far (one steady_clock read).
  void Calibrate() {
    if (use_tsc_) Measure(SteadyNanos(), Now());
  }

  uint64_t ToNanos(uint64_t ticks) const {
    return static_cast<uint64_t>(static_cast<double>(ticks) * ns_per_tick_);
  }
  uint64_t FromNanos(uint64_t ns) const {
    return static_cast<uint64_t>(static_cast<double>(ns) / ns_per_tick_);
  }
  bool counts_cpu_ticks() const { return use_tsc_; }
  // Whether this architecture has a time-stamp counter this clock can read.
  static constexpr bool HasTsc() {
#if defined(__x86_64__)
    return true;
#else
    return false;
#endif
  }

 private:
  static uint64_t SteadyNanos() noexcept {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  // Whether the kernel keeps time with the time-stamp counter (read once per process).
  static bool KernelUsesTsc() {
#if defined(__x86_64__)
    static const bool tsc = [] {
      std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
      std::string name;
      return static_cast<bool>(f >> name) && name == "tsc";
    }();
    return tsc;
#else
    return false;
#endif
  }
  void Measure(uint64_t ns, uint64_t ticks) {
    if (ticks > anchor_ticks_ && ns > anchor_ns_) {
      ns_per_tick_ =
          static_cast<double>(ns - anchor_ns_) / static_cast<double>(ticks - anchor_ticks_);
    }
  }

  bool use_tsc_;
  uint64_t anchor_ns_ = 0, anchor_ticks_ = 0;
  double ns_per_tick_ = 1.0;
};

}  // namespace rdmarpc::transport::rdma

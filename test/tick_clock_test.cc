// The RDMA device's time accounting clock (transport/rdma/tick_clock.h): its ticks, converted,
// agree with steady_clock, on the time-stamp counter and on the steady_clock fallback alike.
#include "transport/rdma/tick_clock.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <thread>

using rdmarpc::transport::rdma::TickClock;

namespace {
uint64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Measures a ~200 ms sleep with `clock` and with steady_clock; returns their ratio.
double Agreement(TickClock& clock) {
  const uint64_t t0 = clock.Now(), s0 = SteadyNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const uint64_t t1 = clock.Now(), s1 = SteadyNs();
  clock.Calibrate();
  const double ratio = double(clock.ToNanos(t1 - t0)) / double(s1 - s0);
  std::printf("%s: %.0f ns by the clock, %.0f ns by steady_clock (ratio %.4f)\n",
              clock.counts_cpu_ticks() ? "time-stamp counter" : "steady_clock fallback",
              double(clock.ToNanos(t1 - t0)), double(s1 - s0), ratio);
  return ratio;
}
}  // namespace

TEST_CASE("the clock's intervals, converted, agree with steady_clock", "[rdma][clock]") {
  for (bool cpu_ticks : {true, false}) {
    TickClock clock(cpu_ticks);
    CHECK(clock.counts_cpu_ticks() == (cpu_ticks && TickClock::HasTsc()));
    // Within 5%: the two pairs of reads are taken one after the other, so a preemption between
    // them (a loaded machine) moves the ratio; the rate itself is measured over the clock's life.
    const double ratio = Agreement(clock);
    CHECK(ratio > 0.95);
    CHECK(ratio < 1.05);
    // Conversions both ways agree (the spin window is kept in ticks).
    const uint64_t ms = 1'000'000;
    CHECK(clock.ToNanos(clock.FromNanos(ms)) > ms * 99 / 100);
    CHECK(clock.ToNanos(clock.FromNanos(ms)) < ms * 101 / 100);
  }
}

TEST_CASE("the clock never runs backwards on one thread", "[rdma][clock]") {
  TickClock clock;
  uint64_t last = clock.Now();
  for (int i = 0; i < 100000; ++i) {
    const uint64_t now = clock.Now();
    REQUIRE(now >= last);
    last = now;
  }
}

// transport/log_limit.h: how many warnings a logging site lets through, and what the first line
// after a gap says.
#include "transport/log_limit.h"

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <sstream>

using namespace rdmarpc::transport;
using Clock = std::chrono::steady_clock;

TEST_CASE("a logging site lets kLogBurst lines through per kLogInterval, then counts the rest",
          "[log]") {
  LogLimit limit;
  const Clock::time_point t0 = Clock::now();
  uint64_t left_out = 99;
  for (uint32_t i = 0; i < kLogBurst; ++i) {
    REQUIRE(limit.Allow(t0 + std::chrono::milliseconds(i), &left_out));
    CHECK(left_out == 0);
  }
  for (int i = 0; i < 15; ++i) CHECK_FALSE(limit.Allow(t0 + std::chrono::seconds(1), &left_out));
  // Still inside the interval that started with the first line.
  CHECK_FALSE(limit.Allow(t0 + kLogInterval - std::chrono::milliseconds(1), &left_out));
  // A new interval: the first line through hears of the 16 left out, the next ones of none.
  REQUIRE(limit.Allow(t0 + kLogInterval, &left_out));
  CHECK(left_out == 16);
  for (uint32_t i = 1; i < kLogBurst; ++i) {
    REQUIRE(limit.Allow(t0 + kLogInterval, &left_out));
    CHECK(left_out == 0);
  }
  CHECK_FALSE(limit.Allow(t0 + kLogInterval, &left_out));
  // A quiet site starts afresh whenever it logs again.
  REQUIRE(limit.Allow(t0 + 10 * kLogInterval, &left_out));
  CHECK(left_out == 1);
}

TEST_CASE("WarnLimited writes what spdlog::warn would, and says how many it left out", "[log]") {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>(
      "test", std::make_shared<spdlog::sinks::ostream_sink_st>(out));
  logger->set_pattern("%v");
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  LogLimit limit;
  for (int i = 0; i < 25; ++i) WarnLimited(limit, "peer {} sent {}", i, "garbage");
  std::string text = out.str();
  CHECK(std::count(text.begin(), text.end(), '\n') == kLogBurst);
  CHECK(text.rfind("peer 0 sent garbage\n", 0) == 0);
  CHECK(text.find("peer 10 ") == std::string::npos);
  // The next line through (a new interval, forced here by a fresh window) names the 15.
  out.str("");
  uint64_t left_out = 0;
  REQUIRE(limit.Allow(Clock::now() + kLogInterval, &left_out));  // (opens the next interval)
  CHECK(left_out == 15);
  // Below warn level nothing is counted or written.
  logger->set_level(spdlog::level::err);
  LogLimit quiet;
  for (int i = 0; i < 5; ++i) WarnLimited(quiet, "peer {}", i);
  CHECK(out.str().empty());
  logger->set_level(spdlog::level::warn);
  WarnLimited(quiet, "peer {}", 5);
  CHECK(out.str() == "peer 5\n");
  spdlog::set_default_logger(previous);
}

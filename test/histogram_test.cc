// The benchmark histogram: exact below 128 ns, within 1.6% above, quantiles by rank.
#include "tools/bench/histogram.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

using rdmarpc::bench::Histogram;

TEST_CASE("histogram quantiles are within 1.6% of the exact order statistics", "[bench]") {
  Histogram h;
  std::vector<uint64_t> v;
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t x = 50 + rng() % 50'000'000;  // 50 ns .. 50 ms
    v.push_back(x);
    h.Record(x);
  }
  std::sort(v.begin(), v.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const double exact = static_cast<double>(v[static_cast<size_t>(q * v.size())]);
    INFO("q " << q);
    CHECK(std::abs(h.Quantile(q) / exact - 1) < 0.016);
  }
  CHECK(h.count() == v.size());
  CHECK(h.max() == v.back());
  CHECK(h.min() == v.front());
}

TEST_CASE("histogram: small values exactly, huge values without overflow, merge adds up",
          "[bench]") {
  Histogram a, b;
  for (uint64_t x = 0; x < 128; ++x) a.Record(x);
  CHECK(a.Quantile(0.5) == 64);
  CHECK(a.Quantile(0) == 0);
  b.Record(uint64_t(1) << 62);
  b.Record(UINT64_MAX);
  a.Merge(b);
  CHECK(a.count() == 130);
  CHECK(a.max() == UINT64_MAX);
  CHECK(a.Quantile(1.0) == UINT64_MAX);
  CHECK(Histogram().Quantile(0.5) == 0);
}

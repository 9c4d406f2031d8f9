// A latency histogram with bounded relative error: values below 128 ns are exact; above, each
// power of two is split into 64 buckets, so a reported percentile is within 1.6% of the true
// value. Fixed size (no allocation while recording), mergeable across threads.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace rdmarpc::bench {

class Histogram {
 public:
  void Record(uint64_t ns) {
    ++counts_[Index(ns)];
    ++total_;
    max_ = std::max(max_, ns);
    min_ = std::min(min_, ns);
  }

  void Merge(const Histogram& o) {
    for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
    total_ += o.total_;
    max_ = std::max(max_, o.max_);
    min_ = std::min(min_, o.min_);
  }

  uint64_t count() const { return total_; }
  uint64_t max() const { return total_ ? max_ : 0; }
  uint64_t min() const { return total_ ? min_ : 0; }

  // The value at quantile q (0..1), in ns: the midpoint of the bucket holding it.
  uint64_t Quantile(double q) const {
    if (total_ == 0) return 0;
    const uint64_t rank = std::min<uint64_t>(total_ - 1, static_cast<uint64_t>(q * total_));
    if (rank == total_ - 1) return max_;  // the largest value is known exactly
    uint64_t seen = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen > rank) return std::min(max_, Midpoint(i));
    }
    return max_;
  }

 private:
  static constexpr int kSubBits = 6;                   // 64 buckets per power of two
  static constexpr uint64_t kLinear = 2u << kSubBits;  // below this, one bucket per ns

  static size_t Index(uint64_t v) {
    if (v < kLinear) return static_cast<size_t>(v);
    const int e = std::bit_width(v) - 1 - kSubBits;  // shift that leaves 7 significant bits
    return static_cast<size_t>(kLinear + (uint64_t(e - 1) << kSubBits) +
                               ((v >> e) - (uint64_t(1) << kSubBits)));
  }
  static uint64_t Midpoint(size_t i) {
    if (i < kLinear) return i;
    const uint64_t j = i - kLinear;
    const int e = static_cast<int>(j >> kSubBits) + 1;
    const uint64_t mant = (j & ((1u << kSubBits) - 1)) + (uint64_t(1) << kSubBits);
    return (mant << e) + (uint64_t(1) << (e - 1));
  }

  std::array<uint64_t, kLinear + (64 - kSubBits) * (1u << kSubBits)> counts_{};
  uint64_t total_ = 0, max_ = 0, min_ = UINT64_MAX;
};

}  // namespace rdmarpc::bench

// The metrics registry's recording (rpc/metrics.h) under threads: each thread counts into a
// shard of its own, threads that exit hand their slot on, and more threads than slots share
// one; whatever the threads do, Render's totals are exact.
#include "rpc/metrics.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

using rdmarpc::Metrics;
using rdmarpc::StatusCode;

// The value of the sample `series` (name and labels, as rendered), or -1 when absent.
double Sample(const std::string& text, const std::string& series) {
  const std::string key = series + " ";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + key.size()));
  }
  return -1;
}

// `n` calls of `method` that end with `code` and take `ns` nanoseconds.
void Record(Metrics& m, const char* method, int n, StatusCode code, int64_t ns) {
  auto& stats = m.server_methods().Get(method);
  for (int i = 0; i < n; ++i) {
    stats.Started();
    stats.Finished(code, std::chrono::nanoseconds(ns), 10, 20);
  }
}

}  // namespace

TEST_CASE("metrics count every call from many threads exactly", "[metrics]") {
  auto m = std::make_shared<Metrics>();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&m, t] {
      Record(*m, "/a.S/M", 20'000, t % 2 ? StatusCode::kOk : StatusCode::kNotFound, 3'000);
    });
  }
  for (auto& t : threads) t.join();
  const std::string text = m->Render();
  CHECK(Sample(text, "rdmarpc_server_started_total{method=\"/a.S/M\"}") == 160'000);
  CHECK(Sample(text, "rdmarpc_server_handled_total{method=\"/a.S/M\",code=\"OK\"}") == 80'000);
  CHECK(Sample(text, "rdmarpc_server_handled_total{method=\"/a.S/M\",code=\"NOT_FOUND\"}") ==
        80'000);
  CHECK(Sample(text, "rdmarpc_server_in_flight{method=\"/a.S/M\"}") == 0);
  CHECK(Sample(text, "rdmarpc_server_handling_seconds_bucket{method=\"/a.S/M\",le=\"2.5e-06\"}") ==
        0);
  CHECK(Sample(text, "rdmarpc_server_handling_seconds_bucket{method=\"/a.S/M\",le=\"5e-06\"}") ==
        160'000);
  CHECK(Sample(text, "rdmarpc_server_handling_seconds_count{method=\"/a.S/M\"}") == 160'000);
  CHECK(Sample(text, "rdmarpc_server_received_bytes_total{method=\"/a.S/M\"}") == 1'600'000);
  CHECK(Sample(text, "rdmarpc_server_sent_bytes_total{method=\"/a.S/M\"}") == 3'200'000);
}

TEST_CASE("metrics keep the counts of threads that exited", "[metrics]") {
  // 300 short-lived threads, a few at a time: far more than there are slots, so slots are
  // handed from exited threads to new ones; nothing may be lost or counted twice.
  auto m = std::make_shared<Metrics>();
  for (int wave = 0; wave < 100; ++wave) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&m] { Record(*m, "/a.S/Short", 100, StatusCode::kOk, 1); });
    }
    for (auto& t : threads) t.join();
  }
  const std::string text = m->Render();
  CHECK(Sample(text, "rdmarpc_server_started_total{method=\"/a.S/Short\"}") == 30'000);
  CHECK(Sample(text, "rdmarpc_server_handled_total{method=\"/a.S/Short\",code=\"OK\"}") == 30'000);
}

TEST_CASE("metrics stay exact with more threads at once than shards", "[metrics]") {
  // Every thread records once, then waits until all have: so all are alive together, and the
  // ones beyond the slots share the last one (atomic increments).
  constexpr int kThreads = static_cast<int>(rdmarpc::internal::kShards) + 36;
  auto m = std::make_shared<Metrics>();
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      Record(*m, "/a.S/Many", 1, StatusCode::kOk, 1);
      ++arrived;
      while (arrived.load() < kThreads) std::this_thread::yield();
      Record(*m, "/a.S/Many", 999, StatusCode::kInternal, 1);
    });
  }
  for (auto& t : threads) t.join();
  const std::string text = m->Render();
  CHECK(Sample(text, "rdmarpc_server_started_total{method=\"/a.S/Many\"}") == kThreads * 1000);
  CHECK(Sample(text, "rdmarpc_server_handled_total{method=\"/a.S/Many\",code=\"OK\"}") == kThreads);
  CHECK(Sample(text, "rdmarpc_server_handled_total{method=\"/a.S/Many\",code=\"INTERNAL\"}") ==
        kThreads * 999);
}

TEST_CASE("a call's latency lands in the right bucket for every magnitude", "[metrics]") {
  // Bucket() starts from a table indexed by bit length: check it against a plain scan for
  // durations around every bound and across the whole range.
  using rdmarpc::internal::MethodStats;
  auto scan = [](int64_t ns) {
    size_t b = 0;
    while (b < MethodStats::kBucketNanos.size() && ns > MethodStats::kBucketNanos[b]) ++b;
    return b;
  };
  std::vector<int64_t> probes = {0, 1, 2, 3, 999, 1'000, 1'001, INT64_MAX};
  for (int64_t bound : MethodStats::kBucketNanos) {
    for (int64_t d = -2; d <= 2; ++d) probes.push_back(bound + d);
  }
  for (int shift = 0; shift < 63; ++shift) {
    const int64_t p = int64_t{1} << shift;
    probes.insert(probes.end(), {p - 1, p, p + 1});
  }
  for (int64_t ns : probes) {
    INFO("ns = " << ns);
    CHECK(MethodStats::Bucket(ns) == scan(ns));
  }
  CHECK(MethodStats::Bucket(1'000) == 0);
  CHECK(MethodStats::Bucket(10'000'000'001) == MethodStats::kBucketCount - 1);
}

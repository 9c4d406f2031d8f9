// Metrics in the Prometheus text format: per-method call counts, status codes, latency
// histograms, calls in flight and message bytes (recorded by interceptors), a server's
// connection and backpressure gauges, and the transports' counters (transport/stats.h).
// rpc/metrics_http.h serves Render() on an HTTP endpoint for Prometheus to scrape.
//
//   auto metrics = std::make_shared<rdmarpc::Metrics>();
//   options.interceptors.push_back(metrics->server_interceptor());   // before Server(options)
//   rdmarpc::Server server(options);
//   metrics->Watch(server);
//
// Threading: every method is safe from any thread. Recording a call takes no lock and no locked
// instruction (each thread adds to counters of its own, summed by Render; a method's counters
// are found in a table that only grows, under a mutex, the first time each method is seen).
// Render() takes the mutex; it is for scrapes.
//
// Names (see docs/METRICS.md for every series): rdmarpc_server_* and rdmarpc_client_* per
// method, labelled method="/pkg.Service/Method" (and code="OK" etc. for handled calls);
// rdmarpc_transport_* and rdmarpc_rdma_* for the process's transports.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "rpc/interceptor.h"
#include "rpc/status.h"

namespace rdmarpc {

class Server;

namespace internal {
// Recording threads write into shards of their own, so that counting a call takes no locked
// instruction and shares no cache line with other threads: each thread claims one of kShards
// shard slots the first time it records and gives it back when it exits; the next thread to
// claim that slot carries on adding to the same counters (nothing is lost or moved). Threads
// beyond kShards at once share slot kShards, with atomic increments.
inline constexpr size_t kShards = 64;

// One method's counters on one side (server or client). Lives as long as its Metrics.
struct MethodStats {
  // Upper bounds (seconds) of the latency histogram's buckets; +Inf is implied.
  // Microseconds matter here: an RDMA call is served in a few.
  static constexpr double kBuckets[] = {1e-6,   2.5e-6, 5e-6,   10e-6, 25e-6, 50e-6, 100e-6, 250e-6,
                                        500e-6, 1e-3,   2.5e-3, 5e-3,  10e-3, 25e-3, 50e-3,  100e-3,
                                        250e-3, 500e-3, 1.0,    2.5,   5.0,   10.0};
  static constexpr size_t kBucketCount = sizeof(kBuckets) / sizeof(kBuckets[0]) + 1;
  // The same bounds in nanoseconds, and for each bit length of a duration the first bucket
  // that can hold it: Bucket() then needs at most two compares whatever the duration (no two
  // bounds lie within a factor of two), where a binary search over doubles cost ~90 instructions.
  static constexpr std::array<int64_t, kBucketCount - 1> kBucketNanos = [] {
    std::array<int64_t, kBucketCount - 1> a{};
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int64_t>(kBuckets[i] * 1e9 + 0.5);
    return a;
  }();
  static constexpr std::array<uint8_t, 65> kFirstBucketByBits = [] {
    std::array<uint8_t, 65> a{};
    for (size_t bits = 1; bits < a.size(); ++bits) {  // durations in [2^(bits-1), 2^bits)
      const uint64_t low = uint64_t{1} << (bits - 1);
      size_t b = 0;
      while (b < kBucketNanos.size() && static_cast<uint64_t>(kBucketNanos[b]) < low) ++b;
      a[bits] = static_cast<uint8_t>(b);
    }
    return a;
  }();
  // The first bucket whose bound is at least `ns` (Prometheus' "le" is inclusive); past the
  // last bound: the +Inf bucket, kBucketCount - 1.
  static size_t Bucket(int64_t ns) {
    if (ns <= 0) return 0;
    size_t b = kFirstBucketByBits[std::bit_width(static_cast<uint64_t>(ns))];
    while (b < kBucketNanos.size() && ns > kBucketNanos[b]) ++b;
    return b;
  }
  static constexpr size_t kCodes = 17;  // StatusCode 0..16

  // One slot's counters. Written by the slot's owner (atomics only so that Render may read them
  // from another thread), or by many threads with fetch_add in the shared slot.
  struct alignas(64) Shard {
    std::atomic<uint64_t> started{0};
    std::atomic<uint64_t> handled[kCodes]{};
    std::atomic<uint64_t> latency_buckets[kBucketCount]{};  // not cumulative
    std::atomic<uint64_t> latency_nanos{0};
    std::atomic<uint64_t> bytes_received{0}, bytes_sent{0};
  };
  // All shards summed, for Render.
  struct Totals {
    uint64_t started = 0;
    uint64_t handled[kCodes]{};
    uint64_t latency_buckets[kBucketCount]{};
    uint64_t latency_nanos = 0, bytes_received = 0, bytes_sent = 0;
  };

  explicit MethodStats(std::string_view method) : name(method) {}
  MethodStats(const MethodStats&) = delete;
  MethodStats& operator=(const MethodStats&) = delete;
  ~MethodStats();

  // Recording; any thread.
  void Started();
  void Finished(StatusCode code, std::chrono::nanoseconds elapsed, uint64_t bytes_in,
                uint64_t bytes_out);
  // Any thread. Calls in flight are not kept: they are started minus the sum of handled, and
  // Sum reads every shard's handled counts before any started count, so that the difference is
  // not negative for calls that finished on a thread other than the one they started on.
  Totals Sum() const;

  const std::string name;
  MethodStats* next = nullptr;  // the table's chain; set before the node is published

 private:
  Shard& ShardAt(size_t slot) {
    Shard* s = shards_[slot].load(std::memory_order_acquire);
    return s ? *s : MakeShard(slot);
  }
  Shard& MakeShard(size_t slot);
  // The calling thread's own shard: null when the thread has no slot of its own (none claimed
  // yet, or the shared one) or the slot's shard is not made yet.
  Shard* OwnedShard();
  // The first record of a thread or into a new shard, and the shared slot's records.
  [[gnu::noinline]] void StartedSlow();
  [[gnu::noinline]] void FinishedSlow(StatusCode code, std::chrono::nanoseconds elapsed,
                                      uint64_t bytes_in, uint64_t bytes_out);
  std::atomic<Shard*> shards_[kShards + 1]{};  // made on a slot's first use
};

// Method name -> MethodStats, lock-free to read. Nodes are never removed.
class MethodTable {
 public:
  MethodTable() = default;
  MethodTable(const MethodTable&) = delete;
  MethodTable& operator=(const MethodTable&) = delete;
  ~MethodTable();
  // The method's counters, created on first use. Usually one pointer-keyed probe and a name
  // compare: callers pass names from method tables that do not move (generated code's), so the
  // same pointer comes back call after call.
  MethodStats& Get(std::string_view method) {
    std::atomic<MethodStats*>& hint =
        hints_[(reinterpret_cast<uintptr_t>(method.data()) >> 4) % kHints];
    MethodStats* m = hint.load(std::memory_order_acquire);
    if (m && m->name == method) return *m;  // checked: the pointer is only a hint
    m = &Find(method);
    hint.store(m, std::memory_order_release);
    return *m;
  }
  // Every method seen, in no particular order. Any thread.
  std::vector<const MethodStats*> All() const;

 private:
  MethodStats& Find(std::string_view method);

  static constexpr size_t kBuckets = 256, kHints = 64;
  std::atomic<MethodStats*> heads_[kBuckets]{};
  std::atomic<MethodStats*> hints_[kHints]{};
  mutable std::mutex mu_;  // serializes inserts
};
}  // namespace internal

class Metrics : public std::enable_shared_from_this<Metrics> {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // An interceptor recording every call of a server into this registry (rdmarpc_server_*). Add
  // it to ServerOptions::interceptors, ideally first (then it times the others too). It holds
  // a reference to the registry. Calls turned away before the interceptors run (unknown method,
  // connection limit, draining) are not counted per method.
  std::shared_ptr<ServerInterceptor> server_interceptor();
  // The same for a channel's calls (rdmarpc_client_*; no byte counts on the client side): add
  // it to ChannelOptions::interceptors.
  std::shared_ptr<ClientInterceptor> client_interceptor();

  // Adds `server`'s gauges (rdmarpc_server_connections, rdmarpc_server_calls_in_flight,
  // rdmarpc_server_throttle_events_total) to Render(). `server` must outlive this registry's
  // last Render(): stop the endpoint serving it first. At most one server.
  void Watch(const Server& server);

  // Adds a series of the application's own: `name` (a valid Prometheus metric name), its help
  // text, and a function returning its current value, called on Render()'s thread. Gauge when
  // `counter` is false.
  void AddGauge(std::string name, std::string help, std::function<double()> value,
                bool counter = false);

  // Every series, in the Prometheus text exposition format (version 0.0.4). Any thread.
  std::string Render() const;

  internal::MethodTable& server_methods() { return server_; }
  internal::MethodTable& client_methods() { return client_; }

 private:
  struct Custom {
    std::string name, help;
    std::function<double()> value;
    bool counter;
  };

  internal::MethodTable server_, client_;
  mutable std::mutex mu_;
  const Server* server_watched_ = nullptr;
  std::vector<Custom> custom_;
};

// Escapes a label value for the text format: backslash, double quote and newline.
std::string EscapeLabelValue(std::string_view value);

}  // namespace rdmarpc

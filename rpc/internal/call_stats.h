// Per-method call counters (started, handled by status code, a latency histogram, bytes), as
// rdmarpc::Metrics (rpc/metrics.h) keeps and renders them, and the interceptors that record
// into them. Below //rpc so that the runtime's call paths can record into them directly (see
// ServerStatsRecorder); applications use rpc/metrics.h.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "rpc/context.h"
#include "rpc/interceptor.h"
#include "rpc/status.h"

namespace rdmarpc {

namespace internal {
// Recording threads write into shards of their own, so that counting a call takes no locked
// instruction and shares no cache line with other threads: each thread claims one of kShards
// shard slots the first time it records and gives it back when it exits; the next thread to
// claim that slot carries on adding to the same counters (nothing is lost or moved). Threads
// beyond kShards at once share slot kShards, with atomic increments.
inline constexpr size_t kShards = 64;
inline constexpr size_t kNoSlot = kShards + 1;
// The thread's slot: kNoSlot until it first records; kShards (shared) when none was free or
// after the thread gave its slot back on exit (call_stats.cc). Constant-initialized, so reading
// it is a plain TLS load, with no initialization check, from any file that records.
inline constinit thread_local size_t t_slot = kNoSlot;

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
  //
  // Inline for the common case -- the thread owns a slot and its shard exists -- and a call
  // only for anything else: a call per record cost ~25 instructions more per call (its
  // prologue, and the registers the caller saves around it).
  void Started() {
    Shard* s = OwnedShard();
    if (!s) [[unlikely]]
      return StartedSlow();
    AddTo(s->started, 1, false);
  }
  void Finished(StatusCode code, std::chrono::nanoseconds elapsed, uint64_t bytes_in,
                uint64_t bytes_out) {
    Shard* s = OwnedShard();
    if (!s) [[unlikely]]
      return FinishedSlow(code, elapsed, bytes_in, bytes_out);
    const int64_t ns = std::max<int64_t>(elapsed.count(), 0);
    RecordInto<false>(*s, CodeIndex(code), Bucket(ns), static_cast<uint64_t>(ns), bytes_in,
                      bytes_out);
  }
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
  Shard* OwnedShard() {
    const size_t slot = t_slot;
    return slot < kShards ? shards_[slot].load(std::memory_order_acquire) : nullptr;
  }
  // Adds `n` to `c`: a plain load and store for the slot's one writer, fetch_add in the shared
  // one.
  static void AddTo(std::atomic<uint64_t>& c, uint64_t n, bool shared) {
    if (shared) {
      c.fetch_add(n, std::memory_order_relaxed);
    } else {
      c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
  }
  // One finished call into shard `s`; kShared: the shared slot (atomic increments).
  template <bool kShared>
  static void RecordInto(Shard& s, size_t code, size_t bucket, uint64_t ns, uint64_t bytes_in,
                         uint64_t bytes_out) {
    AddTo(s.handled[code], 1, kShared);
    AddTo(s.latency_buckets[bucket], 1, kShared);
    AddTo(s.latency_nanos, ns, kShared);
    if (bytes_in) AddTo(s.bytes_received, bytes_in, kShared);
    if (bytes_out) AddTo(s.bytes_sent, bytes_out, kShared);
  }
  static size_t CodeIndex(StatusCode code) {
    const auto c = static_cast<size_t>(code);
    return c < kCodes ? c : static_cast<size_t>(StatusCode::kUnknown);
  }
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
// The per-method interceptors of rdmarpc::Metrics derive from these. Where one comes first in a
// server's (ServerOptions::interceptors) or a channel's (ChannelOptions::interceptors) list, the
// runtime records into its stats() itself and leaves it out of the virtual calls: being first,
// it would start before the others and finish after them, and that is where the runtime records
// (a call's timing taken as OnStart/OnFinish would: from before the first interceptor's start to
// after the last one's finish). Elsewhere in a list it runs as any interceptor, through OnStart
// and OnFinish. Saves the calls' virtual dispatch, the interceptor list's loops and, on the
// client, the copy of the call's options that interceptors get to change.
class ServerStatsRecorder : public ServerInterceptor {
 public:
  explicit ServerStatsRecorder(MethodStats& stats) : stats_(stats) {}
  Status OnStart(ServerContext&) override {
    stats_.Started();
    return Status();
  }
  void OnFinish(const ServerContext& context, const Status& status,
                std::chrono::nanoseconds elapsed) override {
    stats_.Finished(status.code(), elapsed, context.bytes_received(), context.bytes_sent());
  }
  MethodStats& stats() const { return stats_; }

 private:
  MethodStats& stats_;
};

class ClientStatsRecorder : public ClientInterceptor {
 public:
  explicit ClientStatsRecorder(MethodStats& stats) : stats_(stats) {}
  Status OnStart(const MethodInfo&, CallOptions&) override {
    stats_.Started();
    return Status();
  }
  void OnFinish(const MethodInfo&, const Status& status,
                std::chrono::nanoseconds elapsed) override {
    stats_.Finished(status.code(), elapsed, 0, 0);
  }
  MethodStats& stats() const { return stats_; }

 private:
  MethodStats& stats_;
};

// The rule above, for servers and channels binding a method's interceptors: the counters of
// the Recorder (ServerStatsRecorder or ClientStatsRecorder) that comes first in `list`, if one
// does (the caller then takes it out of the list it calls), else null.
template <class Recorder, class Interceptors>
MethodStats* LeadingRecorderStats(const Interceptors& list) {
  auto* r = list.empty() ? nullptr : dynamic_cast<Recorder*>(list.front().get());
  return r ? &r->stats() : nullptr;
}
}  // namespace internal

}  // namespace rdmarpc

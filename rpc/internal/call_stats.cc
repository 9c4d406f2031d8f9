#include "rpc/internal/call_stats.h"

#include <algorithm>
#include <bitset>

namespace rdmarpc {
namespace internal {
namespace {

// Which shard slots are taken. Leaked on purpose: threads may exit (and give their slot back)
// during static destruction.
struct ShardSlots {
  std::mutex mu;
  std::bitset<kShards> taken;
};
ShardSlots& shard_slots() {
  static auto* s = new ShardSlots;
  return *s;
}

// Gives the thread's slot back when the thread exits. The mutex orders the last writes of this
// thread before the first of the slot's next owner.
struct SlotRelease {
  size_t slot = kShards;
  ~SlotRelease() {
    if (slot < kShards) {
      ShardSlots& s = shard_slots();
      std::lock_guard lock(s.mu);
      s.taken.reset(slot);
    }
    t_slot = kShards;  // anything recorded later on this thread goes to the shared slot
  }
};
thread_local SlotRelease t_release;

size_t ClaimSlot() {
  ShardSlots& s = shard_slots();
  size_t slot = kShards;
  {
    std::lock_guard lock(s.mu);
    for (size_t i = 0; i < kShards; ++i) {
      if (!s.taken[i]) {
        s.taken.set(i);
        slot = i;
        break;
      }
    }
  }
  t_release.slot = slot;  // first use constructs it, which arranges its destructor
  t_slot = slot;
  return slot;
}

inline size_t ThisThreadSlot() {
  const size_t slot = t_slot;
  return slot != kNoSlot ? slot : ClaimSlot();
}

}  // namespace

MethodStats::~MethodStats() {
  for (auto& s : shards_) delete s.load(std::memory_order_relaxed);
}

MethodStats::Shard& MethodStats::MakeShard(size_t slot) {
  Shard* s = nullptr;
  auto* made = new Shard;
  // Only the shared slot can race here; an owned slot has one writer.
  if (shards_[slot].compare_exchange_strong(s, made, std::memory_order_acq_rel)) return *made;
  delete made;
  return *s;
}

void MethodStats::StartedSlow() {
  const size_t slot = ThisThreadSlot();
  AddTo(ShardAt(slot).started, 1, slot == kShards);
}

void MethodStats::FinishedSlow(StatusCode code, std::chrono::nanoseconds elapsed, uint64_t bytes_in,
                               uint64_t bytes_out) {
  const size_t slot = ThisThreadSlot();
  Shard& s = ShardAt(slot);
  const int64_t ns = std::max<int64_t>(elapsed.count(), 0);
  if (slot != kShards) {
    RecordInto<false>(s, CodeIndex(code), Bucket(ns), static_cast<uint64_t>(ns), bytes_in,
                      bytes_out);
  } else {
    RecordInto<true>(s, CodeIndex(code), Bucket(ns), static_cast<uint64_t>(ns), bytes_in,
                     bytes_out);
  }
}

MethodStats::Totals MethodStats::Sum() const {
  Totals t;
  constexpr auto relaxed = std::memory_order_relaxed;
  for (const auto& slot : shards_) {
    const Shard* s = slot.load(std::memory_order_acquire);
    if (!s) continue;
    for (size_t c = 0; c < kCodes; ++c) t.handled[c] += s->handled[c].load(relaxed);
    for (size_t b = 0; b < kBucketCount; ++b)
      t.latency_buckets[b] += s->latency_buckets[b].load(relaxed);
    t.latency_nanos += s->latency_nanos.load(relaxed);
    t.bytes_received += s->bytes_received.load(relaxed);
    t.bytes_sent += s->bytes_sent.load(relaxed);
  }
  for (const auto& slot : shards_) {  // after every handled count (see the header)
    if (const Shard* s = slot.load(std::memory_order_acquire))
      t.started += s->started.load(relaxed);
  }
  return t;
}

MethodTable::~MethodTable() {
  for (auto& head : heads_) {
    for (MethodStats* m = head.load(std::memory_order_relaxed); m;) {
      MethodStats* next = m->next;
      delete m;
      m = next;
    }
  }
}

namespace {
size_t HashName(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return static_cast<size_t>(h);
}
}  // namespace

MethodStats& MethodTable::Find(std::string_view method) {
  std::atomic<MethodStats*>& head = heads_[HashName(method) % kBuckets];
  for (MethodStats* m = head.load(std::memory_order_acquire); m; m = m->next) {
    if (m->name == method) return *m;
  }
  std::lock_guard lock(mu_);
  // Again under the lock: another thread may have added it meanwhile.
  for (MethodStats* m = head.load(std::memory_order_acquire); m; m = m->next) {
    if (m->name == method) return *m;
  }
  auto* m = new MethodStats(method);
  m->next = head.load(std::memory_order_relaxed);
  head.store(m, std::memory_order_release);  // readers see a complete node
  return *m;
}

std::vector<const MethodStats*> MethodTable::All() const {
  std::vector<const MethodStats*> out;
  for (const auto& head : heads_) {
    for (const MethodStats* m = head.load(std::memory_order_acquire); m; m = m->next) {
      out.push_back(m);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const MethodStats* a, const MethodStats* b) { return a->name < b->name; });
  return out;
}

}  // namespace internal

}  // namespace rdmarpc

#include "transport/stats.h"

#include <atomic>
#include <mutex>
#include <vector>

namespace rdmarpc::transport {
namespace {

struct Block;

// The live threads' blocks and the sum of the exited ones'. Leaked on purpose: threads may exit
// (and retire their block) during static destruction.
struct Registry {
  std::mutex mu;
  std::vector<Block*> live;
  StatValues retired{};
  // Where a thread counts after its block is gone (other thread_locals' destructors may still
  // count); shared by such threads, so a late count may be lost, never misplaced.
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Stat::kCount)> late{};
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

struct Block {
  // Written by the owning thread only; read by Snapshot from any thread, hence atomics.
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Stat::kCount)> v{};

  Block() {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    r.live.push_back(this);
  }
  ~Block() {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    for (size_t i = 0; i < v.size(); ++i) r.retired[i] += v[i].load(std::memory_order_relaxed);
    std::erase(r.live, this);
    internal::t_counters = r.late.data();
  }
};

}  // namespace

namespace internal {
std::atomic<uint64_t>* AttachThreadCounters() {
  static thread_local Block block;
  t_counters = block.v.data();
  return t_counters;
}
}  // namespace internal

StatValues Snapshot() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  StatValues out = r.retired;
  for (const Block* b : r.live) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += b->v[i].load(std::memory_order_relaxed);
  }
  for (size_t i = 0; i < out.size(); ++i) out[i] += r.late[i].load(std::memory_order_relaxed);
  return out;
}

}  // namespace rdmarpc::transport

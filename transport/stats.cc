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
  }
};

thread_local Block tls_block;

}  // namespace

void Count(Stat s, uint64_t n) {
  auto& c = tls_block.v[static_cast<size_t>(s)];
  // One writer: no read-modify-write instruction needed.
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

StatValues Snapshot() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  StatValues out = r.retired;
  for (const Block* b : r.live) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += b->v[i].load(std::memory_order_relaxed);
  }
  return out;
}

}  // namespace rdmarpc::transport

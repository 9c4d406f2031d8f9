// The in-memory engine: an ordered map under a reader-writer lock. Reads run in parallel; writes
// (rare next to reads in the workloads this sample is for) take the lock exclusively, which also
// makes compare-and-set atomic.
#include <map>
#include <mutex>
#include <shared_mutex>

#include "examples/kv/engine.h"

namespace kv {
namespace {

using rdmarpc::Result;
using rdmarpc::Status;

class MemoryEngine final : public Engine {
 public:
  explicit MemoryEngine(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  std::string name() const override { return "memory"; }

  Result<std::optional<Record>> Get(std::string_view key) override {
    std::shared_lock lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::optional<Record>();
    return std::optional<Record>(it->second);
  }

  Result<uint64_t> Put(std::string_view key, std::string_view value,
                       std::optional<uint64_t> expected) override {
    std::unique_lock lock(mu_);
    auto it = map_.find(key);
    const uint64_t current = it == map_.end() ? 0 : it->second.version;
    if (expected && *expected != current) return VersionMismatch(expected, current);
    const uint64_t before = it == map_.end() ? 0 : EntryBytes(key, it->second.value);
    const uint64_t after = EntryBytes(key, value);
    if (max_bytes_ != 0 && after > before && bytes_ - before + after > max_bytes_) {
      return StoreFull("memory", bytes_, max_bytes_, after - before);
    }
    bytes_ = bytes_ - before + after;
    const uint64_t v = ++version_;
    if (it == map_.end()) {
      map_.emplace(std::string(key), Record{std::string(value), v});
    } else {
      it->second.value.assign(value);
      it->second.version = v;
    }
    return v;
  }

  Result<uint64_t> Delete(std::string_view key, std::optional<uint64_t> expected) override {
    std::unique_lock lock(mu_);
    auto it = map_.find(key);
    const uint64_t current = it == map_.end() ? 0 : it->second.version;
    if (expected && *expected != current) return VersionMismatch(expected, current);
    if (it == map_.end()) return uint64_t{0};
    bytes_ -= EntryBytes(key, it->second.value);
    map_.erase(it);
    return ++version_;
  }

  Result<std::vector<ScanEntry>> Scan(const ScanRange& r, bool* more) override {
    std::shared_lock lock(mu_);
    std::vector<ScanEntry> out;
    auto it = r.after.empty() || r.after < r.start ? map_.lower_bound(r.start)
                                                   : map_.upper_bound(r.after);
    *more = false;
    size_t bytes = 0;
    for (; it != map_.end(); ++it) {
      if (!r.end.empty() && it->first >= r.end) break;
      const size_t entry = it->first.size() + it->second.value.size();
      if (out.size() == r.limit || (r.max_bytes && !out.empty() && bytes + entry > r.max_bytes)) {
        *more = true;
        break;
      }
      bytes += entry;
      out.push_back({it->first, it->second.value, it->second.version});
    }
    return out;
  }

  uint64_t ApproximateKeys() override {
    std::shared_lock lock(mu_);
    return map_.size();
  }
  uint64_t CurrentVersion() override {
    std::shared_lock lock(mu_);
    return version_;
  }
  Status Flush() override { return Status(); }

 private:
  const uint64_t max_bytes_;
  std::shared_mutex mu_;
  std::map<std::string, Record, std::less<>> map_;
  uint64_t version_ = 0;
  uint64_t bytes_ = 0;  // what the entries count for against max_bytes_
};

}  // namespace

std::unique_ptr<Engine> NewMemoryEngine(uint64_t max_bytes) {
  return std::make_unique<MemoryEngine>(max_bytes);
}

}  // namespace kv

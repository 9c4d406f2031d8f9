// Storage engines behind the KV service: an in-memory map (default) and RocksDB (--data-dir).
//
// Threading: every method may be called from any I/O thread at once; engines synchronise
// internally. Errors: I/O failures come back as a non-OK Status (INTERNAL), a compare-and-set
// mismatch as ABORTED naming the current version.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rpc/status.h"

namespace kv {

struct Record {
  std::string value;
  uint64_t version = 0;
};

struct ScanEntry {
  std::string key;
  std::string value;
  uint64_t version = 0;
};

struct ScanRange {
  std::string start;  // inclusive; empty = from the beginning
  std::string end;    // exclusive; empty = to the end
  std::string after;  // if not empty: only keys > after (a continuation)
  size_t limit = 1000;
  // Ends the page early (with `more`) before an entry that would take its keys and values past
  // this many bytes, though never before its first entry; 0 = no bound.
  size_t max_bytes = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual std::string name() const = 0;
  // The record under `key`, or nullopt.
  virtual rdmarpc::Result<std::optional<Record>> Get(std::string_view key) = 0;
  // Writes `value`; with `expected`, only if the key's version equals it (0 = absent). Returns the
  // new version.
  virtual rdmarpc::Result<uint64_t> Put(std::string_view key, std::string_view value,
                                        std::optional<uint64_t> expected) = 0;
  // Removes `key`; with `expected`, only if its version equals it. Returns the deletion's
  // version (a delete takes the next version too, so that every change has its own: Watch
  // streams them in that order), or 0 when the key did not exist.
  virtual rdmarpc::Result<uint64_t> Delete(std::string_view key,
                                           std::optional<uint64_t> expected) = 0;
  // Entries in `range`, in bytewise key order; sets `more` when entries remain past the last.
  virtual rdmarpc::Result<std::vector<ScanEntry>> Scan(const ScanRange& range, bool* more) = 0;
  virtual uint64_t ApproximateKeys() = 0;
  virtual uint64_t CurrentVersion() = 0;
  // Makes every acknowledged write durable (called on shutdown).
  virtual rdmarpc::Status Flush() = 0;
};

// A store's bound (kv_server --max-store-bytes; 0 = no bound): each entry counts as its key and
// value plus kEntryOverheadBytes of bookkeeping. A Put that would take the store past the bound
// fails with RESOURCE_EXHAUSTED ("store full", StoreFull) and changes nothing, so that clients
// cannot fill the server's memory or disk. Deletes, and Puts that make an entry smaller, always go
// through.
inline constexpr uint64_t kEntryOverheadBytes = 128;
inline uint64_t EntryBytes(std::string_view key, std::string_view value) {
  return key.size() + value.size() + kEntryOverheadBytes;
}

// The in-memory engine, held to `max_bytes` as above.
std::unique_ptr<Engine> NewMemoryEngine(uint64_t max_bytes = 0);

// Opens (creating if needed) a RocksDB database in `dir`, held to `max_bytes` as above. With
// `sync`, every write is fsynced before it is acknowledged (survives power loss); without, writes
// go to RocksDB's write-ahead log in the OS page cache before they are acknowledged (survive the
// process being killed, SIGKILL included, but not a machine crash). What the entries count for is
// kept in the database, written with each change; a database from before it is counted once, by
// a scan, when opened. On disk a store takes about that count plus what RocksDB keeps besides
// (its write-ahead log, old versions until compaction), not the count times anything large.
rdmarpc::Result<std::unique_ptr<Engine>> OpenRocksDbEngine(const std::string& dir, bool sync,
                                                           uint64_t max_bytes = 0);

// The RESOURCE_EXHAUSTED status of a Put refused by the bound: the engine holds `held` of
// `max_bytes` and the put needs `more`.
rdmarpc::Status StoreFull(std::string_view engine, uint64_t held, uint64_t max_bytes,
                          uint64_t more);

// The ABORTED status of a failed compare-and-set.
rdmarpc::Status VersionMismatch(std::optional<uint64_t> expected, uint64_t current);

}  // namespace kv

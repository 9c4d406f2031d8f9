// The KV service: proto/kv.proto's methods over an Engine. The engine is not owned and must
// outlive the service; handlers run on the server's I/O threads and call the engine directly
// (its calls are short; a slow disk would call for a thread pool here).
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "examples/kv/engine.h"
#include "proto/kv.rdmarpc.pb.h"

namespace kv {

// The recent changes a Watch streams from: every write's event, by version. Versions are dense
// (each successful Put or Delete takes the next one), but writes on different I/O threads may
// finish out of order: an event is published only once every version before it has been, so a
// watcher never skips one. Bounded: the oldest events go once there are more than
// `max_events` or their bytes pass `max_bytes`. Thread-safe.
class ChangeLog {
 public:
  // A watcher waits on `timer` (on its own I/O thread); Append cancels the wait.
  struct Waker {
    explicit Waker(boost::asio::any_io_executor ex) : timer(std::move(ex)) {}
    boost::asio::steady_timer timer;
  };

  // `published`: the version the engine has reached already (history starts after it).
  ChangeLog(uint64_t published, size_t max_events, size_t max_bytes)
      : published_(published),
        first_(published + 1),
        max_events_(max_events),
        max_bytes_(max_bytes) {}

  void Append(WatchEvent event);

  // Up to `max` published events after version `after` whose key starts with `prefix`; sets
  // `*seen` to the last version looked at (resume from there). Nullopt when events after
  // `after` have been dropped already (the history no longer reaches back that far).
  std::optional<std::vector<WatchEvent>> Since(uint64_t after, const std::string& prefix,
                                               size_t max, uint64_t* seen);
  uint64_t published();
  uint64_t first();  // the oldest version still kept (published + 1 when empty)

  void AddWatcher(const std::shared_ptr<Waker>& w);
  void RemoveWatcher(const std::shared_ptr<Waker>& w);

 private:
  std::mutex mu_;
  std::deque<WatchEvent> events_;         // versions first_ .. published_
  std::map<uint64_t, WatchEvent> early_;  // finished ahead of a version still running
  uint64_t published_, first_;
  size_t bytes_ = 0;
  size_t max_events_, max_bytes_;
  std::set<std::shared_ptr<Waker>> watchers_;
};

class KvService final : public KV::Service {
 public:
  // The change history Watch can replay: this many recent events, or this many bytes of them.
  static constexpr size_t kHistoryEvents = 100000;
  static constexpr size_t kHistoryBytes = 64u << 20;

  explicit KvService(Engine& engine, std::string data_dir = "",
                     size_t history_events = kHistoryEvents)
      : engine_(engine),
        data_dir_(std::move(data_dir)),
        changes_(engine.CurrentVersion(), history_events, kHistoryBytes) {}

  boost::asio::awaitable<rdmarpc::Status> Get(rdmarpc::ServerContext&, const GetRequest&,
                                              GetReply&) override;
  boost::asio::awaitable<rdmarpc::Status> Put(rdmarpc::ServerContext&, const PutRequest&,
                                              PutReply&) override;
  boost::asio::awaitable<rdmarpc::Status> Delete(rdmarpc::ServerContext&, const DeleteRequest&,
                                                 DeleteReply&) override;
  boost::asio::awaitable<rdmarpc::Status> MultiGet(rdmarpc::ServerContext&, const MultiGetRequest&,
                                                   MultiGetReply&) override;
  boost::asio::awaitable<rdmarpc::Status> Scan(rdmarpc::ServerContext&, const ScanRequest&,
                                               ScanReply&) override;
  boost::asio::awaitable<rdmarpc::Status> Info(rdmarpc::ServerContext&, const InfoRequest&,
                                               InfoReply&) override;
  boost::asio::awaitable<rdmarpc::Status> Watch(rdmarpc::ServerContext&, const WatchRequest&,
                                                rdmarpc::ServerWriter<WatchEvent>&) override;

  // Largest number of entries one Scan returns, whatever the request asks.
  static constexpr uint32_t kMaxScanLimit = 10000;
  // Replies copy values, so a small request could ask for a huge one (one large value named
  // thousands of times in a MultiGet): the keys and values of a MultiGet reply are held to
  // kMaxReplyBytes (the default message limit: a larger reply could not be sent anyway), past
  // which it fails with RESOURCE_EXHAUSTED, and a Scan page ends (with `more`) before an entry
  // that would take it past kScanPageBytes (a page always has its first entry).
  static constexpr size_t kMaxReplyBytes = 64u << 20;
  static constexpr size_t kScanPageBytes = 16u << 20;

 private:
  Engine& engine_;
  std::string data_dir_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  ChangeLog changes_;
};

}  // namespace kv

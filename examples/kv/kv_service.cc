#include "examples/kv/kv_service.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace kv {

using rdmarpc::ServerContext;
using rdmarpc::Status;
using rdmarpc::StatusCode;

namespace {

Status FillGet(Engine& engine, const std::string& key, GetReply& reply) {
  auto r = engine.Get(key);
  if (!r.ok()) return r.status();
  reply.set_found(r->has_value());
  if (r->has_value()) {
    reply.set_value(std::move((*r)->value));
    reply.set_version((*r)->version);
  }
  return Status();
}

}  // namespace

boost::asio::awaitable<Status> KvService::Get(ServerContext&, const GetRequest& req,
                                              GetReply& reply) {
  co_return FillGet(engine_, req.key(), reply);
}

boost::asio::awaitable<Status> KvService::Put(ServerContext&, const PutRequest& req,
                                              PutReply& reply) {
  std::optional<uint64_t> expected;
  if (req.has_expected_version()) expected = req.expected_version();
  auto v = engine_.Put(req.key(), req.value(), expected);
  if (!v.ok()) co_return v.status();
  reply.set_version(*v);
  WatchEvent ev;
  ev.set_kind(WatchEvent::PUT);
  ev.set_key(req.key());
  ev.set_value(req.value());
  ev.set_version(*v);
  changes_.Append(std::move(ev));
  co_return Status();
}

boost::asio::awaitable<Status> KvService::Delete(ServerContext&, const DeleteRequest& req,
                                                 DeleteReply& reply) {
  std::optional<uint64_t> expected;
  if (req.has_expected_version()) expected = req.expected_version();
  auto v = engine_.Delete(req.key(), expected);
  if (!v.ok()) co_return v.status();
  reply.set_existed(*v != 0);
  reply.set_version(*v);
  if (*v != 0) {
    WatchEvent ev;
    ev.set_kind(WatchEvent::DELETE);
    ev.set_key(req.key());
    ev.set_version(*v);
    changes_.Append(std::move(ev));
  }
  co_return Status();
}

boost::asio::awaitable<Status> KvService::Watch(ServerContext& ctx, const WatchRequest& req,
                                                rdmarpc::ServerWriter<WatchEvent>& writer) {
  auto waker = std::make_shared<ChangeLog::Waker>(co_await boost::asio::this_coro::executor);
  changes_.AddWatcher(waker);
  struct Remove {
    ChangeLog& log;
    std::shared_ptr<ChangeLog::Waker> w;
    ~Remove() { log.RemoveWatcher(w); }
  } remove{changes_, waker};
  uint64_t after = req.after_version() != 0 ? req.after_version() : changes_.published();
  while (!ctx.cancelled()) {
    // One change at a time, taken (copied) only once the stream can send it at once: a copy
    // taken before would be held for as long as the caller does not read, and a history's worth
    // for each of a caller's watches added up to gigabytes.
    if (!co_await writer.Writable()) co_return Status(StatusCode::kCancelled, "watch ended");
    uint64_t seen = after;
    auto events = changes_.Since(after, req.prefix(), 1, &seen);
    if (!events) {
      co_return Status(StatusCode::kOutOfRange,
                       "changes after version " + std::to_string(after) +
                           " are no longer kept (history starts at version " +
                           std::to_string(changes_.first()) +
                           "); read the current state and watch from its version");
    }
    for (const WatchEvent& ev : *events) {
      if (!co_await writer.Write(ev)) co_return Status(StatusCode::kCancelled, "watch ended");
    }
    after = seen;
    if (events->empty()) {
      // Nothing new: wait for Append (or a second, in case a wake-up crossed this check).
      waker->timer.expires_after(std::chrono::seconds(1));
      co_await waker->timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    }
  }
  co_return Status(StatusCode::kCancelled, "watch cancelled by the caller");
}

void ChangeLog::Append(WatchEvent event) {
  std::set<std::shared_ptr<Waker>> wake;
  {
    std::lock_guard lock(mu_);
    early_.emplace(event.version(), std::move(event));
    // Publish what is now contiguous.
    for (auto it = early_.begin(); it != early_.end() && it->first == published_ + 1;
         it = early_.erase(it)) {
      bytes_ += it->second.key().size() + it->second.value().size() + 64;
      events_.push_back(std::move(it->second));
      ++published_;
    }
    while (!events_.empty() && (events_.size() > max_events_ || bytes_ > max_bytes_)) {
      bytes_ -= events_.front().key().size() + events_.front().value().size() + 64;
      events_.pop_front();
      ++first_;
    }
    wake = watchers_;
  }
  for (const auto& w : wake) {
    boost::asio::post(w->timer.get_executor(), [w] { w->timer.cancel(); });
  }
}

std::optional<std::vector<WatchEvent>> ChangeLog::Since(uint64_t after, const std::string& prefix,
                                                        size_t max, uint64_t* seen) {
  std::lock_guard lock(mu_);
  std::vector<WatchEvent> out;
  *seen = after;
  if (after >= published_) return out;  // nothing newer yet
  if (after + 1 < first_) return std::nullopt;
  for (uint64_t v = after + 1; v <= published_ && out.size() < max; ++v) {
    const WatchEvent& ev = events_[v - first_];
    if (ev.key().compare(0, prefix.size(), prefix) == 0) out.push_back(ev);
    *seen = v;
  }
  return out;
}

uint64_t ChangeLog::published() {
  std::lock_guard lock(mu_);
  return published_;
}

uint64_t ChangeLog::first() {
  std::lock_guard lock(mu_);
  return first_;
}

void ChangeLog::AddWatcher(const std::shared_ptr<Waker>& w) {
  std::lock_guard lock(mu_);
  watchers_.insert(w);
}

void ChangeLog::RemoveWatcher(const std::shared_ptr<Waker>& w) {
  std::lock_guard lock(mu_);
  watchers_.erase(w);
}

boost::asio::awaitable<Status> KvService::MultiGet(ServerContext&, const MultiGetRequest& req,
                                                   MultiGetReply& reply) {
  size_t bytes = 0;
  for (const auto& key : req.keys()) {
    GetReply* result = reply.add_results();
    if (Status s = FillGet(engine_, key, *result); !s.ok()) co_return s;
    bytes += key.size() + result->value().size();
    if (bytes > kMaxReplyBytes) {
      // (Not cleared: the error goes without it, and a cleared reply would keep its strings'
      // memory and look small enough for its job to be pooled with them.)
      co_return Status(StatusCode::kResourceExhausted,
                       "MultiGet reply over " + std::to_string(kMaxReplyBytes) + " bytes after " +
                           std::to_string(reply.results_size()) + " of " +
                           std::to_string(req.keys_size()) + " keys: ask for fewer keys at a time");
    }
  }
  co_return Status();
}

boost::asio::awaitable<Status> KvService::Scan(ServerContext&, const ScanRequest& req,
                                               ScanReply& reply) {
  if (!req.end().empty() && req.end() <= req.start()) {
    co_return Status(StatusCode::kInvalidArgument, "scan range is empty: end <= start");
  }
  ScanRange range;
  range.start = req.start();
  range.end = req.end();
  range.after = req.after();
  range.limit = req.limit() == 0 ? 1000 : std::min(req.limit(), kMaxScanLimit);
  range.max_bytes = kScanPageBytes;
  bool more = false;
  auto entries = engine_.Scan(range, &more);
  if (!entries.ok()) co_return entries.status();
  for (auto& e : *entries) {
    Entry* out = reply.add_entries();
    out->set_key(std::move(e.key));
    out->set_value(std::move(e.value));
    out->set_version(e.version);
  }
  reply.set_more(more);
  if (!entries->empty()) reply.set_continuation(reply.entries().rbegin()->key());
  co_return Status();
}

boost::asio::awaitable<Status> KvService::Info(ServerContext&, const InfoRequest&,
                                               InfoReply& reply) {
  reply.set_engine(engine_.name());
  reply.set_keys(engine_.ApproximateKeys());
  reply.set_version(engine_.CurrentVersion());
  reply.set_uptime_s(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count());
  reply.set_data_dir(data_dir_);
  co_return Status();
}

}  // namespace kv

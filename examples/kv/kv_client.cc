#include "examples/kv/kv_client.h"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace kv {
namespace asio = boost::asio;
using rdmarpc::Result;
using rdmarpc::Status;
using rdmarpc::StatusCode;

namespace {

constexpr int kPointsPerShard = 160;
// A dead server is tried again no more often than this, when one of its keys is asked for.
constexpr auto kRetryDownShard = std::chrono::seconds(1);

// Runs fn(i) for every i in [0, n) at once on the current executor and returns when all are done.
template <class F>
asio::awaitable<void> ForAll(size_t n, F fn) {
  if (n == 0) co_return;
  auto ex = co_await asio::this_coro::executor;
  auto left = std::make_shared<size_t>(n);
  auto all_done = std::make_shared<asio::steady_timer>(ex, asio::steady_timer::time_point::max());
  for (size_t i = 0; i < n; ++i) {
    asio::co_spawn(
        ex,
        [fn, i, left, all_done]() -> asio::awaitable<void> {
          co_await fn(i);
          // Moving the expiry into the past wakes the waiter whether or not it waits yet.
          if (--*left == 0) all_done->expires_at(asio::steady_timer::time_point::min());
        },
        asio::detached);
  }
  while (*left > 0) co_await all_done->async_wait(asio::as_tuple(asio::use_awaitable));
}

}  // namespace

uint64_t KeyHash(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

asio::awaitable<Result<std::unique_ptr<ShardedClient>>> ShardedClient::Connect(
    std::vector<std::string> targets, rdmarpc::ChannelOptions options) {
  if (targets.empty()) co_return Status(StatusCode::kInvalidArgument, "no targets");
  std::unique_ptr<ShardedClient> c(new ShardedClient());
  c->channel_options_ = std::move(options);
  for (const auto& t : targets) c->shards_.push_back(Shard{.target = t});
  ShardedClient* self = c.get();
  co_await ForAll(targets.size(), [self](size_t s) { return self->ConnectShard(s); });
  std::string why;
  for (const auto& sh : c->shards_) {
    if (sh.stub) {
      why.clear();
      break;
    }
    why += (why.empty() ? "" : "; ") + sh.target + ": " + sh.down.message();
  }
  if (!why.empty()) co_return Status(StatusCode::kUnavailable, why);
  for (size_t s = 0; s < targets.size(); ++s) {
    for (int p = 0; p < kPointsPerShard; ++p) {
      c->ring_.emplace_back(KeyHash(targets[s] + "#" + std::to_string(p)), s);
    }
  }
  std::sort(c->ring_.begin(), c->ring_.end());
  c->targets_ = std::move(targets);
  co_return c;
}

asio::awaitable<void> ShardedClient::ConnectShard(size_t s) {
  Shard& sh = shards_[s];
  sh.connecting = true;
  auto ch = co_await rdmarpc::Channel::Connect(sh.target, channel_options_);
  sh.connecting = false;
  if (ch.ok()) {
    sh.stub.emplace(*ch);
    sh.down = Status();
  } else {
    sh.down = ch.status();
    sh.retry_at = std::chrono::steady_clock::now() + kRetryDownShard;
  }
}

asio::awaitable<KV::Stub*> ShardedClient::StubFor(size_t s, Status& why) {
  Shard& sh = shards_[s];
  // One reconnect at a time per shard; meanwhile its other calls fail fast, as they did before.
  if (!sh.stub && !sh.connecting && std::chrono::steady_clock::now() >= sh.retry_at) {
    co_await ConnectShard(s);
  }
  if (sh.stub) co_return &*sh.stub;
  why = Status(StatusCode::kUnavailable,
               "server " + sh.target + " is down (" + sh.down.message() + ")");
  co_return nullptr;
}

template <class Call>
asio::awaitable<Status> ShardedClient::CallShard(size_t s, Call call) {
  Status st;
  KV::Stub* stub = co_await StubFor(s, st);
  if (!stub) co_return st;
  st = co_await call(*stub);
  if (!st.ok()) st = Named(s, st);
  co_return st;
}

Status ShardedClient::Named(size_t s, const Status& st) const {
  return Status(st.code(), shards_[s].target + ": " + st.message());
}

size_t ShardedClient::ShardOf(std::string_view key) const {
  if (shards_.size() == 1) return 0;
  const uint64_t h = KeyHash(key);
  auto it = std::lower_bound(ring_.begin(), ring_.end(), std::make_pair(h, size_t(0)));
  if (it == ring_.end()) it = ring_.begin();
  return it->second;
}

asio::awaitable<Result<GetReply>> ShardedClient::Get(std::string key) {
  GetRequest req;
  req.set_key(std::move(key));
  GetReply reply;
  Status st = co_await CallShard(ShardOf(req.key()),
                                 [&](KV::Stub& stub) { return stub.Get(req, reply, options_); });
  if (!st.ok()) co_return st;
  co_return reply;
}

asio::awaitable<Result<PutReply>> ShardedClient::Put(std::string key, std::string value,
                                                     std::optional<uint64_t> expected) {
  PutRequest req;
  req.set_key(std::move(key));
  req.set_value(std::move(value));
  if (expected) req.set_expected_version(*expected);
  PutReply reply;
  Status st = co_await CallShard(ShardOf(req.key()),
                                 [&](KV::Stub& stub) { return stub.Put(req, reply, options_); });
  if (!st.ok()) co_return st;
  co_return reply;
}

asio::awaitable<Result<DeleteReply>> ShardedClient::Delete(std::string key,
                                                           std::optional<uint64_t> expected) {
  DeleteRequest req;
  req.set_key(std::move(key));
  if (expected) req.set_expected_version(*expected);
  DeleteReply reply;
  Status st = co_await CallShard(ShardOf(req.key()),
                                 [&](KV::Stub& stub) { return stub.Delete(req, reply, options_); });
  if (!st.ok()) co_return st;
  co_return reply;
}

asio::awaitable<std::vector<Result<GetReply>>> ShardedClient::MultiGet(
    std::vector<std::string> keys) {
  std::vector<MultiGetRequest> reqs(shards_.size());
  std::vector<std::vector<size_t>> where(shards_.size());  // shard -> positions in `keys`
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t s = ShardOf(keys[i]);
    reqs[s].add_keys(std::move(keys[i]));
    where[s].push_back(i);
  }
  std::vector<Result<GetReply>> out(keys.size());
  co_await ForAll(shards_.size(), [&](size_t s) -> asio::awaitable<void> {
    if (where[s].empty()) co_return;
    MultiGetReply reply;
    Status st = co_await CallShard(
        s, [&](KV::Stub& stub) { return stub.MultiGet(reqs[s], reply, options_); });
    if (st.ok() && reply.results_size() != static_cast<int>(where[s].size())) {
      st = Named(
          s, Status(StatusCode::kInternal, "answered " + std::to_string(reply.results_size()) +
                                               " of " + std::to_string(where[s].size()) + " keys"));
    }
    for (size_t j = 0; j < where[s].size(); ++j) {
      if (st.ok()) {
        out[where[s][j]] = std::move(*reply.mutable_results(static_cast<int>(j)));
      } else {
        out[where[s][j]] = st;
      }
    }
  });
  co_return out;
}

asio::awaitable<Result<ScanReply>> ShardedClient::Scan(ScanRequest request) {
  const uint32_t limit = request.limit() == 0 ? 1000 : request.limit();
  request.set_limit(limit);
  std::vector<ScanReply> pages(shards_.size());
  Status first_error;
  co_await ForAll(shards_.size(), [&](size_t s) -> asio::awaitable<void> {
    Status st = co_await CallShard(
        s, [&](KV::Stub& stub) { return stub.Scan(request, pages[s], options_); });
    if (!st.ok() && first_error.ok()) first_error = st;
  });
  if (!first_error.ok()) co_return first_error;
  // Each shard returned the start of its part of the range. Merge them in key order, but only up
  // to the smallest last key of the shards that have more (a server may cap a page below our
  // limit): past it, that shard's unseen keys could come first.
  std::optional<std::string> bound;
  for (auto& p : pages) {
    if (p.more() && p.entries_size() > 0) {
      const std::string& last = p.entries().rbegin()->key();
      if (!bound || last < *bound) bound = last;
    }
  }
  ScanReply merged;
  std::vector<int> at(pages.size(), 0);
  bool more = false;
  for (;;) {
    int best = -1;
    for (size_t s = 0; s < pages.size(); ++s) {
      if (at[s] >= pages[s].entries_size()) continue;
      if (best < 0 || pages[s].entries(at[s]).key() < pages[best].entries(at[best]).key()) {
        best = static_cast<int>(s);
      }
    }
    if (best < 0) break;
    if (static_cast<uint32_t>(merged.entries_size()) == limit ||
        (bound && pages[best].entries(at[best]).key() > *bound)) {
      more = true;  // entries left over
      break;
    }
    *merged.add_entries() = std::move(*pages[best].mutable_entries(at[best]++));
  }
  for (auto& p : pages) more = more || p.more();
  merged.set_more(more);
  if (merged.entries_size() > 0) merged.set_continuation(merged.entries().rbegin()->key());
  co_return merged;
}

asio::awaitable<std::vector<Result<InfoReply>>> ShardedClient::Info() {
  std::vector<Result<InfoReply>> out(shards_.size());
  co_await ForAll(shards_.size(), [&](size_t s) -> asio::awaitable<void> {
    const InfoRequest req;  // outlives the call (a temporary would die before it is awaited)
    InfoReply reply;
    Status st =
        co_await CallShard(s, [&](KV::Stub& stub) { return stub.Info(req, reply, options_); });
    if (st.ok()) {
      out[s] = std::move(reply);
    } else {
      out[s] = st;
    }
  });
  co_return out;
}

}  // namespace kv

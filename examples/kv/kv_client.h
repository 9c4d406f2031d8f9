// A KV client over one or more servers. With several targets, keys are spread by consistent
// hashing (160 points per server on a 64-bit ring), so adding a server moves about 1/N of the
// keys; MultiGet splits by shard and Scan merges the shards' pages in key order.
//
// Threading: create and use it from coroutines on one executor (the channels live there).
// Errors: a failed call comes back as its Status, its message starting with the server it went
// to. A dead server costs only its own keys: Connect succeeds while at least one server answers;
// calls for keys on a server that is down fail at once with UNAVAILABLE naming it, and the
// client tries that server again (at most once a second) when one of its keys is next asked
// for. Scan needs every shard and fails with the first shard's error; MultiGet and Info answer
// per key and per server.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proto/kv.rdmarpc.pb.h"
#include "rpc/rdmarpc.h"

namespace kv {

class ShardedClient {
 public:
  // Connects to every target ("tcp://host:port" or "rdma://host:port") at once, from the current
  // executor. Fails (UNAVAILABLE, naming each server and why) only when none answers.
  static boost::asio::awaitable<rdmarpc::Result<std::unique_ptr<ShardedClient>>> Connect(
      std::vector<std::string> targets, rdmarpc::ChannelOptions options);
  // (An overload, not a default argument: GCC 12 destroys a coroutine's defaulted class-type
  // argument twice.)
  static boost::asio::awaitable<rdmarpc::Result<std::unique_ptr<ShardedClient>>> Connect(
      std::vector<std::string> targets) {
    return Connect(std::move(targets), rdmarpc::ChannelOptions{});
  }

  // Index into targets() of the server that owns `key`.
  size_t ShardOf(std::string_view key) const;
  const std::vector<std::string>& targets() const { return targets_; }

  boost::asio::awaitable<rdmarpc::Result<GetReply>> Get(std::string key);
  boost::asio::awaitable<rdmarpc::Result<PutReply>> Put(std::string key, std::string value,
                                                        std::optional<uint64_t> expected = {});
  boost::asio::awaitable<rdmarpc::Result<DeleteReply>> Delete(
      std::string key, std::optional<uint64_t> expected = {});
  // One result per key, in the order given: keys on a dead server fail, the others do not.
  boost::asio::awaitable<std::vector<rdmarpc::Result<GetReply>>> MultiGet(
      std::vector<std::string> keys);
  // One page of the range across all shards, in key order; `more`/`continuation` as for one
  // server.
  boost::asio::awaitable<rdmarpc::Result<ScanReply>> Scan(ScanRequest request);
  // Every server's Info (or why it is down), in targets() order.
  boost::asio::awaitable<std::vector<rdmarpc::Result<InfoReply>>> Info();

  // Why shard `s` is down (OK while it is connected): the last failed connect.
  const rdmarpc::Status& shard_down(size_t s) const { return shards_[s].down; }

  rdmarpc::CallOptions& call_options() { return options_; }

 private:
  struct Shard {
    std::string target;
    std::optional<KV::Stub> stub;  // empty while the server is down
    rdmarpc::Status down;          // why, while stub is empty
    std::chrono::steady_clock::time_point retry_at;
    bool connecting = false;
  };

  ShardedClient() = default;
  // Connects shard `s` (again); records why it failed.
  boost::asio::awaitable<void> ConnectShard(size_t s);
  // Shard s's stub, reconnecting first if it is down and its retry time has come; nullptr (and
  // `why` set to UNAVAILABLE naming the server) while it stays down.
  boost::asio::awaitable<KV::Stub*> StubFor(size_t s, rdmarpc::Status& why);
  // Runs `call(stub)` (one generated-stub call that fills its reply) on shard s: UNAVAILABLE
  // naming the server while it is down, and a failed call's Status named after it.
  template <class Call>
  boost::asio::awaitable<rdmarpc::Status> CallShard(size_t s, Call call);
  // `st` with the server's address in front of its message.
  rdmarpc::Status Named(size_t s, const rdmarpc::Status& st) const;

  std::vector<std::string> targets_;
  std::vector<Shard> shards_;
  std::vector<std::pair<uint64_t, size_t>> ring_;  // (point, shard), sorted
  rdmarpc::ChannelOptions channel_options_;
  rdmarpc::CallOptions options_;
};

// The 64-bit hash the ring uses (FNV-1a, then a finaliser that spreads similar keys apart).
uint64_t KeyHash(std::string_view bytes);

}  // namespace kv

// A KV client over one or more servers. With several targets, keys are spread by consistent
// hashing (160 points per server on a 64-bit ring), so adding a server moves about 1/N of the
// keys; MultiGet splits by shard and Scan merges the shards' pages in key order.
//
// Threading: create and use it from coroutines on one executor (the channels live there).
// Errors: a failed call comes back as its Status; a multi-shard call fails with the first
// shard's error.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proto/kv.rdmarpc.pb.h"
#include "rpc/rdmarpc.h"

namespace kv {

class ShardedClient {
 public:
  // Connects to every target ("tcp://host:port" or "rdma://host:port") from the current executor.
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
  // One result per key, in the order given.
  boost::asio::awaitable<rdmarpc::Result<std::vector<GetReply>>> MultiGet(
      std::vector<std::string> keys);
  // One page of the range across all shards, in key order; `more`/`continuation` as for one
  // server.
  boost::asio::awaitable<rdmarpc::Result<ScanReply>> Scan(ScanRequest request);
  // Every shard's Info, in targets() order.
  boost::asio::awaitable<rdmarpc::Result<std::vector<InfoReply>>> Info();

  rdmarpc::CallOptions& call_options() { return options_; }

 private:
  ShardedClient() = default;

  std::vector<std::string> targets_;
  std::vector<KV::Stub> stubs_;
  std::vector<std::pair<uint64_t, size_t>> ring_;  // (point, shard), sorted
  rdmarpc::CallOptions options_;
};

// The 64-bit hash the ring uses (FNV-1a, then a finaliser that spreads similar keys apart).
uint64_t KeyHash(std::string_view bytes);

}  // namespace kv

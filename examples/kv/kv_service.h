// The KV service: proto/kv.proto's methods over an Engine. The engine is not owned and must
// outlive the service; handlers run on the server's I/O threads and call the engine directly
// (its calls are short; a slow disk would call for a thread pool here).
#pragma once

#include <chrono>
#include <string>

#include "examples/kv/engine.h"
#include "proto/kv.rdmarpc.pb.h"

namespace kv {

class KvService final : public KV::Service {
 public:
  explicit KvService(Engine& engine, std::string data_dir = "")
      : engine_(engine), data_dir_(std::move(data_dir)) {}

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

  // Largest number of entries one Scan returns, whatever the request asks.
  static constexpr uint32_t kMaxScanLimit = 10000;

 private:
  Engine& engine_;
  std::string data_dir_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace kv

#include "examples/kv/kv_service.h"

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
  co_return Status();
}

boost::asio::awaitable<Status> KvService::Delete(ServerContext&, const DeleteRequest& req,
                                                 DeleteReply& reply) {
  std::optional<uint64_t> expected;
  if (req.has_expected_version()) expected = req.expected_version();
  auto existed = engine_.Delete(req.key(), expected);
  if (!existed.ok()) co_return existed.status();
  reply.set_existed(*existed);
  co_return Status();
}

boost::asio::awaitable<Status> KvService::MultiGet(ServerContext&, const MultiGetRequest& req,
                                                   MultiGetReply& reply) {
  for (const auto& key : req.keys()) {
    if (Status s = FillGet(engine_, key, *reply.add_results()); !s.ok()) co_return s;
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

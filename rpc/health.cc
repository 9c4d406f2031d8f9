#include "rpc/health.h"

namespace rdmarpc {

Status HealthService::Attach(Server& server) {
  if (Status s = server.AddService(*this); !s.ok()) return s;
  server.AddShutdownHook([this] { Shutdown(); });
  return Status();
}

void HealthService::SetServing(std::string_view service, bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  auto it = serving_.find(service);
  if (it == serving_.end()) {
    serving_.emplace(std::string(service), serving);
  } else {
    it->second = serving;
  }
}

void HealthService::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  for (auto& [name, serving] : serving_) serving = false;
}

boost::asio::awaitable<Status> HealthService::Check(ServerContext&,
                                                    const health::v1::HealthCheckRequest& request,
                                                    health::v1::HealthCheckResponse& reply) {
  bool serving;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = serving_.find(request.service());
    if (it == serving_.end()) {
      co_return Status(StatusCode::kNotFound,
                       "no health status for service '" + request.service() + "'");
    }
    serving = it->second;
  }
  reply.set_status(serving ? health::v1::HealthCheckResponse::SERVING
                           : health::v1::HealthCheckResponse::NOT_SERVING);
  co_return Status();
}

}  // namespace rdmarpc

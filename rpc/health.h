// HealthService: the built-in health service. The application says which of its services are
// serving; load balancers, orchestrators and `rdmarpc health TARGET [SERVICE]` ask.
//
//   rdmarpc::HealthService health;          // must outlive the server
//   health.Attach(server);                  // before Start(); "" (the server) is SERVING
//   health.SetServing("demo.Echo", true);   // any time, from any thread
//
// Shutdown: the moment Server::Shutdown begins, every status turns NOT_SERVING, and the server
// keeps serving for ServerOptions::shutdown_grace before it sends GOAWAY, so that whoever polls
// health stops sending here while calls still succeed.
//
// Threading: SetServing and Check may run on any threads at once (a mutex; health is not on the
// fast path). Errors: Check answers NOT_FOUND for a service never given a status.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "rpc/health.rdmarpc.pb.h"
#include "rpc/server.h"

namespace rdmarpc {

class HealthService final : public health::v1::Health::Service {
 public:
  // Adds this service to `server` ("rdmarpc.health.v1.Health") and turns every status
  // NOT_SERVING when the server starts shutting down. Fails as Server::AddService does.
  Status Attach(Server& server);

  // Sets `service`'s status ("" = the server as a whole). Ignored once shutting down: a server
  // that is going away never turns SERVING again.
  void SetServing(std::string_view service, bool serving);

  // Every known status NOT_SERVING, for good (called by the server when it shuts down).
  void Shutdown();

  boost::asio::awaitable<Status> Check(ServerContext& ctx,
                                       const health::v1::HealthCheckRequest& request,
                                       health::v1::HealthCheckResponse& reply) override;

 private:
  std::mutex mu_;
  std::map<std::string, bool, std::less<>> serving_{{"", true}};
  bool shutting_down_ = false;
};

}  // namespace rdmarpc

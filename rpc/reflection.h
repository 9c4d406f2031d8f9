// ReflectionService: the built-in reflection service. It tells tools which services a server
// hosts and hands out their .proto definitions (as FileDescriptorProtos), so that
// `rdmarpc list TARGET`, `rdmarpc describe TARGET SYMBOL` and `rdmarpc call TARGET METHOD JSON`
// work without the server's .proto files.
//
//   rdmarpc::ReflectionService reflection;   // must outlive the server
//   reflection.Attach(server);               // opt-in; any time before Start()
//
// What it serves: the services registered on the server (itself included) and the files they
// come from, with their imports; nothing else of the process. The definitions come from
// protobuf's generated descriptor pool, which every generated message registers itself in.
//
// Threading: calls may run on any I/O threads at once; they only read. Errors: NOT_FOUND for a
// symbol outside the hosted services' files.
#pragma once

#include "rpc/reflection.rdmarpc.pb.h"
#include "rpc/server.h"

namespace rdmarpc {

class ReflectionService final : public reflection::v1::Reflection::Service {
 public:
  // Adds this service to `server` ("rdmarpc.reflection.v1.Reflection"). Fails as
  // Server::AddService does.
  Status Attach(Server& server);

  boost::asio::awaitable<Status> ListServices(ServerContext& ctx,
                                              const reflection::v1::ListServicesRequest& request,
                                              reflection::v1::ListServicesResponse& reply) override;
  boost::asio::awaitable<Status> FileContainingSymbol(
      ServerContext& ctx, const reflection::v1::FileContainingSymbolRequest& request,
      reflection::v1::FileContainingSymbolResponse& reply) override;

 private:
  const Server* server_ = nullptr;
};

}  // namespace rdmarpc

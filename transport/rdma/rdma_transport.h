// RDMA transport (reliable-connected queue pairs over librdmacm).
#pragma once

#include "transport/transport.h"
#include "transport/uri.h"

namespace rdmarpc::transport::rdma {

// Succeeds when an RDMA device is usable, else says why not (for error messages).
Expected<void> DeviceAvailable();

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options);

boost::asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                                      Executor executor,
                                                                      const Options& options);

}  // namespace rdmarpc::transport::rdma

// TCP transport: the fallback where no RDMA device exists, and the baseline for every RDMA figure.
//
// Wire format: each message is a 4-byte little-endian length followed by that many bytes (see
// docs/PROTOCOL.md). Sockets use TCP_NODELAY; messages queued in one event-loop turn go out in
// one write; every complete message is parsed out of each read, in place.
#pragma once

#include "transport/tcp/reassembler.h"  // kLengthPrefixBytes
#include "transport/transport.h"
#include "transport/uri.h"

namespace rdmarpc::transport::tcp {

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options);

boost::asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                                      Executor executor,
                                                                      const Options& options);

}  // namespace rdmarpc::transport::tcp

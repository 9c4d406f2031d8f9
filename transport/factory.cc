#include "transport/factory.h"

#include "transport/inproc/inproc_transport.h"
#include "transport/poller.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/uri.h"

namespace rdmarpc::transport {

Expected<std::unique_ptr<Listener>> Listen(const std::string& uri,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options) {
  auto ep = ParseUri(uri);
  if (!ep.ok()) return ep.error();
  if (ep.value().scheme == Scheme::kRdma) {
    return rdma::Listen(ep.value(), executors, std::move(on_accept), options);
  }
  if (ep.value().scheme == Scheme::kInproc) {
    return inproc::Listen(ep.value(), executors, std::move(on_accept), options);
  }
  return tcp::Listen(ep.value(), executors, std::move(on_accept), options);
}

boost::asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const std::string& uri,
                                                                      Executor executor,
                                                                      const Options& options) {
  auto ep = ParseUri(uri);
  if (!ep.ok()) co_return ep.error();
  if (ep.value().scheme == Scheme::kRdma) {
    co_return co_await rdma::Connect(ep.value(), executor, options);
  }
  if (ep.value().scheme == Scheme::kInproc) {
    co_return co_await inproc::Connect(ep.value(), executor, options);
  }
  co_return co_await tcp::Connect(ep.value(), executor, options);
}

void RunEventLoop(boost::asio::io_context& ioc) { Poller::RunOwnLoop(ioc); }

}  // namespace rdmarpc::transport

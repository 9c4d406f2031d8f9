#include "transport/rdma/rdma_transport.h"

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>

namespace rdmarpc::transport::rdma {

std::string DeviceUnavailableReason() {
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    int err = errno;
    return std::string("no RDMA device present (ibv_get_device_list failed: ") +
           std::strerror(err) + "); use tcp:// or run inside the Soft-RoCE VM (tools/vm/rxe_vm.sh)";
  }
  ibv_free_device_list(list);
  if (n == 0) return "no RDMA device present (ibv_get_device_list found none); use tcp://";
  return "";
}

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint, const std::vector<Executor>&,
                                           AcceptHandler, const Options&) {
  std::string why = DeviceUnavailableReason();
  if (why.empty()) why = "the RDMA data path is not in this build yet";
  return Error{"rdma listen on " + endpoint.ToUri() + ": " + why};
}

boost::asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                                      Executor, const Options&) {
  std::string why = DeviceUnavailableReason();
  if (why.empty()) why = "the RDMA data path is not in this build yet";
  co_return Error{"rdma connect to " + endpoint.ToUri() + ": " + why};
}

}  // namespace rdmarpc::transport::rdma

// Move-only RAII owners for verbs and rdma_cm resources: every error path releases what it made;
// and the few system helpers the RDMA transport's files share.
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace rdmarpc::transport::rdma {

struct PdDeleter {
  void operator()(ibv_pd* p) const { ibv_dealloc_pd(p); }
};
struct CqDeleter {
  void operator()(ibv_cq* p) const { ibv_destroy_cq(p); }
};
struct CompChannelDeleter {
  void operator()(ibv_comp_channel* p) const { ibv_destroy_comp_channel(p); }
};
struct SrqDeleter {
  void operator()(ibv_srq* p) const { ibv_destroy_srq(p); }
};
struct MrDeleter {
  void operator()(ibv_mr* p) const { ibv_dereg_mr(p); }
};
struct MwDeleter {
  void operator()(ibv_mw* p) const { ibv_dealloc_mw(p); }
};
struct EventChannelDeleter {
  void operator()(rdma_event_channel* p) const { rdma_destroy_event_channel(p); }
};
struct CmIdDeleter {
  void operator()(rdma_cm_id* id) const {
    if (id->qp) rdma_destroy_qp(id);
    rdma_destroy_id(id);
  }
};
struct CmEventAcker {
  void operator()(rdma_cm_event* e) const { rdma_ack_cm_event(e); }
};

using Pd = std::unique_ptr<ibv_pd, PdDeleter>;
using Cq = std::unique_ptr<ibv_cq, CqDeleter>;
using CompChannel = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;
using Srq = std::unique_ptr<ibv_srq, SrqDeleter>;
using Mr = std::unique_ptr<ibv_mr, MrDeleter>;
using Mw = std::unique_ptr<ibv_mw, MwDeleter>;
using EventChannel = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;
using CmId = std::unique_ptr<rdma_cm_id, CmIdDeleter>;
using CmEvent = std::unique_ptr<rdma_cm_event, CmEventAcker>;

// Page-aligned memory for registration.
struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte, AlignedFree>;

// `bytes` of zeroed, page-aligned memory; null when out of memory.
inline AlignedBuffer AllocAligned(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) return nullptr;
  std::memset(p, 0, bytes);
  return AlignedBuffer(static_cast<std::byte*>(p));
}

// For the completion and CM event channels, whose fds Asio waits on.
inline bool SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// "what: <strerror(errno)>", for errors of calls that set errno.
inline std::string Errno(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// The same for a failed ibv_reg_mr, with the usual cause named: registering pins the memory,
// and a process without CAP_IPC_LOCK may pin no more than its RLIMIT_MEMLOCK (`ulimit -l`; a
// few MiB by default on many distributions, where the kernel then says ENOMEM or EPERM).
inline std::string RegisterErrno(const char* what) {
  const int e = errno;
  std::string m = Errno(what);
  if (e == ENOMEM || e == EPERM) {
    m += " (registering pins memory: is the locked-memory limit, `ulimit -l` or systemd's "
         "LimitMEMLOCK, too low for RDMA?)";
  }
  return m;
}

}  // namespace rdmarpc::transport::rdma

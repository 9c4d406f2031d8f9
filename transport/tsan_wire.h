// ThreadSanitizer and the transports' trips through the kernel or the device. Two threads of
// one process that talk through a socket or an RDMA queue pair are ordered by the kernel: what
// one wrote before sending, the other may read after receiving. ThreadSanitizer learns that
// order only from the system calls it intercepts (it ties every socket send to every later
// socket receive through one object of its own), and the transports send and receive with raw
// system calls, io_uring and verbs, which it does not see: a handler's write that a test reads
// after its call returned was reported as a race. In TSan builds the transports say it
// themselves, the way its socket interceptors do: each send releases, each receive acquires,
// one object for all. In other builds these are empty.
#pragma once

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace rdmarpc::transport {

#if defined(__SANITIZE_THREAD__)
inline char tsan_wire;
inline void TsanSent() { __tsan_release(&tsan_wire); }
inline void TsanReceived() { __tsan_acquire(&tsan_wire); }
#else
inline void TsanSent() {}
inline void TsanReceived() {}
#endif

}  // namespace rdmarpc::transport

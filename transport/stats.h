// Process-wide transport counters for monitoring (rpc/metrics.h exports them): connections,
// RDMA ring occupancy, credit stalls, completion-queue polling and the time I/O threads spend
// polling or sleeping.
//
// Cost: each thread writes its own block of counters (relaxed load + store, no locked
// instruction, no shared cache line), so counting on the data path is a few instructions.
// Snapshot() sums the blocks of the live threads and what exited threads left behind; it takes
// a mutex and is for scrapes, not for the data path.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rdmarpc::transport {

enum class Stat : int {
  kTcpConnectionsOpened,  // connection objects created (accepted or connected)
  kTcpConnectionsClosed,  // ... and destroyed
  kRdmaConnectionsOpened,
  kRdmaConnectionsClosed,
  kInprocConnectionsOpened,
  kInprocConnectionsClosed,
  // Bytes reserved in peers' receive rings (records written, wrap-around padding included) and
  // bytes the peers credited back: their difference is the rings' current occupancy.
  kRdmaRingBytesWritten,
  kRdmaRingBytesCredited,
  kRdmaCreditStalls,   // messages that found no ring credit (or send-queue room) and waited
  kRdmaCqPolls,        // ibv_poll_cq calls
  kRdmaCompletions,    // work completions taken
  kRdmaWakeups,        // returns from sleeping on a completion channel
  kRdmaBusyPollNanos,  // time spent busy-polling (Options::busy_poll)
  kRdmaSpinNanos,      // time spent in the adaptive polling window (Options::poll_spin_us)
  kRdmaSleepNanos,     // time spent waiting on the completion channel
  // Large messages whose buffer could not be registered (usually the locked-memory limit):
  // sent in chunks through the ring instead of by rendezvous, or read in pieces through a
  // bounce buffer.
  kRdmaUnregisteredSent,
  kRdmaUnregisteredReceived,
  // Listeners (TCP and RDMA): new connections turned away, and set-ups given up.
  kRefusedLimit,        // busy: the server's max_connections or max_connections_per_peer
  kRefusedHandshakes,   // turned away at twice Options::max_handshakes
  kRefusedDescriptors,  // busy: the process was out of descriptors (TCP's reserve)
  kHandshakesGivenUp,   // set-ups given up for newer ones at Options::max_handshakes
  kCount
};

using StatValues = std::array<uint64_t, static_cast<size_t>(Stat::kCount)>;

namespace internal {
// This thread's counters: null until the thread first counts. A trivial thread_local, so that
// reading it is one load (the block itself has a constructor and destructor, and each access to
// such a thread_local goes through a call and an initialisation check: an RDMA call counts
// about eight times per side, and an out-of-line Count cost ~110 instructions per call).
inline thread_local std::atomic<uint64_t>* t_counters = nullptr;
// Creates and registers this thread's block and returns its counters.
std::atomic<uint64_t>* AttachThreadCounters();
}  // namespace internal

// Adds `n` to this thread's counter `s`. Any thread.
inline void Count(Stat s, uint64_t n = 1) {
  std::atomic<uint64_t>* v = internal::t_counters;
  if (v == nullptr) v = internal::AttachThreadCounters();
  auto& c = v[static_cast<size_t>(s)];
  // One writer: no read-modify-write instruction needed.
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// Every counter summed over all threads, past and present. Any thread.
StatValues Snapshot();

inline uint64_t Get(const StatValues& v, Stat s) { return v[static_cast<size_t>(s)]; }

}  // namespace rdmarpc::transport

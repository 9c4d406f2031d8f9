// The RDMA transport's sizes and limits, in one place: what a connection pins, how deep its
// queues are, how the I/O thread polls. Changing a size here changes memory per connection
// (docs/BENCHMARKS.md) and, for kRingBytes, what a peer accepts (docs/PROTOCOL.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmarpc::transport::rdma {

// Each connection's receive ring, and its send staging buffer of the same size while it sends
// (kStagingSweepMs): 32 KiB pinned per idle connection, 64 KiB per busy one. Small messages (a
// record is at most a quarter of the ring, 8 KiB) go through the ring; larger ones by
// rendezvous (see Expose), so the ring need not hold a bulk pipeline. (It was 1 MiB, 2 MiB per
// connection: 350 idle connections filled a 2 GiB guest.)
inline constexpr uint32_t kRingBytes = 32u << 10;
// Large messages a connection may have exposed at once (its peer reads them in order).
inline constexpr uint32_t kMaxRendezvous = 4;
// Bytes a connection reads ahead of the message it is delivering: a further large message is
// fetched while earlier ones are in flight only within this budget (the first always is).
inline constexpr uint64_t kFetchAheadBytes = 8u << 20;
// Registered buffers for large messages come in powers of two from this size, and each I/O
// thread keeps up to kBulkCacheBytes of freed ones registered for reuse (a registration cache:
// a steady stream of large messages registers nothing after warm-up).
inline constexpr size_t kBulkMinBytes = 16u << 10;
inline constexpr size_t kBulkCacheBytes = 64u << 20;
// A receiver that cannot register a buffer for a whole large message (registration pins memory,
// and a process without CAP_IPC_LOCK may pin only RLIMIT_MEMLOCK) reads it in pieces of this
// size, or of kBulkMinBytes if even that fails, through a registered bounce buffer.
inline constexpr size_t kBounceBytes = 1u << 20;
// Send work requests kept free for control messages (credits, FINs, reads, invalidations):
// data records and rendezvous stop short of them.
inline constexpr uint32_t kControlReserve = 16;
// A signaled send's wr_id: bits 0-31 how many sends it retires, 32-39 a tag saying what else
// its completion means, 40-47 the rendezvous slot.
inline constexpr uint64_t kTagRead = 1;        // our RDMA READ of the peer's message finished
inline constexpr uint64_t kTagInvalidate = 2;  // the window over our exposed message is invalid
// The tag and slot bits of a signaled send's wr_id (PostSend adds the count).
inline constexpr uint64_t WrTag(uint64_t tag, uint32_t slot) {
  return (tag << 32) | (uint64_t(slot) << 40);
}
// Receives kept posted in each I/O thread's shared receive queue (SRQ), for all its connections.
// An RDMA_WRITE_WITH_IMM consumes one; they are reposted as completions are polled. A per-QP
// receive queue deep enough for a full ring of small records (16k) made every closing connection
// flush 16k completions into the thread's CQ, and two at once overflowed it (rxe: 32767 CQEs),
// which put every other QP on that CQ into error.
inline constexpr uint32_t kSrqDepth = 8192;
// Consumed receives are reposted this many at a time (one ibv_post_srq_recv with a chain),
// not one by one as they complete: at one call at a time, reposting each receive alone cost
// ~140 instructions per message. The SRQ runs at most this many short of its depth.
inline constexpr uint32_t kSrqRepostBatch = 32;
// Send work requests a connection may have outstanding. Chunks are up to a quarter of the ring,
// so a few suffice for bulk; 256 keeps 256 small records in flight.
inline constexpr uint32_t kSendDepth = 256;
// wr_id of every receive; sends carry small counts (see PostWrite), so the two never collide.
// (A completion's opcode is undefined when its status is an error; wr_id is not.)
inline constexpr uint64_t kRecvWrId = ~uint64_t(0);
// Send staging buffers come from registered slabs of this many.
inline constexpr uint32_t kSendBuffersPerSlab = 8;
// A connection takes its send staging buffer when it first writes a record, and gives it back
// once it has written none for a while: each I/O thread that has buffers out looks at its
// connections this often (ThreadDevice::Sweep), and one that wrote nothing since the last look
// retires its writes (a signaled no-op, if any are unretired) and then returns the buffer. An
// idle connection then pins only its receive ring; a thread whose connections all went quiet
// stops looking (no timer while nothing is out, so an idle server stays asleep).
inline constexpr int kStagingSweepMs = 1000;
// A write with a credit of 0 bytes is a no-op for the receiver: a sender posts one, signaled, to
// retire its unsignaled writes (at most once per kStagingSweepMs, and once as it closes). Such
// writes take no room in the ring, so credit does not hold them back -- the only writes a peer
// could make without bound -- yet each takes a receive from the I/O thread's shared queue and a
// completion the thread handles in turn with every other connection's. One raw verbs client
// in the emulated guest kept a server's I/O thread 100% busy with 30,000-50,000 a second
// (records are held to a ring's worth per connection, so no peer can take more than that of
// the shared receives while the thread is busy elsewhere; no-ops could take them all). So each
// connection takes at most kNoopBurst of them at once, plus one per kNoopRefillMs, and closes
// on the next.
inline constexpr uint32_t kNoopBurst = 64;
inline constexpr int kNoopRefillMs = 100;
// Selective signaling: one signaled send per this many.
inline constexpr uint32_t kSignalEvery = 32;
// Completions taken from one CQ before the I/O thread runs its other queued work. Polling until
// the CQ is empty starved that work while a fast peer kept the CQ busy: each finished call's
// coroutine frame waited in the queue, and a 1 M-call soak grew the server's heap by hundreds
// of MiB (docs/RELIABILITY.md, "Soak").
inline constexpr uint32_t kPollBudget = 256;
// Busy-poll and adaptive spinning: how long the thread polls its CQs per turn of the event loop
// before it lets its other work run (and, spinning, yields the CPU), unless a poll takes
// something first; the clock is read every kSpinBurst empty polls. A turn -- a posted handler,
// the scheduler's round with Asio's non-blocking epoll_wait, and while spinning a sched_yield --
// costs system calls, and a completion that lands during them waits for the next burst. With
// bursts of 16 polls (tens of instructions each) a turn was mostly those calls: in the emulated
// guest, 64 B p50 busy-poll 46.3 us and adaptive 51.0 us; with 20 us bursts 42.8 and 43.3 us
// (5 interleaved rounds in one boot, ib_write_lat 21.1 us; 5 us bursts: 44.8 / 50.7, 50 us:
// 42.2 / 42.8). Bounded, so that timers and descriptors of the thread wait at most a burst;
// work posted from another thread ends a burst at once (ThreadDevice::PollBurst).
inline constexpr uint32_t kSpinBurst = 16;
inline constexpr uint64_t kSpinBurstNs = 20'000;
inline constexpr int kResolveTimeoutMs = 2000;
// How long a server waits, at least, for the CM's ESTABLISHED after accepting. The wait ends at
// once if the client goes away (the CM reports that too), so a long one costs nothing with
// live clients; a short one cost clients: when 100 connect at once, this server's own event
// loop can take seconds to get to an ESTABLISHED, and a server that gave up first destroyed
// the QP under a client that was just finishing, which saw RDMA_CM_EVENT_CONNECT_ERROR (the
// "100 connections at once" flake: with the wait cut to 300 ms, 113 give-ups, 113
// CONNECT_ERRORs).
inline constexpr int kEstablishWaitMinMs = 30000;
// What one message waiting for credit costs beyond its bytes (its vector, the deque slot, the
// allocator's header), counted in queued_send_bytes() so that a flood of tiny messages (PONGs)
// is charged for the memory it really takes.
inline constexpr size_t kPendingOverheadBytes = 64;

}  // namespace rdmarpc::transport::rdma

// RDMA transport: reliable-connected QPs set up with librdmacm; each side writes records into the
// other's pre-registered receive ring with RDMA_WRITE_WITH_IMM. See ring.h for the credit rules
// and docs/PROTOCOL.md for the bytes.
//
// Threading: a connection, its QP and its CM event channel live on one I/O thread. Each
// (I/O thread, device) pair has CQs on one completion channel, polled adaptively (see
// ThreadDevice::Spin), busy-polled, or only on the channel's events. Nothing here takes a lock.
#include "transport/rdma/rdma_transport.h"

#include <endian.h>
#include <fcntl.h>
#include <sched.h>
#include <spdlog/spdlog.h>

#include <array>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <unordered_map>

#include "transport/handler_slot.h"
#include "transport/handshake.h"
#include "transport/rdma/ring.h"
#include "transport/rdma/start_gate.h"
#include "transport/rdma/verbs.h"
#include "transport/stats.h"

namespace rdmarpc::transport::rdma {
namespace asio = boost::asio;

std::string DeviceUnavailableReason() {
  int n = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) {
    int err = errno;
    return std::string("no RDMA device present (ibv_get_device_list: ") + std::strerror(err) +
           "); use tcp://, or run inside the Soft-RoCE VM (tools/vm/rxe_vm.sh)";
  }
  ibv_free_device_list(list);
  if (n == 0) return "no RDMA device present (ibv_get_device_list found none); use tcp://";
  return "";
}

namespace {

// --- tunables ------------------------------------------------------------------------------
// Each connection's receive ring, and its send staging buffer of the same size: 64 KiB pinned
// per connection. Small messages (a record is at most a quarter of the ring, 8 KiB) go through
// the ring; larger ones by rendezvous (see Expose), so the ring need not hold a bulk pipeline.
// (It was 1 MiB, 2 MiB per connection: 350 idle connections filled a 2 GiB guest.)
constexpr uint32_t kRingBytes = 32u << 10;
// Record header inside the ring: u32 total message bytes, u32 kind.
constexpr uint32_t kRecordHeaderBytes = 8;
// Record kinds. A rendezvous record's body: u64 address, u32 rkey, u32 slot of a message of
// `total` bytes the peer may RDMA READ (once) from the sender's memory.
constexpr uint32_t kRecordData = 0;
constexpr uint32_t kRecordRendezvous = 1;
constexpr uint32_t kRendezvousBodyBytes = 16;
// Large messages a connection may have exposed at once (its peer reads them in order).
constexpr uint32_t kMaxRendezvous = 4;
// Bytes a connection reads ahead of the message it is delivering: a further large message is
// fetched while earlier ones are in flight only within this budget (the first always is).
constexpr uint64_t kFetchAheadBytes = 8u << 20;
// Registered buffers for large messages come in powers of two from this size, and each I/O
// thread keeps up to kBulkCacheBytes of freed ones registered for reuse (a registration cache:
// a steady stream of large messages registers nothing after warm-up).
constexpr size_t kBulkMinBytes = 16u << 10;
constexpr size_t kBulkCacheBytes = 64u << 20;
// Send work requests kept free for control messages (credits, FINs, reads, invalidations):
// data records and rendezvous stop short of them.
constexpr uint32_t kControlReserve = 16;
// A signaled send's wr_id: bits 0-31 how many sends it retires, 32-39 a tag saying what else
// its completion means, 40-47 the rendezvous slot.
constexpr uint64_t kTagRead = 1;        // our RDMA READ of the peer's message finished
constexpr uint64_t kTagInvalidate = 2;  // the window over our exposed message is invalid
// The tag and slot bits of a signaled send's wr_id (PostSend adds the count).
constexpr uint64_t WrTag(uint64_t tag, uint32_t slot) {
  return (tag << 32) | (uint64_t(slot) << 40);
}
// Receives kept posted in each I/O thread's shared receive queue (SRQ), for all its connections.
// An RDMA_WRITE_WITH_IMM consumes one; they are reposted as completions are polled. A per-QP
// receive queue deep enough for a full ring of small records (16k) made every closing connection
// flush 16k completions into the thread's CQ, and two at once overflowed it (rxe: 32767 CQEs),
// which put every other QP on that CQ into error.
constexpr uint32_t kSrqDepth = 8192;
// Send work requests a connection may have outstanding. Chunks are up to a quarter of the ring,
// so a few suffice for bulk; 256 keeps 256 small records in flight.
constexpr uint32_t kSendDepth = 256;
// wr_id of every receive; sends carry small counts (see PostWrite), so the two never collide.
// (A completion's opcode is undefined when its status is an error; wr_id is not.)
constexpr uint64_t kRecvWrId = ~uint64_t(0);
// Send staging buffers come from registered slabs of this many.
constexpr uint32_t kSendBuffersPerSlab = 8;
// Selective signaling: one signaled send per this many.
constexpr uint32_t kSignalEvery = 32;
// Completions taken from one CQ before the I/O thread runs its other queued work. Polling until
// the CQ is empty starved that work while a fast peer kept the CQ busy: each finished call's
// coroutine frame waited in the queue, and a 1 M-call soak grew the server's heap by hundreds
// of MiB (docs/RELIABILITY.md, "Soak").
constexpr uint32_t kPollBudget = 256;
constexpr int kResolveTimeoutMs = 2000;
// How long a server waits, at least, for the CM's ESTABLISHED after accepting. The wait ends at
// once if the client goes away (the CM reports that too), so a long one costs nothing with
// live clients; a short one cost clients: when 100 connect at once, this server's own event
// loop can take seconds to get to an ESTABLISHED, and a server that gave up first destroyed
// the QP under a client that was just finishing, which saw RDMA_CM_EVENT_CONNECT_ERROR (the
// "100 connections at once" flake: with the wait cut to 300 ms, 113 give-ups, 113
// CONNECT_ERRORs).
constexpr int kEstablishWaitMinMs = 30000;
// What one message waiting for credit costs beyond its bytes (its vector, the deque slot, the
// allocator's header), counted in queued_send_bytes() so that a flood of tiny messages (PONGs)
// is charged for the memory it really takes.
constexpr size_t kPendingOverheadBytes = 64;
// What each side tells the other in the CM private data (a handshake Hello): where its receive
// ring is, and from a client, the authentication token.
struct RingDescriptor {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t bytes = 0;
};

// A HELLO carrying `d` (and whatever authentication fields `h` already has).
Hello WithRing(Hello h, const RingDescriptor& d) {
  h.ring_addr = d.addr;
  h.ring_rkey = d.rkey;
  h.ring_bytes = d.bytes;
  return h;
}

// Returns an empty string and fills `d` (and `hello`, when given), or says why the bytes are not
// a valid descriptor.
std::string DecodeDescriptor(const void* data, size_t len, RingDescriptor* d,
                             Hello* hello = nullptr) {
  Hello h;
  if (std::string err = DecodeHello(data, len, &h); !err.empty()) return err;
  d->addr = h.ring_addr;
  d->rkey = h.ring_rkey;
  d->bytes = h.ring_bytes;
  // A sender stages each record at the same offset as in the peer's ring, so it can write into a
  // ring no larger than its own staging buffer (kRingBytes).
  if (d->bytes < 4096 || d->bytes % kRecordAlignBytes != 0 || d->bytes > kRingBytes) {
    return "peer ring size " + std::to_string(d->bytes) + " is not usable (4 KiB to " +
           std::to_string(kRingBytes >> 10) + " KiB, a multiple of 64)";
  }
  if (hello) *hello = h;
  return "";
}

uint32_t RandomByte() {
  static thread_local std::mt19937 rng(std::random_device{}());
  return rng() & 0xff;
}

bool SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

AlignedBuffer AllocAligned(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) return nullptr;
  std::memset(p, 0, bytes);
  return AlignedBuffer(static_cast<std::byte*>(p));
}

class RdmaConnection;

// Per I/O thread and device: the PD, one completion channel whose fd Asio waits on, one SRQ and
// one or more CQs. A CQ takes connections only while the worst case fits in it: every SRQ receive
// completed into it plus every connection's send queue flushed into it at once. Past that a new
// CQ is created on the same channel, so the number of connections is not bounded by max_cqe.
class ThreadDevice : public std::enable_shared_from_this<ThreadDevice> {
 public:
  struct CqSlot {
    Cq cq;
    unsigned unacked = 0;  // events taken with ibv_get_cq_event but not yet acknowledged
    unsigned conns = 0;
    bool evented = false;
  };

  // The device state of the I/O thread that runs `ex`, created on first use. Call on that thread.
  // The first connection or listener on the thread sets its polling (Options::busy_poll and
  // poll_spin_us); later ones share it.
  static Expected<std::shared_ptr<ThreadDevice>> For(const Executor& ex, ibv_context* verbs,
                                                     const Options& options);

  ~ThreadDevice() {
    Detach();
    for (auto& slot : cqs_) {
      if (slot->unacked) ibv_ack_cq_events(slot->cq.get(), slot->unacked);
    }
  }

  // Stops waiting on the completion fd; for when the io_context goes away first.
  void Detach() {
    if (fd_.is_open()) fd_.release();
  }

  ibv_pd* pd() const { return pd_.get(); }
  ibv_srq* srq() const { return srq_.get(); }
  // Whether rings can be exposed through type-2 memory windows (bound to one QP each).
  bool qp_bound_windows() const { return mw_type2_; }

  // A CQ with room for one more connection whose send queue holds `send_depth` requests.
  Expected<CqSlot*> AcquireCq(uint32_t send_depth) {
    const unsigned per_cq = std::max<unsigned>(1, (cqe_ - srq_depth_) / send_depth);
    for (auto& slot : cqs_) {
      if (slot->conns < per_cq) {
        ++slot->conns;
        return slot.get();
      }
    }
    auto slot = std::make_unique<CqSlot>();
    slot->cq.reset(ibv_create_cq(verbs_, cqe_, nullptr, channel_.get(), 0));
    if (!slot->cq) return Error{Errno("ibv_create_cq")};
    if (ibv_req_notify_cq(slot->cq.get(), 0)) return Error{Errno("ibv_req_notify_cq")};
    slot->conns = 1;
    cqs_.push_back(std::move(slot));
    return cqs_.back().get();
  }
  void ReleaseCq(CqSlot* slot) { --slot->conns; }

  // A connection's send staging buffer (kRingBytes), carved from slabs this thread registered
  // once with local access only: connecting costs no registration for it, and the peer cannot
  // touch it. Slabs are kept until the thread's device state goes; buffers are reused.
  struct SendBuffer {
    std::byte* data = nullptr;
    uint32_t lkey = 0;
  };
  Expected<SendBuffer> AcquireSendBuffer() {
    if (free_send_.empty()) {
      Slab slab;
      slab.mem = AllocAligned(size_t(kSendBuffersPerSlab) * kRingBytes);
      if (!slab.mem) return Error{"out of memory for send buffers"};
      slab.mr.reset(ibv_reg_mr(pd_.get(), slab.mem.get(), size_t(kSendBuffersPerSlab) * kRingBytes,
                               IBV_ACCESS_LOCAL_WRITE));
      if (!slab.mr) return Error{Errno("ibv_reg_mr (send slab)")};
      for (uint32_t i = 0; i < kSendBuffersPerSlab; ++i) {
        free_send_.push_back({slab.mem.get() + size_t(i) * kRingBytes, slab.mr->lkey});
      }
      slabs_.push_back(std::move(slab));
    }
    SendBuffer b = free_send_.back();
    free_send_.pop_back();
    return b;
  }
  // Only once the QP that used `b` is destroyed.
  void ReleaseSendBuffer(SendBuffer b) { free_send_.push_back(b); }

  // A registered buffer for one large message: serialized into on the sending side and exposed
  // to the peer through a memory window, or RDMA-READ into on the receiving side. Registered
  // with local access only (and MW_BIND, so that a window bound to one QP can expose it).
  struct BulkBuffer {
    AlignedBuffer mem;
    Mr mr;  // declared after mem: deregistered before it is freed
    size_t capacity = 0;
    std::byte* data() const { return mem.get(); }
    explicit operator bool() const { return mem != nullptr; }
  };
  // The size class of `bytes` (0 for up to kBulkMinBytes, doubling after) and its capacity.
  static size_t BulkClass(size_t bytes, size_t* capacity) {
    size_t cls = 0;
    while ((kBulkMinBytes << cls) < bytes) ++cls;
    *capacity = kBulkMinBytes << cls;
    return cls;
  }
  // One of at least `bytes`, from the cache when one of its size class is free.
  Expected<BulkBuffer> AcquireBulk(size_t bytes) {
    size_t cap = 0;
    const size_t cls = BulkClass(bytes, &cap);
    if (cls < bulk_free_.size() && !bulk_free_[cls].empty()) {
      BulkBuffer b = std::move(bulk_free_[cls].back());
      bulk_free_[cls].pop_back();
      bulk_cached_ -= cap;
      return b;
    }
    BulkBuffer b;
    void* p = nullptr;
    if (posix_memalign(&p, 4096, cap) != 0) return Error{"out of memory for a large message"};
    b.mem.reset(static_cast<std::byte*>(p));
    b.mr.reset(ibv_reg_mr(pd_.get(), p, cap,
                          IBV_ACCESS_LOCAL_WRITE | (mw_type2_ ? IBV_ACCESS_MW_BIND : 0)));
    if (!b.mr) return Error{Errno("ibv_reg_mr (large message)")};
    b.capacity = cap;
    return b;
  }
  // Only once no QP can touch `b` any more (its window invalidated, its read finished, or the
  // QP destroyed). Kept registered while the cache has room, else deregistered and freed.
  void ReleaseBulk(BulkBuffer b) {
    if (!b || bulk_cached_ + b.capacity > kBulkCacheBytes) return;
    size_t cap = 0;
    const size_t cls = BulkClass(b.capacity, &cap);
    if (bulk_free_.size() <= cls) bulk_free_.resize(cls + 1);
    bulk_cached_ += b.capacity;
    bulk_free_[cls].push_back(std::move(b));
  }

  // RDMA READs a connection may have outstanding, and serve, at once (CM conn_param).
  uint8_t rd_atom() const { return rd_atom_; }

  void Register(uint32_t qp_num, std::weak_ptr<RdmaConnection> c) { by_qp_[qp_num] = std::move(c); }
  void Unregister(uint32_t qp_num) { by_qp_.erase(qp_num); }

 private:
  ThreadDevice(const Executor& ex, ibv_context* verbs, const Options& options)
      : ex_(ex),
        verbs_(verbs),
        fd_(ex),
        busy_poll_(options.busy_poll),
        spin_window_(std::chrono::microseconds(std::max(0, options.poll_spin_us))) {}

  std::string Init() {
    ibv_device_attr attr{};
    if (ibv_query_device(verbs_, &attr)) return Errno("ibv_query_device");
    rd_atom_ = static_cast<uint8_t>(std::max(
        1, std::min<int>({int(kMaxRendezvous), attr.max_qp_rd_atom, attr.max_qp_init_rd_atom})));
    mw_type2_ = (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0 && attr.max_mw > 0 &&
                std::getenv("RDMARPC_NO_MEMORY_WINDOWS") == nullptr;
    if (!mw_type2_) {
      spdlog::warn(
          "rdma: memory windows off on {} (the device has no type-2 windows, or "
          "RDMARPC_NO_MEMORY_WINDOWS is set): each receive ring is protected by its rkey alone, "
          "which any connection of the same I/O thread could use",
          ibv_get_device_name(verbs_->device));
    }
    pd_.reset(ibv_alloc_pd(verbs_));
    if (!pd_) return Errno("ibv_alloc_pd");
    channel_.reset(ibv_create_comp_channel(verbs_));
    if (!channel_) return Errno("ibv_create_comp_channel");
    cqe_ = static_cast<uint32_t>(std::min(attr.max_cqe, 65535));
    srq_depth_ = std::min<uint32_t>({kSrqDepth, static_cast<uint32_t>(attr.max_srq_wr), cqe_ / 2});
    if (srq_depth_ == 0) return "the RDMA device supports no shared receive queue";
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = srq_depth_;
    sa.attr.max_sge = 1;
    srq_.reset(ibv_create_srq(pd_.get(), &sa));
    if (!srq_) return Errno("ibv_create_srq");
    if (!PostReceives(srq_depth_)) return Errno("ibv_post_srq_recv");
    if (!SetNonBlocking(channel_->fd)) return Errno("fcntl");
    boost::system::error_code ec;
    fd_.assign(channel_->fd, ec);
    if (ec) return "assign completion fd: " + ec.message();
    return "";
  }

  // Posts `n` zero-length receives (RDMA_WRITE_WITH_IMM needs a receive but no buffer) in
  // chains of up to 64, one doorbell each.
  bool PostReceives(uint32_t n) {
    ibv_recv_wr wrs[64];
    while (n > 0) {
      const uint32_t k = std::min<uint32_t>(n, 64);
      for (uint32_t i = 0; i < k; ++i) {
        wrs[i] = ibv_recv_wr{};
        wrs[i].wr_id = kRecvWrId;
        wrs[i].num_sge = 0;
        wrs[i].next = i + 1 < k ? &wrs[i + 1] : nullptr;
      }
      ibv_recv_wr* bad = nullptr;
      if (ibv_post_srq_recv(srq_.get(), wrs, &bad)) return false;
      n -= k;
    }
    return true;
  }

  // Starts the thread's polling: a busy-poll loop, or a wait on the completion channel.
  void Arm() {
    if (busy_poll_) {
      std::weak_ptr<ThreadDevice> weak = shared_from_this();
      asio::post(ex_, [weak] {
        if (auto self = weak.lock()) {
          self->PollAll();
          self->CountTime(Stat::kRdmaBusyPollNanos, std::chrono::steady_clock::now());
          self->Arm();
        }
      });
      return;
    }
    Sleep();
  }

  // Waits for the completion channel. Every CQ is armed (ibv_req_notify_cq) while this waits.
  void Sleep() {
    std::weak_ptr<ThreadDevice> weak = shared_from_this();
    mark_ = std::chrono::steady_clock::now();
    fd_.async_wait(asio::posix::stream_descriptor::wait_read, [weak](boost::system::error_code ec) {
      if (ec) return;
      auto self = weak.lock();
      if (!self) return;
      Count(Stat::kRdmaWakeups);
      self->CountTime(Stat::kRdmaSleepNanos, std::chrono::steady_clock::now());
      self->TakeEventsAndRearm();
      self->DrainEvented();
    });
  }

  // Takes the channel's pending events (non-blocking) and re-arms the CQs that raised them, before
  // they are polled, so that a completion landing in between raises a new event. Marks them.
  void TakeEventsAndRearm() {
    ibv_cq* cq;
    void* ctx;
    while (ibv_get_cq_event(channel_.get(), &cq, &ctx) == 0) {
      for (auto& slot : cqs_) {
        if (slot->cq.get() != cq) continue;
        slot->evented = true;
        // Acknowledge in batches: each ack takes a mutex inside libibverbs.
        if (++slot->unacked >= 64) {
          ibv_ack_cq_events(cq, slot->unacked);
          slot->unacked = 0;
        }
      }
    }
    for (auto& slot : cqs_) {
      if (slot->evented) ibv_req_notify_cq(slot->cq.get(), 0);
    }
  }

  // Adaptive polling. Once the CQs are drained, the thread keeps polling them from posted
  // handlers (so its other work runs in between) for spin_window_ after the last completion,
  // and only then goes back to sleeping on the channel: a request-reply exchange whose answer
  // comes within the window costs no wake-up (an event, an epoll return and a re-arm on each
  // side, the bulk of a small call's latency in events mode), while an idle thread sleeps.
  // CQs stay armed while spinning, so each raises at most one event meanwhile; those are taken
  // when the window closes.
  void StartSpin() {
    mark_ = std::chrono::steady_clock::now();
    spin_until_ = mark_ + spin_window_;
    PostSpin();
  }
  void PostSpin() {
    std::weak_ptr<ThreadDevice> weak = shared_from_this();
    asio::post(ex_, [weak] {
      if (auto self = weak.lock()) self->Spin();
    });
  }
  void Spin() {
    uint32_t taken = PollAll();
    auto now = std::chrono::steady_clock::now();
    CountTime(Stat::kRdmaSpinNanos, now);
    if (taken) spin_until_ = now + spin_window_;
    if (now < spin_until_) {
      // Found nothing: let any other runnable thread on this CPU go first. When threads
      // outnumber cores, the one that will produce the awaited completion (the peer in the same
      // process or machine) may be waiting for this very CPU; spinning through a time slice
      // cost milliseconds per message in a 2-vCPU guest.
      if (!taken) sched_yield();
      PostSpin();
      return;
    }
    // The window closed: re-arm what raised events while spinning, then poll once more, so
    // that nothing that completed before the arming is left waiting for an event.
    TakeEventsAndRearm();
    for (auto& slot : cqs_) slot->evented = false;
    if (PollAll()) {
      spin_until_ = now + spin_window_;
      PostSpin();
      return;
    }
    Sleep();
  }

  // Polls the CQs that had an event. A CQ that still has completions after its budget stays
  // marked and is polled again from a posted handler, so that the work those completions
  // started (handler coroutines finishing, replies, timers) runs in between; only when every CQ
  // is drained does the thread go back to waiting on the completion channel.
  void DrainEvented() {
    bool more = false;
    for (auto& slot : cqs_) {
      if (!slot->evented) continue;
      slot->evented = Poll(slot->cq.get()) >= kPollBudget;
      more = more || slot->evented;
    }
    if (!more) {
      if (spin_window_.count() > 0) {
        StartSpin();
      } else {
        Sleep();
      }
      return;
    }
    std::weak_ptr<ThreadDevice> weak = shared_from_this();
    asio::post(ex_, [weak] {
      if (auto self = weak.lock()) self->DrainEvented();
    });
  }

  // Takes up to kPollBudget completions from `cq` and returns how many: kPollBudget means some
  // may be left.
  uint32_t Poll(ibv_cq* cq);
  // Adds the time since mark_ to `s` and moves mark_ to `now`.
  void CountTime(Stat s, std::chrono::steady_clock::time_point now) {
    Count(s, static_cast<uint64_t>(std::chrono::nanoseconds(now - mark_).count()));
    mark_ = now;
  }
  // Polls every CQ once (up to kPollBudget each); returns how many completions it took.
  uint32_t PollAll() {
    uint32_t taken = 0;
    for (auto& slot : cqs_) taken += Poll(slot->cq.get());
    return taken;
  }

  Executor ex_;
  ibv_context* verbs_;
  // Declaration order is destruction order reversed: CQs and SRQ before the channel and the PD.
  Pd pd_;
  CompChannel channel_;
  Srq srq_;
  std::vector<std::unique_ptr<CqSlot>> cqs_;
  struct Slab {
    AlignedBuffer mem;
    Mr mr;  // declared after mem: deregistered before it is freed
  };
  std::vector<Slab> slabs_;
  std::vector<SendBuffer> free_send_;
  std::vector<std::vector<BulkBuffer>> bulk_free_;  // by size class
  size_t bulk_cached_ = 0;
  uint32_t cqe_ = 0, srq_depth_ = 0;
  uint8_t rd_atom_ = 1;
  bool mw_type2_ = false;
  asio::posix::stream_descriptor fd_;
  bool busy_poll_;
  std::chrono::nanoseconds spin_window_;
  std::chrono::steady_clock::time_point spin_until_{};
  // Where the time accounting (CountTime) last stopped: busy-poll, spin or sleep started there.
  std::chrono::steady_clock::time_point mark_ = std::chrono::steady_clock::now();
  std::unordered_map<uint32_t, std::weak_ptr<RdmaConnection>> by_qp_;
};

class RdmaConnection final : public Connection,
                             public std::enable_shared_from_this<RdmaConnection> {
 public:
  RdmaConnection(Executor ex, const Options& options, std::string peer)
      : executor_(std::move(ex)),
        options_(options),
        peer_(std::move(peer)),
        event_fd_(executor_),
        recv_ring_(kRingBytes),
        send_ring_(kRingBytes) {
    Count(Stat::kRdmaConnectionsOpened);
  }

  ~RdmaConnection() override {
    Count(Stat::kRdmaConnectionsClosed);
    // What this connection still occupies in its peer's ring stops counting with it.
    Count(Stat::kRdmaRingBytesCredited, send_ring_.used());
    if (dev_ && qp_num_) dev_->Unregister(qp_num_);
    if (event_fd_.is_open()) event_fd_.release();  // rdma_destroy_event_channel closes it
    // The window first: bound to the QP, it holds a reference to it, and a QP destroyed before
    // its windows waits for them (rxe: 50 s, then gives up).
    recv_mw_.reset();
    for (auto& e : exposed_) e.mw.reset();
    id_.reset();  // destroys the QP: nothing reads the send buffer any more
    events_.reset();
    if (cq_slot_) dev_->ReleaseCq(cq_slot_);
    if (send_.data) dev_->ReleaseSendBuffer(send_);
    // No window or QP is left that could touch these: back to the thread's cache.
    if (dev_) {
      for (auto& e : exposed_) dev_->ReleaseBulk(std::move(e.buf));
      for (auto& f : fetches_) dev_->ReleaseBulk(std::move(f.buf));
      for (auto& m : pending_) dev_->ReleaseBulk(std::move(m.big));
    }
  }

  // Takes ownership of `id` and its event channel, whose events NextEvent then waits for.
  std::string Adopt(CmId id, EventChannel events) {
    id_ = std::move(id);
    events_ = std::move(events);
    if (!SetNonBlocking(events_->fd)) return Errno("fcntl");
    boost::system::error_code ec;
    event_fd_.assign(events_->fd, ec);
    if (ec) return "assign CM fd: " + ec.message();
    return "";
  }

  // Once the id is bound to a device: creates the QP on this thread's CQ, registers the rings
  // and posts the receives.
  std::string Setup() {
    if (id_->verbs == nullptr) return "the CM id is not bound to an RDMA device";
    auto dev = ThreadDevice::For(executor_, id_->verbs, options_);
    if (!dev.ok()) return dev.error().message;
    dev_ = dev.value();
    recv_buf_ = AllocAligned(kRingBytes);
    if (!recv_buf_) return "out of memory for the receive ring";
    auto send = dev_->AcquireSendBuffer();
    if (!send.ok()) return send.error().message;
    send_ = send.value();
    // The receive ring is the only memory the peer may touch, and only to write. All connections
    // of a thread share one protection domain (their SRQ and send slabs need it), so an MR's
    // own rkey would let any of them write into any ring: instead the MR grants no remote
    // access at all, and the peer gets the rkey of a type-2 memory window bound to this
    // connection's QP alone (Open() binds it). Another QP using that rkey gets a remote access
    // error. The window's key byte is random.
    const bool windows = dev_->qp_bound_windows();
    recv_mr_.reset(ibv_reg_mr(
        dev_->pd(), recv_buf_.get(), kRingBytes,
        IBV_ACCESS_LOCAL_WRITE | (windows ? IBV_ACCESS_MW_BIND : IBV_ACCESS_REMOTE_WRITE)));
    if (!recv_mr_) return Errno("ibv_reg_mr (receive ring)");
    ring_rkey_ = recv_mr_->rkey;
    auto slot = dev_->AcquireCq(kSendDepth);
    if (!slot.ok()) return slot.error().message;
    cq_slot_ = slot.value();
    ibv_qp_init_attr qa{};
    qa.send_cq = cq_slot_->cq.get();
    qa.recv_cq = cq_slot_->cq.get();
    qa.srq = dev_->srq();
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = 0;
    qa.cap.max_send_wr = kSendDepth;
    qa.cap.max_send_sge = 1;
    qa.cap.max_inline_data = 64;
    if (rdma_create_qp(id_.get(), dev_->pd(), &qa)) {
      qa.cap.max_inline_data = 0;  // some devices grant no inline data at all
      if (rdma_create_qp(id_.get(), dev_->pd(), &qa)) return Errno("rdma_create_qp");
    }
    max_inline_ = qa.cap.max_inline_data;
    send_depth_ = qa.cap.max_send_wr;
    qp_num_ = id_->qp->qp_num;
    if (windows) {
      // Allocated after the QP on purpose: a process that dies has its verbs objects destroyed
      // newest first, and rxe (kernel 6.1) stalls 50 s destroying a QP that a bound window
      // still references, which kept killed servers from disconnecting their clients.
      recv_mw_.reset(ibv_alloc_mw(dev_->pd(), IBV_MW_TYPE_2));
      if (!recv_mw_) return Errno("ibv_alloc_mw");
      uint8_t key = 0;
      while (key == 0 || key == (recv_mw_->rkey & 0xff)) key = static_cast<uint8_t>(RandomByte());
      ring_rkey_ = (recv_mw_->rkey & 0xffffff00u) | key;
    }
    dev_->Register(qp_num_, weak_from_this());
    return "";
  }

  RingDescriptor LocalRing() const {
    return {reinterpret_cast<uint64_t>(recv_buf_.get()), ring_rkey_, kRingBytes};
  }

  void SetRemoteRing(const RingDescriptor& d) {
    remote_ = d;
    // No credit until the peer grants its ring (it may not be writable yet: see Open()).
    send_ring_ = SendRing(d.bytes, /*granted=*/false);
  }

  // Once ESTABLISHED (the QP can send): makes our ring writable by the peer, through this QP
  // only, and grants it as credit. The grant is a zero-byte write (which touches no memory) that
  // follows the bind on the same send queue, so the peer never writes before the window works.
  std::string Open() {
    if (recv_mw_) {
      ibv_send_wr wr{};
      wr.opcode = IBV_WR_BIND_MW;
      wr.bind_mw.mw = recv_mw_.get();
      wr.bind_mw.rkey = ring_rkey_;
      wr.bind_mw.bind_info.mr = recv_mr_.get();
      wr.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(recv_buf_.get());
      wr.bind_mw.bind_info.length = kRingBytes;
      wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
      if (!PostSend(wr)) return "cannot bind the receive ring's memory window";
    }
    if (!PostWrite(0, 0, kImmCreditBit | (kRingBytes / kRecordAlignBytes))) {
      return "cannot grant the receive ring";
    }
    return "";
  }

  rdma_cm_id* id() { return id_.get(); }
  uint8_t rd_atom() const { return dev_->rd_atom(); }

  // Waits for the next CM event on this connection's channel, bounded by `timeout_ms`.
  asio::awaitable<CmEvent> NextEvent(int timeout_ms) {
    using namespace asio::experimental::awaitable_operators;
    asio::steady_timer timer(executor_, std::chrono::milliseconds(timeout_ms));
    for (;;) {
      rdma_cm_event* e = nullptr;
      if (rdma_get_cm_event(events_.get(), &e) == 0) co_return CmEvent(e);
      if (errno != EAGAIN) co_return nullptr;
      auto r = co_await (event_fd_.async_wait(asio::posix::stream_descriptor::wait_read,
                                              asio::as_tuple(asio::use_awaitable)) ||
                         timer.async_wait(asio::as_tuple(asio::use_awaitable)));
      if (r.index() == 1) co_return nullptr;
      // The wait was cancelled (the caller gave up on the connect, or the connection closed).
      if (std::get<0>(std::get<0>(r))) co_return nullptr;
    }
  }

  // After ESTABLISHED: watch for the peer's disconnect.
  void WatchEvents() {
    event_fd_.async_wait(
        asio::posix::stream_descriptor::wait_read,
        [self = shared_from_this()](boost::system::error_code ec) {
          if (ec || self->handler_.closed()) return;
          rdma_cm_event* e = nullptr;
          while (rdma_get_cm_event(self->events_.get(), &e) == 0) {
            auto type = e->event;
            rdma_ack_cm_event(e);
            if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
                type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
              self->CloseWith(std::string("peer disconnected (") + rdma_event_str(type) + ")");
              return;
            }
          }
          self->WatchEvents();
        });
  }

  // --- Connection ----------------------------------------------------------------------------
  const Executor& executor() const override { return executor_; }
  bool closed() const override { return handler_.closed(); }
  size_t max_message_bytes() const override { return options_.max_message_bytes; }
  std::string peer() const override { return peer_; }

  void Start(std::shared_ptr<ConnectionHandler> handler) override {
    handler_.Set(std::move(handler));
    if (handler_.closed()) {
      asio::post(executor_, [self = shared_from_this()] { self->handler_.DeliverClose(); });
      return;
    }
    if (early_.Start()) {
      // Completions polled before this replay runs queue behind the held ones (StartGate), so
      // that records are processed in ring order.
      asio::post(executor_, [self = shared_from_this()] {
        for (const ibv_wc& wc : self->early_.TakeHeld()) self->Process(wc);
      });
    }
  }

  bool Send(const MessageWriter& message) override {
    if (handler_.closed() || closing_) return false;
    const size_t n = message.size();
    if (n > options_.max_message_bytes) return false;
    const bool fits_record = n + kRecordHeaderBytes <= send_ring_.max_record_bytes();
    if (pending_.empty() && fits_record && CanPost()) {
      if (auto at = ReserveRecord(static_cast<uint32_t>(n + kRecordHeaderBytes))) {
        std::byte* rec = send_.data + *at;
        StoreRecordHeader(rec, static_cast<uint32_t>(n), kRecordData);
        message.WriteTo(rec + kRecordHeaderBytes);
        PostRecord(*at, static_cast<uint32_t>(n + kRecordHeaderBytes));
        return true;
      }
    }
    Outgoing out;
    out.size = n;
    if (fits_record) Count(Stat::kRdmaCreditStalls);  // (large messages always queue)
    if (!fits_record && dev_->qp_bound_windows()) {
      // Rendezvous: serialized straight into registered memory, which the peer will read
      // (Expose). The payload is never copied on either side.
      auto big = dev_->AcquireBulk(n);
      if (!big.ok()) {
        CloseWith(big.error().message);
        return false;
      }
      out.big = std::move(big.value());
      message.WriteTo(out.big.data());
    } else {
      // No credit or no send-queue room (or, without memory windows, too big for one record:
      // sent in chunks): keep a copy and send it in order as credits come back. Backpressure,
      // never loss.
      out.bytes.resize(n);
      if (n) message.WriteTo(out.bytes.data());  // an empty vector's data() may be null
    }
    pending_bytes_ += n + kPendingOverheadBytes;
    pending_.push_back(std::move(out));
    SendPending();
    return true;
  }

  void Close() override { CloseWith("closed locally"); }

  void CloseAfterSending(int limit_ms) override {
    if (handler_.closed() || closing_) return;
    closing_ = true;
    paused_ = true;
    MaybeFinishClosing();
    if (handler_.closed()) return;
    auto timer =
        std::make_shared<asio::steady_timer>(executor_, std::chrono::milliseconds(limit_ms));
    timer->async_wait([self = shared_from_this(), timer](boost::system::error_code) {
      self->CloseWith("closed locally (the peer did not take the last messages in time)");
    });
  }

  size_t queued_send_bytes() const override {
    return pending_bytes_ - pending_sent_ + exposed_bytes_;
  }

  void PauseReceiving() override { paused_ = true; }

  void ResumeReceiving() override {
    if (!paused_ || closing_) return;
    paused_ = false;
    if (resume_posted_) return;
    resume_posted_ = true;
    asio::post(executor_, [self = shared_from_this()] {
      self->resume_posted_ = false;
      self->Drain();
    });
  }

  // send_ring_.Reserve, counted for the ring-occupancy gauge (transport/stats.h).
  std::optional<uint32_t> ReserveRecord(uint32_t bytes) {
    const uint64_t used_before = send_ring_.used();
    auto at = send_ring_.Reserve(bytes);
    if (at) Count(Stat::kRdmaRingBytesWritten, send_ring_.used() - used_before);
    return at;
  }

  // --- completions -----------------------------------------------------------------------------
  void OnCompletion(const ibv_wc& wc) {
    if (handler_.closed()) return;  // flushed work requests after a close
    // Held (their records stay in the ring) until Start and its replay: see StartGate.
    if (early_.Pass(wc)) Process(wc);
  }

  void Process(const ibv_wc& wc) {
    if (handler_.closed()) return;
    if (wc.status == IBV_WC_SUCCESS && wc.wr_id == kRecvWrId && (wc.wc_flags & IBV_WC_WITH_IMM) &&
        !(be32toh(wc.imm_data) & (kImmCreditBit | kImmFinBit)) &&
        (paused_ || !held_.empty() || (!fetches_.empty() && !CanFetchAhead(wc)))) {
      // A record while receiving is paused, or behind a large message still being read: it
      // stays in the ring, unconsumed and uncredited, until its turn (Drain). Send completions,
      // credits and FINs are still taken: they are what lets our own queue drain. A peer that
      // writes more than its credit covers meanwhile is cut off here (ReceiveRing::Accept
      // would, but only once the records are consumed).
      held_bytes_ += AlignRecord(wc.byte_len);
      if (recv_ring_.unreported() + held_bytes_ > kRingBytes) {
        CloseWith("protocol error: peer wrote past its credits while we withheld them");
        return;
      }
      held_.push_back(wc);
      return;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      CloseWith(std::string("RDMA work completion failed: ") + ibv_wc_status_str(wc.status));
      return;
    }
    if (wc.wr_id != kRecvWrId) {
      // A signaled send: it and everything before it has left the send queue.
      const size_t queued_before = queued_send_bytes();
      send_unretired_ -= static_cast<uint32_t>(wc.wr_id);
      const uint64_t tag = (wc.wr_id >> 32) & 0xff;
      const uint32_t slot = static_cast<uint32_t>(wc.wr_id >> 40) & 0xff;
      if (tag == kTagInvalidate && slot < kMaxRendezvous) {
        // The peer has read the message and can no longer reach its buffer.
        Exposed& e = exposed_[slot];
        exposed_bytes_ -= e.bytes + kPendingOverheadBytes;
        dev_->ReleaseBulk(std::move(e.buf));
        e.state = Exposed::kFree;
      } else if (tag == kTagRead) {
        for (auto& f : fetches_) {
          if (f.slot == slot) f.done = true;
        }
        Drain();
        if (handler_.closed()) return;
      }
      // Against the queue as it was before this completion: an invalidation that released an
      // exposed message is progress a paused handler must hear of (it was missed, and a server
      // paused over a large reply never resumed).
      SendPendingAndReport(queued_before);
      return;
    }
    // A receive (ThreadDevice::Poll reposts its SRQ request).
    if (!(wc.wc_flags & IBV_WC_WITH_IMM)) {
      CloseWith("protocol error: receive without immediate data");
      return;
    }
    const uint32_t imm = be32toh(wc.imm_data);
    if (imm & kImmCreditBit) {
      const uint64_t used_before = send_ring_.used();
      if (!send_ring_.OnCredit(uint64_t(imm & kImmMask) * kRecordAlignBytes)) {
        CloseWith("protocol error: peer returned more credit than was used");
        return;
      }
      Count(Stat::kRdmaRingBytesCredited, used_before - send_ring_.used());
      SendPendingAndReport();
    } else if (imm & kImmFinBit) {
      OnFin(imm & kImmFinSlotMask);
    } else {
      OnRecord(uint64_t(imm & kImmMask) * kRecordAlignBytes, wc.byte_len);
    }
  }

 private:
  // A message waiting for credit: a copy (small, or chunked without windows), or a registered
  // buffer it was serialized into, to be exposed by rendezvous.
  struct Outgoing {
    std::vector<std::byte> bytes;
    ThreadDevice::BulkBuffer big;
    size_t size = 0;
  };

  static void StoreRecordHeader(std::byte* rec, uint32_t total, uint32_t kind) {
    uint32_t v = htole32(total);
    std::memcpy(rec, &v, 4);
    v = htole32(kind);
    std::memcpy(rec + 4, &v, 4);
  }
  static uint32_t Load32(const std::byte* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return le32toh(v);
  }

  // Room for a data record or a rendezvous (two requests), short of the control reserve.
  bool CanPost() const { return send_unretired_ + kControlReserve < send_depth_; }

  // From the completion path: sends what credits now allow, finishes a CloseAfterSending, and
  // tells a handler that paused receiving that its queue went down.
  void SendPendingAndReport() { SendPendingAndReport(queued_send_bytes()); }
  void SendPendingAndReport(size_t before) {
    ReturnCredits();  // any held back while the send queue was full
    SendPending();
    if (handler_.closed()) return;
    if (closing_) {
      MaybeFinishClosing();
      return;
    }
    if (paused_ && queued_send_bytes() < before && handler_.get()) {
      handler_.get()->OnSendProgress();
    }
  }

  // CloseAfterSending: once nothing is queued, one signaled send retires every write before it;
  // its completion (send_unretired_ back to 0) means they all reached the peer.
  void MaybeFinishClosing() {
    if (!pending_.empty() || exposed_bytes_ > 0) return;  // the peer has not read everything
    if (send_unretired_ == 0) {
      CloseWith("closed locally");
      return;
    }
    if (!final_signal_posted_ && CanPost()) {
      final_signal_posted_ = true;
      PostWrite(0, 0, kImmCreditBit, /*signal=*/true);  // a credit of 0 bytes: a no-op for the peer
    }
  }

  // Delivers, in order, the large messages whose reads finished and the records held behind
  // them or while paused, until paused again or the front message is still being read (only a
  // further rendezvous within the read-ahead budget goes ahead of it: its read starts now);
  // then returns the credits that freed.
  void Drain() {
    while (!paused_ && !handler_.closed()) {
      if (!fetches_.empty()) {
        if (fetches_.front().done) {
          DeliverFetched();
          continue;
        }
        if (!held_.empty() && CanFetchAhead(held_.front())) {
          TakeHeld();
          continue;
        }
        break;
      }
      if (held_.empty()) break;
      TakeHeld();
    }
    if (!paused_ && !handler_.closed()) ReturnCredits();
  }

  void TakeHeld() {
    const ibv_wc wc = held_.front();
    held_.pop_front();
    held_bytes_ -= AlignRecord(wc.byte_len);
    OnRecord(uint64_t(be32toh(wc.imm_data) & kImmMask) * kRecordAlignBytes, wc.byte_len);
  }

  // Whether the record `wc` announces is a rendezvous that may start its read while earlier
  // large messages are still being read: few enough in flight, and within kFetchAheadBytes.
  bool CanFetchAhead(const ibv_wc& wc) const {
    const uint64_t offset = uint64_t(be32toh(wc.imm_data) & kImmMask) * kRecordAlignBytes;
    if (offset + kRecordHeaderBytes > kRingBytes || wc.byte_len < kRecordHeaderBytes) return false;
    const std::byte* rec = recv_buf_.get() + offset;
    if (Load32(rec + 4) != kRecordRendezvous) return false;
    return fetches_.size() < kMaxRendezvous && fetch_bytes_ + Load32(rec) <= kFetchAheadBytes;
  }

  // A rendezvous record: reads the message from the peer's window into a buffer of ours.
  void StartFetch(uint32_t total, const std::byte* body) {
    uint64_t addr;
    std::memcpy(&addr, body, 8);
    addr = le64toh(addr);
    const uint32_t rkey = Load32(body + 8);
    const uint32_t slot = Load32(body + 12);
    if (slot >= kMaxRendezvous) {
      CloseWith("protocol error: rendezvous slot " + std::to_string(slot) + " out of range");
      return;
    }
    for (const auto& f : fetches_) {
      if (f.slot == slot) {
        CloseWith("protocol error: rendezvous slot " + std::to_string(slot) + " already in use");
        return;
      }
    }
    auto buf = dev_->AcquireBulk(total);
    if (!buf.ok()) {
      CloseWith(buf.error().message);
      return;
    }
    Fetch f;
    f.buf = std::move(buf.value());
    f.bytes = total;
    f.slot = slot;
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uint64_t>(f.buf.data());
    sge.length = total;
    sge.lkey = f.buf.mr->lkey;
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    fetch_bytes_ += total;
    fetches_.push_back(std::move(f));
    // A peer whose window does not cover what it announced fails the read, and its connection.
    PostSend(wr, /*signal=*/true, WrTag(kTagRead, slot));
  }

  // The front large message has been read: the FIN lets the peer reuse its buffer, then the
  // message is handed up in place.
  void DeliverFetched() {
    Fetch f = std::move(fetches_.front());
    fetches_.pop_front();
    fetch_bytes_ -= f.bytes;
    if (PostWrite(0, 0, kImmFinBit | f.slot)) {
      handler_.get()->OnMessage(std::span<const std::byte>(f.buf.data(), f.bytes));
    }
    dev_->ReleaseBulk(std::move(f.buf));
  }

  // Sends the front pending large message by rendezvous: binds a window over its buffer to this
  // QP alone (read-only, exactly its bytes, a fresh key) and writes a rendezvous record saying
  // where it is. False when it must wait (no free slot, credit or send-queue room).
  bool Expose(Outgoing& m) {
    uint32_t slot = 0;
    while (slot < kMaxRendezvous && exposed_[slot].state != Exposed::kFree) ++slot;
    if (slot == kMaxRendezvous) return false;
    auto at = ReserveRecord(kRecordHeaderBytes + kRendezvousBodyBytes);
    if (!at) return false;
    Exposed& e = exposed_[slot];
    if (!e.mw) {
      // Allocated after the QP (see Setup) and deallocated before it (the destructor).
      e.mw.reset(ibv_alloc_mw(dev_->pd(), IBV_MW_TYPE_2));
      if (!e.mw) {
        CloseWith(Errno("ibv_alloc_mw"));
        return false;
      }
      e.rkey = e.mw->rkey;
    }
    // A new key byte per exposure: an rkey the peer learned before is dead once invalidated.
    uint32_t key = e.rkey & 0xff;
    while (key == (e.rkey & 0xff) || key == 0) key = RandomByte();
    e.rkey = (e.rkey & 0xffffff00u) | key;
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_BIND_MW;
    wr.bind_mw.mw = e.mw.get();
    wr.bind_mw.rkey = e.rkey;
    wr.bind_mw.bind_info.mr = m.big.mr.get();
    wr.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(m.big.data());
    wr.bind_mw.bind_info.length = m.size;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
    if (!PostSend(wr)) return false;
    // The window's current rkey is what the next bind (and the provider) must name; verbs
    // leave updating it to us for type-2 windows (rxe refuses a bind naming a stale one).
    e.mw->rkey = e.rkey;
    std::byte* rec = send_.data + *at;
    StoreRecordHeader(rec, static_cast<uint32_t>(m.size), kRecordRendezvous);
    const uint64_t addr = htole64(reinterpret_cast<uint64_t>(m.big.data()));
    const uint32_t rkey = htole32(e.rkey), le_slot = htole32(slot);
    std::memcpy(rec + kRecordHeaderBytes, &addr, 8);
    std::memcpy(rec + kRecordHeaderBytes + 8, &rkey, 4);
    std::memcpy(rec + kRecordHeaderBytes + 12, &le_slot, 4);
    PostRecord(*at, kRecordHeaderBytes + kRendezvousBodyBytes);
    e.buf = std::move(m.big);
    e.bytes = m.size;
    e.state = Exposed::kExposed;
    exposed_bytes_ += m.size + kPendingOverheadBytes;
    return true;
  }

  // The peer has read the message exposed in `slot`: invalidate the window; the buffer is
  // reused once that completes.
  void OnFin(uint32_t slot) {
    if (slot >= kMaxRendezvous || exposed_[slot].state != Exposed::kExposed) {
      CloseWith("protocol error: FIN for rendezvous slot " + std::to_string(slot) +
                ", which holds no message");
      return;
    }
    Exposed& e = exposed_[slot];
    e.state = Exposed::kInvalidating;
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_LOCAL_INV;
    wr.invalidate_rkey = e.rkey;
    PostSend(wr, /*signal=*/true, WrTag(kTagInvalidate, slot));
  }

  // Returns credits once a quarter of the ring is free (ring.h explains why that suffices);
  // never while paused, so that a peer that does not take our replies cannot send more. With
  // the send queue nearly full (a peer slow to take our writes) they wait, adding up, for the
  // next send completion: credits are cumulative, and posting regardless overflowed the queue.
  void ReturnCredits() {
    if (paused_ || send_unretired_ + kControlReserve / 2 >= send_depth_) return;
    if (uint64_t c = recv_ring_.TakeCredits(kRingBytes / 4)) {
      PostWrite(0, 0, kImmCreditBit | static_cast<uint32_t>(c / kRecordAlignBytes));
    }
  }

  bool PostWrite(uint32_t offset, uint32_t bytes, uint32_t imm, bool signal = false) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uint64_t>(send_.data) + offset;
    sge.length = bytes;
    sge.lkey = send_.lkey;
    ibv_send_wr wr{};
    wr.sg_list = bytes ? &sge : nullptr;
    wr.num_sge = bytes ? 1 : 0;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htobe32(imm);
    wr.wr.rdma.remote_addr = remote_.addr + offset;
    wr.wr.rdma.rkey = remote_.rkey;
    if (bytes && bytes <= max_inline_) wr.send_flags |= IBV_SEND_INLINE;
    return PostSend(wr, signal);
  }

  // Posts one work request, counting it in send_unretired_. Every kSignalEvery-th is signaled,
  // and every one once the queue is half full, so that a signaled completion always comes to
  // retire what is outstanding (its wr_id says how many it retires).
  bool PostSend(ibv_send_wr& wr, bool signal = false, uint64_t tag = 0) {
    ++since_signal_;
    ++send_unretired_;
    if (signal || since_signal_ >= kSignalEvery || send_unretired_ * 2 >= send_depth_) {
      wr.send_flags |= IBV_SEND_SIGNALED;
      wr.wr_id = since_signal_ | tag;
      since_signal_ = 0;
    }
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(id_->qp, &wr, &bad)) {
      CloseWith(Errno("ibv_post_send"));
      return false;
    }
    return true;
  }

  void PostRecord(uint32_t offset, uint32_t bytes) {
    PostWrite(offset, bytes, offset / kRecordAlignBytes);
  }

  void SendPending() {
    while (!pending_.empty() && !handler_.closed() && CanPost()) {
      Outgoing& o = pending_.front();
      if (o.big) {
        if (!Expose(o)) return;  // waits for a free slot or credit
        pending_bytes_ -= o.size + kPendingOverheadBytes;
        pending_.pop_front();
        continue;
      }
      auto& m = o.bytes;
      const size_t chunk = std::min(m.size() - pending_sent_,
                                    size_t(send_ring_.max_record_bytes() - kRecordHeaderBytes));
      auto at = ReserveRecord(static_cast<uint32_t>(chunk + kRecordHeaderBytes));
      if (!at) return;  // wait for credits
      std::byte* rec = send_.data + *at;
      StoreRecordHeader(rec, static_cast<uint32_t>(m.size()), kRecordData);
      if (chunk) std::memcpy(rec + kRecordHeaderBytes, m.data() + pending_sent_, chunk);
      PostRecord(*at, static_cast<uint32_t>(chunk + kRecordHeaderBytes));
      pending_sent_ += chunk;
      if (pending_sent_ == m.size()) {
        pending_bytes_ -= m.size() + kPendingOverheadBytes;
        pending_.pop_front();
        pending_sent_ = 0;
      }
    }
  }

  void OnRecord(uint64_t offset, uint32_t bytes) {
    std::string err = recv_ring_.Accept(offset, bytes);
    if (err.empty() && bytes < kRecordHeaderBytes) err = "record shorter than its header";
    if (!err.empty()) {
      CloseWith("protocol error: " + err);
      return;
    }
    const std::byte* rec = recv_buf_.get() + offset;
    const uint32_t total = Load32(rec);
    const uint32_t kind = Load32(rec + 4);
    const std::byte* data = rec + kRecordHeaderBytes;
    const size_t len = bytes - kRecordHeaderBytes;
    if (total > options_.max_message_bytes) {
      CloseWith("peer sent a message of " + std::to_string(total) + " bytes, over the limit of " +
                std::to_string(options_.max_message_bytes));
      return;
    }
    if (kind == kRecordRendezvous) {
      if (reassembling_ || len != kRendezvousBodyBytes || total == 0) {
        CloseWith("protocol error: malformed rendezvous record");
        return;
      }
      StartFetch(total, data);
      if (handler_.closed()) return;
      ReturnCredits();
      return;
    }
    if (kind != kRecordData) {
      CloseWith("protocol error: unknown record kind " + std::to_string(kind));
      return;
    }
    if (!reassembling_) {
      if (len == total) {
        // The common case: the whole message in one record, delivered in place.
        handler_.get()->OnMessage(std::span<const std::byte>(data, len));
      } else if (len < total) {
        reassembling_ = true;
        partial_total_ = total;
        partial_.clear();
        // Grows with the chunks that arrive, not with what the header announces: a peer cannot
        // make us allocate for a message it never sends.
        partial_.insert(partial_.end(), data, data + len);
      } else {
        CloseWith("protocol error: record longer than its message");
        return;
      }
    } else {
      if (total != partial_total_ || partial_.size() + len > total) {
        CloseWith("protocol error: inconsistent chunk of a large message");
        return;
      }
      partial_.insert(partial_.end(), data, data + len);
      if (partial_.size() == total) {
        reassembling_ = false;
        handler_.get()->OnMessage(std::span<const std::byte>(partial_.data(), total));
        partial_.clear();
        partial_.shrink_to_fit();
      }
    }
    if (handler_.closed()) return;
    ReturnCredits();
  }

  void CloseWith(std::string reason) {
    if (!handler_.MarkClosed(std::move(reason))) return;
    if (id_) rdma_disconnect(id_.get());
    // Stop watching CM events: a peer that no longer answers (stopped, gone) sends no
    // DISCONNECTED for a long while, and the pending wait would keep this connection and its
    // event loop alive until the CM gives up (about 100 s with rxe).
    boost::system::error_code ignored;
    event_fd_.cancel(ignored);
    for (auto& m : pending_) dev_->ReleaseBulk(std::move(m.big));  // never exposed
    pending_.clear();
    pending_bytes_ = pending_sent_ = 0;
    held_.clear();
    held_bytes_ = 0;
    partial_ = {};
    asio::post(executor_, [self = shared_from_this()] { self->handler_.DeliverClose(); });
  }

  Executor executor_;
  Options options_;
  std::string peer_;
  // Declaration order is destruction order reversed: the QP (in id_) goes before the CQ (dev_)
  // and the memory regions it uses.
  std::shared_ptr<ThreadDevice> dev_;
  AlignedBuffer recv_buf_;
  Mr recv_mr_;
  Mw recv_mw_;  // deallocated first of all (see the destructor), before the MR it windows
  uint32_t ring_rkey_ = 0;         // what the peer writes with: the window's, or the MR's
  ThreadDevice::SendBuffer send_;  // from dev_'s slabs; returned in the destructor
  EventChannel events_;
  asio::posix::stream_descriptor event_fd_;
  CmId id_;
  ThreadDevice::CqSlot* cq_slot_ = nullptr;  // owned by dev_
  uint32_t qp_num_ = 0;
  uint32_t max_inline_ = 0;
  uint32_t send_depth_ = kSendDepth;
  uint32_t send_unretired_ = 0, since_signal_ = 0;
  RingDescriptor remote_;
  ReceiveRing recv_ring_;
  SendRing send_ring_;
  std::deque<Outgoing> pending_;
  size_t pending_bytes_ = 0;  // sum of pending_'s sizes
  size_t pending_sent_ = 0;   // of pending_.front()
  bool paused_ = false;       // PauseReceiving: records are held, credits withheld
  bool resume_posted_ = false;
  bool closing_ = false;  // CloseAfterSending
  bool final_signal_posted_ = false;
  std::deque<ibv_wc> held_;  // data records that arrived while paused (bounded by the ring)
  uint64_t held_bytes_ = 0;  // ring bytes they occupy
  // Large messages of ours the peer may read, by slot: kExposed until its FIN, kInvalidating
  // until the window is dead. Their buffers count in queued_send_bytes().
  struct Exposed {
    enum State { kFree, kExposed, kInvalidating };
    Mw mw;  // bound to this QP; deallocated before it (see the destructor)
    uint32_t rkey = 0;
    ThreadDevice::BulkBuffer buf;
    size_t bytes = 0;
    State state = kFree;
  };
  std::array<Exposed, kMaxRendezvous> exposed_;
  size_t exposed_bytes_ = 0;
  // The peer's large messages being read, in arrival (delivery) order.
  struct Fetch {
    ThreadDevice::BulkBuffer buf;
    uint32_t bytes = 0;
    uint32_t slot = 0;
    bool done = false;
  };
  std::deque<Fetch> fetches_;
  uint64_t fetch_bytes_ = 0;
  bool reassembling_ = false;
  uint32_t partial_total_ = 0;
  std::vector<std::byte> partial_;
  HandlerSlot handler_;
  StartGate<ibv_wc> early_;  // completions that arrived before Start (and its replay)
};

uint32_t ThreadDevice::Poll(ibv_cq* cq) {
  ibv_wc wcs[32];
  uint32_t taken = 0, polls = 0;
  while (taken < kPollBudget) {
    int n = ibv_poll_cq(cq, 32, wcs);
    ++polls;
    if (n <= 0) break;
    taken += static_cast<uint32_t>(n);
    uint32_t receives = 0;
    for (int i = 0; i < n; ++i) {
      // Every receive completion, even of a closed connection or with an error, used one SRQ WR.
      if (wcs[i].wr_id == kRecvWrId) ++receives;
      auto it = by_qp_.find(wcs[i].qp_num);
      if (it == by_qp_.end()) continue;
      if (auto c = it->second.lock()) c->OnCompletion(wcs[i]);
    }
    if (receives && !PostReceives(receives)) {
      spdlog::error("rdma: ibv_post_srq_recv failed: {}", std::strerror(errno));
    }
  }
  Count(Stat::kRdmaCqPolls, polls);
  if (taken) Count(Stat::kRdmaCompletions, taken);
  return taken;
}

// Keeps each io_context's ThreadDevices inside that io_context, as an Asio service: they live and
// die with it. (A global map keyed by the context's address once handed a new io_context the
// device of a destroyed one at the same address, whose completion fd nobody waited on any more.)
class DeviceService final : public asio::execution_context::service {
 public:
  using key_type = DeviceService;
  static inline asio::execution_context::id id;
  explicit DeviceService(asio::execution_context& ctx) : service(ctx) {}

  void shutdown() override {
    for (auto& [verbs, weak] : devices_) {
      if (auto d = weak.lock()) d->Detach();
    }
    devices_.clear();
  }

  // Only from the context's own thread: no lock.
  std::map<ibv_context*, std::weak_ptr<ThreadDevice>> devices_;
};

Expected<std::shared_ptr<ThreadDevice>> ThreadDevice::For(const Executor& ex, ibv_context* verbs,
                                                          const Options& options) {
  auto& service = asio::use_service<DeviceService>(asio::query(ex, asio::execution::context));
  auto& slot = service.devices_[verbs];
  if (auto d = slot.lock()) return d;
  auto d = std::shared_ptr<ThreadDevice>(new ThreadDevice(ex, verbs, options));
  std::string err = d->Init();
  if (!err.empty()) return Error{err};
  slot = d;
  d->Arm();
  return d;
}

std::string SockaddrUri(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (sa && sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (sa && sa->sa_family == AF_INET6) {
    auto* in = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
    port = ntohs(in->sin6_port);
  }
  return Endpoint{Scheme::kRdma, host, port}.ToUri();
}

// Rejects a connect request, saying why (or challenging it) in the reject's private data.
void RejectWith(rdma_cm_id* id, const Answer& answer) {
  uint8_t out[kAnswerBytes];
  EncodeAnswer(answer, out);
  rdma_reject(id, out, kAnswerBytes);
}
void RejectWith(rdma_cm_id* id, Refusal why) {
  Answer a;
  a.code = why;
  RejectWith(id, a);
}

rdma_conn_param ConnParam(const uint8_t* data, size_t len, uint8_t rd_atom) {
  rdma_conn_param p{};
  p.private_data = data;
  p.private_data_len = static_cast<uint8_t>(len);
  // RDMA READs in flight each way (rendezvous reads of large messages).
  p.responder_resources = rd_atom;
  p.initiator_depth = rd_atom;
  p.retry_count = 7;
  p.rnr_retry_count = 7;  // "infinite": a receiver briefly short of receives is not an error
  return p;
}

class RdmaListener final : public Listener {
 public:
  struct State : std::enable_shared_from_this<State> {
    explicit State(Executor ex) : fd(ex) {}
    asio::posix::stream_descriptor fd;
    EventChannel events;
    CmId id;
    std::vector<Executor> executors;
    AcceptHandler on_accept;
    Options options;
    Authenticator auth{""};
    size_t next = 0;
    // Set on the listener's thread, read by Accept on the I/O thread that takes the connection.
    std::atomic<bool> closed{false};

    void Wait() {
      fd.async_wait(asio::posix::stream_descriptor::wait_read,
                    [self = shared_from_this()](boost::system::error_code ec) {
                      if (ec || self->closed) return;
                      rdma_cm_event* e = nullptr;
                      while (rdma_get_cm_event(self->events.get(), &e) == 0) self->OnEvent(e);
                      self->Wait();
                    });
    }

    void OnEvent(rdma_cm_event* e) {
      if (e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_ack_cm_event(e);
        return;
      }
      rdma_cm_id* child = e->id;
      RingDescriptor remote;
      Hello hello;
      std::string err = DecodeDescriptor(e->param.conn.private_data, e->param.conn.private_data_len,
                                         &remote, &hello);
      std::string peer = SockaddrUri(rdma_get_peer_addr(child));
      // Refused or challenged before anything is allocated for the peer, and before it learns
      // any rkey: a challenge is a reject too, and the client connects again with its proof.
      Answer answer;
      if (!err.empty()) {
        answer.code =
            RefusalForBadHello(e->param.conn.private_data, e->param.conn.private_data_len);
      } else {
        answer.code = auth.Check(hello, &answer.challenge);
        if (answer.code != Refusal::kNone) err = RefusalText(answer.code);
      }
      rdma_ack_cm_event(e);  // the private data is not read after this
      if (answer.code != Refusal::kNone) {
        if (answer.code != Refusal::kChallenge) {
          spdlog::warn("rdma: refusing connection from {}: {}", peer, err);
        }
        RejectWith(child, answer);
        rdma_destroy_id(child);
        return;
      }
      // Move the new id to its own event channel, on the I/O thread that will own it.
      EventChannel ch(rdma_create_event_channel());
      if (!ch || rdma_migrate_id(child, ch.get())) {
        const int err_no = errno;
        spdlog::warn("rdma: cannot take connection from {}: {}", peer, std::strerror(err_no));
        // Out of descriptors is the usual cause: the client hears RESOURCE_EXHAUSTED.
        RejectWith(child, err_no == EMFILE || err_no == ENFILE || err_no == ENOMEM
                              ? Refusal::kBusy
                              : Refusal::kServerError);
        rdma_destroy_id(child);
        return;
      }
      Executor target = executors[next++ % executors.size()];
      asio::co_spawn(
          target,
          Accept(shared_from_this(), target, CmId(child), std::move(ch), remote, hello, peer),
          asio::detached);
    }

    static asio::awaitable<void> Accept(std::shared_ptr<State> self, Executor ex, CmId id,
                                        EventChannel ch, RingDescriptor remote, Hello client,
                                        std::string peer) {
      auto conn = std::make_shared<RdmaConnection>(ex, self->options, peer);
      rdma_cm_id* raw = id.get();
      std::string err = conn->Adopt(std::move(id), std::move(ch));
      if (err.empty()) err = conn->Setup();
      if (!err.empty()) {
        spdlog::warn("rdma: set-up for {} failed: {}", peer, err);
        RejectWith(raw, Refusal::kServerError);
        co_return;
      }
      conn->SetRemoteRing(remote);
      // Private data of the accept: our HELLO (where our ring is), then an ANSWER whose proof
      // shows a client with a secret that we know it too.
      const Hello ours = WithRing(Hello{}, conn->LocalRing());
      Answer answer;
      answer.proof = self->auth.ProveServer(client, ours);
      uint8_t data[kHelloBytes + kAnswerBytes];
      EncodeHello(ours, data);
      EncodeAnswer(answer, data + kHelloBytes);
      rdma_conn_param p = ConnParam(data, sizeof data, conn->rd_atom());
      if (rdma_accept(conn->id(), &p)) {
        spdlog::warn("rdma: accept from {} failed: {}", peer, std::strerror(errno));
        co_return;
      }
      CmEvent ev =
          co_await conn->NextEvent(std::max(self->options.connect_timeout_ms, kEstablishWaitMinMs));
      if (!ev || ev->event != RDMA_CM_EVENT_ESTABLISHED) {
        spdlog::warn("rdma: connection from {} not established: {}", peer,
                     ev ? rdma_event_str(ev->event) : "timed out");
        co_return;
      }
      ev.reset();
      if (self->closed) co_return;
      conn->WatchEvents();
      if (std::string err = conn->Open(); !err.empty()) {
        spdlog::warn("rdma: connection from {}: {}", peer, err);
      }
      self->on_accept(conn);
    }
  };

  RdmaListener(std::shared_ptr<State> s, std::string uri)
      : state_(std::move(s)), uri_(std::move(uri)) {}
  ~RdmaListener() override { Close(); }

  void Close() override {
    if (closing_.exchange(true)) return;
    asio::post(state_->fd.get_executor(), [s = state_] {
      s->closed = true;
      if (s->fd.is_open()) s->fd.release();
      s->id.reset();
      s->events.reset();
    });
  }

  std::string uri() const override { return uri_; }

 private:
  std::shared_ptr<State> state_;
  std::string uri_;
  std::atomic<bool> closing_{false};
};

sockaddr_storage ToSockaddr(const asio::ip::address& addr, uint16_t port) {
  asio::ip::tcp::endpoint tep(addr, port);
  sockaddr_storage ss{};
  std::memcpy(&ss, tep.data(), tep.size());
  return ss;
}

// For Listen (set-up, off the I/O threads): a blocking lookup is fine there.
Expected<sockaddr_storage> ResolveHost(const Endpoint& ep) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(ep.host == "localhost" ? "127.0.0.1" : ep.host, ec);
  if (ec) {
    asio::io_context ioc;
    asio::ip::tcp::resolver r(ioc);
    auto results = r.resolve(ep.host, std::to_string(ep.port), ec);
    if (ec || results.empty()) return Error{"cannot resolve " + ep.host};
    addr = results.begin()->endpoint().address();
  }
  return ToSockaddr(addr, ep.port);
}

// For Connect, which runs on an I/O thread: a host name is looked up without blocking the loop
// (Asio's resolver does the getaddrinfo on its own thread).
asio::awaitable<Expected<sockaddr_storage>> ResolveHostAsync(const Endpoint& ep, Executor ex) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(ep.host == "localhost" ? "127.0.0.1" : ep.host, ec);
  if (!ec) co_return ToSockaddr(addr, ep.port);
  asio::ip::tcp::resolver r(ex);
  auto [rec, results] = co_await r.async_resolve(ep.host, std::to_string(ep.port),
                                                 asio::as_tuple(asio::use_awaitable));
  if (rec || results.empty()) co_return Error{"cannot resolve " + ep.host};
  co_return ToSockaddr(results.begin()->endpoint().address(), ep.port);
}

}  // namespace

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options) {
  const std::string what = "rdma listen on " + endpoint.ToUri() + ": ";
  if (std::string why = DeviceUnavailableReason(); !why.empty()) return Error{what + why};
  if (executors.empty()) return Error{what + "no executors"};
  auto sa = ResolveHost(endpoint);
  if (!sa.ok()) return Error{what + sa.error().message};
  auto s = std::make_shared<RdmaListener::State>(executors[0]);
  s->executors = executors;
  s->on_accept = std::move(on_accept);
  s->options = options;
  s->auth = Authenticator(options.auth_secret);
  s->events.reset(rdma_create_event_channel());
  if (!s->events) return Error{what + Errno("rdma_create_event_channel")};
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(s->events.get(), &id, nullptr, RDMA_PS_TCP)) {
    return Error{what + Errno("rdma_create_id")};
  }
  s->id.reset(id);
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&sa.value()))) {
    return Error{what + Errno("rdma_bind_addr")};
  }
  if (rdma_listen(id, 1024)) return Error{what + Errno("rdma_listen")};
  if (!SetNonBlocking(s->events->fd)) return Error{what + Errno("fcntl")};
  boost::system::error_code ec;
  s->fd.assign(s->events->fd, ec);
  if (ec) return Error{what + ec.message()};
  Endpoint bound = endpoint;
  bound.port = ntohs(rdma_get_src_port(id));
  s->Wait();
  return std::unique_ptr<Listener>(new RdmaListener(s, bound.ToUri()));
}

namespace {

// One connection attempt: a new CM id, QP and ring, and one connect request.
struct Attempt {
  std::shared_ptr<RdmaConnection> conn;  // set when connected
  Error error;
  bool transient = false;          // worth another attempt while the connect timeout lasts
  std::optional<Nonce> challenge;  // the server wants our proof: connect again with it
};

int MsUntil(std::chrono::steady_clock::time_point t) {
  return static_cast<int>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(t - std::chrono::steady_clock::now())
             .count()));
}

asio::awaitable<Attempt> ConnectOnce(const Endpoint& endpoint, sockaddr_storage sa,
                                     Executor executor, const Options& options,
                                     const Authenticator& auth, Hello* hello,
                                     const std::optional<Nonce>& challenge,
                                     std::chrono::steady_clock::time_point until) {
  Attempt out;
  auto fail = [&](std::string why, bool transient = false) {
    out.error = Error{std::move(why)};
    out.transient = transient;
    return out;
  };
  EventChannel events(rdma_create_event_channel());
  if (!events) co_return fail(Errno("rdma_create_event_channel"));
  rdma_cm_id* raw = nullptr;
  if (rdma_create_id(events.get(), &raw, nullptr, RDMA_PS_TCP)) {
    co_return fail(Errno("rdma_create_id"));
  }
  // The connection owns the id and its channel from here, so every exit below releases them.
  auto conn = std::make_shared<RdmaConnection>(executor, options, endpoint.ToUri());
  if (std::string err = conn->Adopt(CmId(raw), std::move(events)); !err.empty()) {
    co_return fail(err);
  }
  auto describe = [](const CmEvent& ev) {
    return std::string(rdma_event_str(ev->event)) + " (status " + std::to_string(ev->status) + ")";
  };
  const int resolve_ms = std::max(1, std::min(kResolveTimeoutMs, MsUntil(until)));
  if (rdma_resolve_addr(raw, nullptr, reinterpret_cast<sockaddr*>(&sa), resolve_ms)) {
    co_return fail(Errno("rdma_resolve_addr"));
  }
  {
    CmEvent ev = co_await conn->NextEvent(resolve_ms + 500);
    if (!ev) co_return fail("address resolution timed out", true);
    if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
      co_return fail("address resolution failed: " + describe(ev), true);
    }
  }
  if (rdma_resolve_route(raw, resolve_ms)) co_return fail(Errno("rdma_resolve_route"));
  {
    CmEvent ev = co_await conn->NextEvent(resolve_ms + 500);
    if (!ev) co_return fail("route resolution timed out", true);
    if (ev->event != RDMA_CM_EVENT_ROUTE_RESOLVED) {
      co_return fail("route resolution failed: " + describe(ev), true);
    }
  }
  if (std::string err = conn->Setup(); !err.empty()) co_return fail(err);
  *hello = WithRing(*hello, conn->LocalRing());
  if (challenge) auth.Prove(hello, *challenge);  // the proof covers the ring fields
  uint8_t data[kHelloBytes];
  EncodeHello(*hello, data);
  rdma_conn_param p = ConnParam(data, sizeof data, conn->rd_atom());
  if (rdma_connect(conn->id(), &p)) co_return fail(Errno("rdma_connect"));
  CmEvent ev = co_await conn->NextEvent(std::max(1, MsUntil(until)));
  if (!ev) {
    co_return fail("timed out after " + std::to_string(options.connect_timeout_ms) + " ms");
  }
  if (ev->event == RDMA_CM_EVENT_REJECTED) {
    // An rdmarpc server says why (or challenges us) in the reject's private data; a bare reject
    // means nobody listens on that port.
    Answer answer;
    if (DecodeAnswer(ev->param.conn.private_data, ev->param.conn.private_data_len, &answer)
            .empty() &&
        answer.code != Refusal::kNone) {
      if (answer.code == Refusal::kChallenge && hello->wants_auth && !challenge) {
        out.challenge = answer.challenge;
        co_return out;
      }
      fail("refused by the server: " + RefusalText(answer.code));
      out.error.busy = answer.code == Refusal::kBusy;
      co_return out;
    }
    co_return fail("connection refused (nobody listening on that port)");
  }
  if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
    // CONNECT_ERROR, UNREACHABLE: the CM gave up on this request (a loaded server answering
    // too late, a lost packet). A new request usually succeeds.
    co_return fail(describe(ev), ev->event == RDMA_CM_EVENT_CONNECT_ERROR ||
                                     ev->event == RDMA_CM_EVENT_UNREACHABLE);
  }
  RingDescriptor remote;
  Hello server;
  std::string err = DecodeDescriptor(ev->param.conn.private_data, ev->param.conn.private_data_len,
                                     &remote, &server);
  Answer answer;
  if (err.empty() && ev->param.conn.private_data_len >= kHelloBytes + kAnswerBytes) {
    err = DecodeAnswer(static_cast<const uint8_t*>(ev->param.conn.private_data) + kHelloBytes,
                       kAnswerBytes, &answer);
  }
  if (err.empty()) err = auth.CheckServer(*hello, server, answer);
  ev.reset();
  if (!err.empty()) {
    conn->Close();
    co_return fail(err);
  }
  conn->SetRemoteRing(remote);
  conn->WatchEvents();
  if (std::string e = conn->Open(); !e.empty()) co_return fail(e);
  out.conn = std::move(conn);
  co_return out;
}

}  // namespace

asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                               Executor executor,
                                                               const Options& options) {
  const std::string what = "rdma connect to " + endpoint.ToUri() + ": ";
  if (std::string why = DeviceUnavailableReason(); !why.empty()) co_return Error{what + why};
  auto sa = co_await ResolveHostAsync(endpoint, executor);
  if (!sa.ok()) co_return Error{what + sa.error().message};
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  const Authenticator auth(options.auth_secret);
  Hello hello = auth.NewHello();
  std::optional<Nonce> challenge;
  asio::steady_timer pause(executor);
  for (int attempt = 0;; ++attempt) {
    Attempt a = co_await ConnectOnce(endpoint, sa.value(), executor, options, auth, &hello,
                                     challenge, until);
    if (a.conn) co_return std::shared_ptr<Connection>(a.conn);
    if (a.challenge) {
      challenge = a.challenge;  // at most once: ConnectOnce takes no second challenge
      continue;
    }
    // Transient failures are retried, with a short growing pause, while the timeout lasts.
    const int pause_ms = std::min(10 << std::min(attempt, 5), 320);
    if (!a.transient || MsUntil(until) <= pause_ms) {
      a.error.message = what + a.error.message;
      co_return a.error;
    }
    spdlog::info("{}attempt {} failed ({}); trying again", what, attempt + 1, a.error.message);
    pause.expires_after(std::chrono::milliseconds(pause_ms));
    co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

}  // namespace rdmarpc::transport::rdma

// Per I/O thread and device state of the RDMA transport: the protection domain, the shared
// receive queue, the CQs and their completion channel, the registered send slabs and the
// large-message registration cache, and the polling (adaptive, busy or event-driven) that hands
// each completion to its connection (a CompletionSink).
//
// Threading: a ThreadDevice belongs to one I/O thread (one io_context); call it only there.
// Nothing here takes a lock.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/poller.h"
#include "transport/rdma/tick_clock.h"
#include "transport/rdma/tunables.h"
#include "transport/rdma/verbs.h"
#include "transport/stats.h"
#include "transport/transport.h"

namespace rdmarpc::transport::rdma {

// What a ThreadDevice hands each work completion to: the connection that owns the QP.
class CompletionSink {
 public:
  virtual void OnCompletion(const ibv_wc& wc) = 0;
  // The thread's periodic look while send staging buffers are out (ThreadDevice::Sweep): a
  // connection that wrote nothing since the last one retires its writes and returns its buffer.
  virtual void OnSweep() = 0;

 protected:
  ~CompletionSink() = default;
};

// Arms `cq` for its next event with the uverbs REQ_NOTIFY_CQ command, written by a raw write() to
// its context's command descriptor: the command libibverbs itself sends (as an ioctl) for
// providers that arm through the kernel (see ThreadDevice::ArmCq). False, errno set, if the
// kernel refused it.
bool ArmByKernelCommand(ibv_cq* cq);

// The CQ whose event comes next on `channel` (non-blocking), read by a raw read() of the
// descriptor: ibv_get_cq_event without the provider's cq_event hook, which only providers that
// arm CQs in user space have (to count arms), so only for those that arm through the kernel
// (ArmsThroughKernel). Null, errno set, when no event is there (EAGAIN) or the read failed. The
// event must still be acknowledged (ibv_ack_cq_events) before the CQ is destroyed.
ibv_cq* ReadCqEvent(ibv_comp_channel* channel);

// Whether `verbs`'s provider arms CQs with libibverbs' kernel command, as is (rxe does; hardware
// providers such as mlx5 ring a doorbell from user space), so that ArmByKernelCommand may stand
// in for ibv_req_notify_cq and ReadCqEvent for ibv_get_cq_event. False when
// RDMARPC_NO_DIRECT_ARM is set.
bool ArmsThroughKernel(ibv_context* verbs);

// Per I/O thread and device: the PD, one completion channel whose fd the thread's Poller watches
// (transport/poller.h: registered once, no system call per sleep), one SRQ and
// one or more CQs. A CQ takes connections only while the worst case fits in it: every SRQ receive
// completed into it plus every connection's send queue flushed into it at once. Past that a new
// CQ is created on the same channel, so the number of connections is not bounded by max_cqe.
class ThreadDevice : public std::enable_shared_from_this<ThreadDevice> {
 public:
  struct CqSlot {
    Cq cq;
    unsigned unacked = 0;  // events read (NextEvent) but not yet acknowledged
    unsigned conns = 0;
    bool evented = false;
    // Armed with ibv_req_notify_cq and its event not read yet. A CQ raises at most one event
    // per arming, so the channel holds at most one event per armed CQ (TakeEventsAndRearm).
    bool armed = false;
  };

  // The device state of the I/O thread that runs `ex`, created on first use. Call on that thread.
  // The first connection or listener on the thread sets its polling (Options::busy_poll and
  // poll_spin_us); later ones share it.
  static Expected<std::shared_ptr<ThreadDevice>> For(const Executor& ex, ibv_context* verbs,
                                                     const Options& options);

  ~ThreadDevice();

  // Stops waiting on the completion fd, and sweeping; for when the io_context goes away first
  // (its poller forgets the registration itself).
  void Detach() {
    registration_ = nullptr;
    sweep_registration_ = nullptr;
    sweep_fd_ = -1;
    detached_ = true;
  }

  ibv_pd* pd() const { return pd_.get(); }
  ibv_srq* srq() const { return srq_.get(); }
  // Whether rings can be exposed through type-2 memory windows (bound to one QP each).
  bool qp_bound_windows() const { return mw_type2_; }

  // A CQ with room for one more connection whose send queue holds `send_depth` requests.
  Expected<CqSlot*> AcquireCq(uint32_t send_depth);
  void ReleaseCq(CqSlot* slot) { --slot->conns; }

  // A connection's send staging buffer (kRingBytes), carved from slabs this thread registered
  // with local access only: connecting costs no registration for it, and the peer cannot touch
  // it. Held only while the connection sends: while any is out, the thread sweeps its
  // connections every kStagingSweepMs (CompletionSink::OnSweep) and quiet ones give theirs
  // back. A thread's slabs hold 1, 2, 4, then kSendBuffersPerSlab buffers (a client thread with
  // one connection pins one buffer, a server with many registers once per 8). Buffers are taken
  // from the oldest slab with one free, so that after a peak of connections the newer slabs
  // empty out; a slab whose buffers are all free is deregistered and freed, but for one kept
  // for the next connections (so that a client connecting and leaving again and again does not
  // register a slab each time).
  struct Slab {
    AlignedBuffer mem;
    Mr mr;                   // declared after mem: deregistered before it is freed
    uint32_t all_free = 0;   // a bit per buffer
    uint32_t free_mask = 0;  // bit i: buffer i is free
  };
  struct SendBuffer {
    std::byte* data = nullptr;
    uint32_t lkey = 0;
    Slab* slab = nullptr;
  };
  Expected<SendBuffer> AcquireSendBuffer();
  // Only once the QP that used `b` is destroyed.
  void ReleaseSendBuffer(SendBuffer b);

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
  static size_t BulkClass(size_t bytes, size_t* capacity);
  // One of at least `bytes`, from the cache when one of its size class is free.
  Expected<BulkBuffer> AcquireBulk(size_t bytes);
  // Only once no QP can touch `b` any more (its window invalidated, its read finished, or the
  // QP destroyed). Kept registered while the cache has room, else deregistered and freed.
  void ReleaseBulk(BulkBuffer b);

  // RDMA READs a connection may have outstanding, and serve, at once (CM conn_param).
  uint8_t rd_atom() const { return rd_atom_; }

  void Register(uint32_t qp_num, std::weak_ptr<CompletionSink> c) { by_qp_[qp_num] = std::move(c); }
  void Unregister(uint32_t qp_num) {
    if (qp_num == last_qp_) last_sink_ = nullptr;
    by_qp_.erase(qp_num);
  }

 private:
  ThreadDevice(const Executor& ex, ibv_context* verbs, const Options& options)
      : ex_(ex),
        verbs_(verbs),
        direct_arm_(ArmsThroughKernel(verbs)),
        busy_poll_(options.busy_poll),
        spin_window_ns_(uint64_t(std::max(0, options.poll_spin_us)) * 1000),
        spin_window_(clock_.FromNanos(spin_window_ns_)),
        count_period_(clock_.FromNanos(kCountPeriodNs)),
        burst_(clock_.FromNanos(kSpinBurstNs)) {}

  Expected<void> Init();

  // Posts `n` zero-length receives (RDMA_WRITE_WITH_IMM needs a receive but no buffer) in
  // chains of up to 64, one doorbell each.
  bool PostReceives(uint32_t n);

  // Starts the thread's polling: a busy-poll loop, or a wait on the completion channel.
  void Arm();

  // Waits for the completion channel. Every CQ is armed (ibv_req_notify_cq) while this waits.
  void Sleep();
  // The poller says the completion channel has events (edge-triggered: once per new event). Wakes a
  // sleeping thread; otherwise remembers it for the next Sleep, because the channel will not be
  // reported again until more events come.
  void OnChannelReady();
  class Waker;

  // Takes the channel's pending events (non-blocking) and re-arms the CQs that raised them, before
  // they are polled, so that a completion landing in between raises a new event. Marks them.
  void TakeEventsAndRearm();
  // One event of `slot`'s CQ read: it is no longer armed; acknowledged in batches.
  void TookEvent(CqSlot& slot);
  // Arms `cq` for its next event (ibv_req_notify_cq); false if that failed. Where the provider
  // arms through the kernel (ArmsThroughKernel), by ArmByKernelCommand: the same command,
  // without libibverbs' general marshalling of it into an ioctl (~215 instructions per wake-up
  // on each side in the VM's profile, against ~30). Should the kernel refuse the direct command,
  // libibverbs' way from then on.
  bool ArmCq(ibv_cq* cq);
  // The CQ of the channel's next event, or null when none is there (non-blocking): by
  // ReadCqEvent where ArmCq writes the kernel's command (~65 instructions per wake-up on each
  // side less than ibv_get_cq_event and glibc's read(), a cancellation point), else by
  // ibv_get_cq_event.
  ibv_cq* NextEvent();
  // Sleep's rare case, out of line: the channel reported events while the thread was busy.
  void TakeReportedLater();

  // Adaptive polling. Once the CQs are drained, the thread keeps polling them from posted
  // handlers (so its other work runs in between) for spin_window_ after the last completion,
  // and only then goes back to sleeping on the channel: a request-reply exchange whose answer
  // comes within the window costs no wake-up (an event, an epoll return and a re-arm on each
  // side, the bulk of a small call's latency in events mode), while an idle thread sleeps.
  // CQs stay armed while spinning, so each raises at most one event meanwhile; those are taken
  // when the window closes.
  void StartSpin();
  void PostSpin();
  void Spin();

  // Polls the CQs that had an event. A CQ that still has completions after its budget stays
  // marked and is polled again from a posted handler, so that the work those completions
  // started (handler coroutines finishing, replies, timers) runs in between; only when every CQ
  // is drained does the thread go back to waiting on the completion channel.
  void DrainEvented();

  // Takes up to kPollBudget completions from `cq` and returns how many: kPollBudget means some
  // may be left.
  uint32_t Poll(ibv_cq* cq);
  // The time accounting: CountTime adds the ticks since mark_ to `s`'s share and moves mark_ to
  // `now` (a clock_ reading). CountTimes converts the shares and adds them to the stats, and
  // re-measures the clock's rate (a steady_clock read), once kCountPeriodNs have passed since it
  // last did: the stats trail by at most that, plus the interval in progress (a sleep counts
  // when it ends, as before).
  enum TimeShare { kBusyPollShare, kSpinShare, kSleepShare, kTimeShares };
  void CountTime(TimeShare s, uint64_t now) {
    const uint64_t ticks = now > mark_ ? now - mark_ : 0;
    mark_ = now;
    uncounted_[s] += ticks;
    if (now - counted_at_ >= count_period_) [[unlikely]]
      CountTimes(now);
  }
  void CountTimes(uint64_t now);
  static constexpr uint64_t kCountPeriodNs = 100'000'000;
  // While staging buffers are out: every kStagingSweepMs, each connection's OnSweep. The
  // period comes from a timerfd watched by the thread's Poller, not an Asio timer: a pending
  // Asio wait is work that keeps io_context::run() from returning, and an event loop whose
  // owner lets it run out of work (EventLoopThread's destructor) was held up by it.
  void StartSweeps();
  void OnSweepTimer();
  void Sweep();
  void ArmSweepTimer(bool on);

  // Polls every CQ once (up to kPollBudget each); returns how many completions it took.
  uint32_t PollAll();
  // PollAll until one takes something, until `until` (a clock_ reading) has passed, or until
  // another thread posts work to the loop (both looked at every kSpinBurst polls, so at least
  // that many); returns how many it took.
  uint32_t PollBurst(uint64_t until);

  Executor ex_;
  ibv_context* verbs_;
  bool direct_arm_;  // ArmCq writes the kernel's command itself; NextEvent reads events itself
  // Declaration order is destruction order reversed: CQs and SRQ before the channel and the PD.
  Pd pd_;
  CompChannel channel_;
  Srq srq_;
  std::vector<std::unique_ptr<CqSlot>> cqs_;
  std::vector<std::unique_ptr<Slab>> slabs_;        // oldest first
  std::vector<std::vector<BulkBuffer>> bulk_free_;  // by size class
  size_t bulk_cached_ = 0;
  uint32_t cqe_ = 0, srq_depth_ = 0;
  uint32_t receives_owed_ = 0;  // consumed SRQ receives not yet reposted (< repost_batch_)
  uint32_t repost_batch_ = 1;
  uint8_t rd_atom_ = 1;
  bool mw_type2_ = false;
  uint32_t staged_ = 0;  // send staging buffers out (AcquireSendBuffer)
  // The sweeps' timerfd (its number, while the poller holds it) and its registration; armed
  // while `sweeping_`.
  Poller::Registration* sweep_registration_ = nullptr;
  int sweep_fd_ = -1;
  bool sweeping_ = false;
  bool detached_ = false;  // Detach: the io_context is going
  // The completion channel's registration with the thread's Poller (through a Waker, which
  // holds this device weakly: the poller must not keep the device alive).
  Poller::Registration* registration_ = nullptr;
  Poller* poller_ = nullptr;    // the loop's: set (For) before any registration, kept after
  bool sleeping_ = false;       // waiting for the channel: its next event wakes the thread
  bool channel_ready_ = false;  // the channel reported events while the thread was not asleep
  bool busy_poll_;
  TickClock clock_;
  uint64_t spin_window_ns_;
  uint64_t spin_window_;  // in clock_ ticks (re-derived as the clock's rate is re-measured)
  uint64_t spin_until_ = 0;
  // Where the time accounting (CountTime) last stopped: busy-poll, spin or sleep started there.
  uint64_t mark_ = clock_.Now();
  uint64_t counted_at_ = mark_;  // CountTimes last ran
  uint64_t count_period_;        // kCountPeriodNs in ticks
  uint64_t burst_;               // kSpinBurstNs in ticks
  uint64_t uncounted_[kTimeShares] = {};
  std::unordered_map<uint32_t, std::weak_ptr<CompletionSink>> by_qp_;
  // The QP of the last completion and its entry in by_qp_ (null: none): a connection's
  // completions tend to come in runs, and a hit skips the hash look-up (~17 instructions per
  // completion). Entries of an unordered_map stay put until erased; Unregister forgets it.
  uint32_t last_qp_ = 0;
  std::weak_ptr<CompletionSink>* last_sink_ = nullptr;

  // The entry for `qp_num`, or null when no connection has it (any more).
  std::weak_ptr<CompletionSink>* SinkOf(uint32_t qp_num) {
    if (last_sink_ != nullptr && qp_num == last_qp_) [[likely]]
      return last_sink_;
    auto it = by_qp_.find(qp_num);
    if (it == by_qp_.end()) return nullptr;
    last_qp_ = qp_num;
    last_sink_ = &it->second;
    return last_sink_;
  }
};

}  // namespace rdmarpc::transport::rdma

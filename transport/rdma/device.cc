#include "transport/rdma/device.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <rdma/ib_user_verbs.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <boost/asio/post.hpp>
#include <cstring>
#include <map>

#include "transport/tsan_wire.h"

namespace rdmarpc::transport::rdma {
namespace asio = boost::asio;

bool ArmByKernelCommand(ibv_cq* cq) {
  // The uverbs write interface: a header counting 32-bit words (itself included), then the
  // command. A raw system call: glibc's write() is a cancellation point (~30 instructions more,
  // for nothing here).
  struct {
    ib_uverbs_cmd_hdr hdr;
    ib_uverbs_req_notify_cq cmd;
  } req{};
  static_assert(sizeof(req) % 4 == 0);
  req.hdr.command = IB_USER_VERBS_CMD_REQ_NOTIFY_CQ;
  req.hdr.in_words = sizeof(req) / 4;
  req.cmd.cq_handle = cq->handle;  // solicited_only 0: every completion raises the event
  return ::syscall(SYS_write, cq->context->cmd_fd, &req, sizeof(req)) == long{sizeof(req)};
}

ibv_cq* ReadCqEvent(ibv_comp_channel* channel) {
  // What ibv_get_cq_event reads: the kernel writes the CQ's user handle, which libibverbs set
  // to the ibv_cq's address when it created the CQ. A raw system call, as in ArmByKernelCommand.
  ib_uverbs_comp_event_desc event;
  if (::syscall(SYS_read, channel->fd, &event, sizeof event) != long{sizeof event}) return nullptr;
  return reinterpret_cast<ibv_cq*>(static_cast<uintptr_t>(event.cq_handle));
}

bool ArmsThroughKernel(ibv_context* verbs) {
  // ibv_req_notify_cq calls the context's op; libibverbs' kernel command is a private symbol,
  // looked up by name so that nothing links against its version.
  using ReqNotify = int (*)(ibv_cq*, int);
  static const auto kernel_command =
      reinterpret_cast<ReqNotify>(::dlsym(RTLD_DEFAULT, "ibv_cmd_req_notify_cq"));
  return kernel_command != nullptr && verbs->ops.req_notify_cq == kernel_command &&
         std::getenv("RDMARPC_NO_DIRECT_ARM") == nullptr;
}

// A descriptor's client at the thread's Poller (the completion channel's, the sweeps' timerfd's):
// calls `ready` when it is readable. Holds the device weakly, so that the device goes when its
// last connection does (the poller would otherwise keep it, its pinned memory included, as long
// as the io_context lives).
class ThreadDevice::Waker final : public Poller::Client {
 public:
  Waker(std::weak_ptr<ThreadDevice> d, void (ThreadDevice::*ready)())
      : device_(std::move(d)), ready_(ready) {}
  void OnReady(bool) override {
    if (auto d = device_.lock()) (d.get()->*ready_)();
  }
  void OnPollerGone() override {
    if (auto d = device_.lock()) d->Detach();
  }

 private:
  std::weak_ptr<ThreadDevice> device_;
  void (ThreadDevice::*ready_)();
};

ThreadDevice::~ThreadDevice() {
  // (Detach forgot them if the io_context went first.) Each client is dropped from a posted
  // handler: this may run inside its own call.
  for (Poller::Registration* r : {registration_, sweep_registration_}) {
    if (!r) continue;
    std::shared_ptr<Poller::Client> held = poller_->Remove(r);
    if (held) asio::post(ex_, [held = std::move(held)] {});
  }
  registration_ = sweep_registration_ = nullptr;
  for (auto& slot : cqs_) {
    if (slot->unacked) ibv_ack_cq_events(slot->cq.get(), slot->unacked);
  }
}

Expected<ThreadDevice::CqSlot*> ThreadDevice::AcquireCq(uint32_t send_depth) {
  const unsigned per_cq = std::max<unsigned>(1, (cqe_ - srq_depth_) / send_depth);
  for (auto& slot : cqs_) {
    if (slot->conns < per_cq) {
      ++slot->conns;
      return slot.get();
    }
  }
  auto slot = std::make_unique<CqSlot>();
  // The CQ's context is its slot: an event names it without a search (TakeEventsAndRearm).
  slot->cq.reset(ibv_create_cq(verbs_, cqe_, slot.get(), channel_.get(), 0));
  if (!slot->cq) return Error{Errno("ibv_create_cq")};
  if (!ArmCq(slot->cq.get())) return Error{Errno("ibv_req_notify_cq")};
  slot->armed = true;
  slot->conns = 1;
  cqs_.push_back(std::move(slot));
  return cqs_.back().get();
}

Expected<ThreadDevice::SendBuffer> ThreadDevice::AcquireSendBuffer() {
  static_assert(kSendBuffersPerSlab <= 32, "Slab::free_mask has a bit per buffer");
  // At connection set-up, not per message: a walk over the slabs is cheap next to the QP.
  Slab* slab = nullptr;
  for (auto& s : slabs_) {
    if (s->free_mask != 0) {
      slab = s.get();
      break;
    }
  }
  if (!slab) {
    const uint32_t n =
        std::min<uint32_t>(kSendBuffersPerSlab, 1u << std::min<size_t>(slabs_.size(), 5));
    auto fresh = std::make_unique<Slab>();
    fresh->mem = AllocAligned(size_t(n) * kRingBytes);
    if (!fresh->mem) return Error{"out of memory for send buffers"};
    fresh->mr.reset(
        ibv_reg_mr(pd_.get(), fresh->mem.get(), size_t(n) * kRingBytes, IBV_ACCESS_LOCAL_WRITE));
    if (!fresh->mr) return Error{RegisterErrno("ibv_reg_mr (send slab)")};
    fresh->all_free = n == 32 ? ~0u : (1u << n) - 1;
    fresh->free_mask = fresh->all_free;
    slab = fresh.get();
    slabs_.push_back(std::move(fresh));
  }
  const int i = std::countr_zero(slab->free_mask);
  slab->free_mask &= ~(1u << i);
  ++staged_;
  StartSweeps();
  return SendBuffer{slab->mem.get() + size_t(i) * kRingBytes, slab->mr->lkey, slab};
}

void ThreadDevice::ReleaseSendBuffer(SendBuffer b) {
  --staged_;
  Slab* slab = b.slab;
  const auto i = static_cast<uint32_t>((b.data - slab->mem.get()) / kRingBytes);
  slab->free_mask |= 1u << i;
  if (slab->free_mask != slab->all_free) return;
  // All of this slab is free. At most one such slab is kept: the oldest.
  auto empty = [](const std::unique_ptr<Slab>& s) { return s->free_mask == s->all_free; };
  auto oldest = std::find_if(slabs_.begin(), slabs_.end(), empty);
  if (oldest->get() != slab) {
    slabs_.erase(std::find_if(slabs_.begin(), slabs_.end(),
                              [slab](const auto& s) { return s.get() == slab; }));
    return;
  }
  // This one is the oldest empty slab: free the other empty one, if there is one (newer).
  if (auto newer = std::find_if(std::next(oldest), slabs_.end(), empty); newer != slabs_.end()) {
    slabs_.erase(newer);
  }
}

void ThreadDevice::StartSweeps() {
  if (sweeping_ || detached_) return;
  if (!sweep_registration_) {
    const int fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    int error = errno;
    if (fd >= 0) {
      sweep_registration_ = poller_->Add(
          fd, std::make_shared<Waker>(weak_from_this(), &ThreadDevice::OnSweepTimer), &error);
    }
    if (!sweep_registration_) {
      // Not fatal: connections then keep their send buffers, as they did before sweeps.
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true)) {
        spdlog::warn("rdma: no timer for returning idle connections' send buffers: {}",
                     std::strerror(error));
      }
      return;
    }
    sweep_fd_ = fd;
  }
  ArmSweepTimer(true);
}

void ThreadDevice::ArmSweepTimer(bool on) {
  sweeping_ = on;
  if (sweep_fd_ < 0) return;
  itimerspec t{};
  if (on) {
    t.it_value.tv_sec = kStagingSweepMs / 1000;
    t.it_value.tv_nsec = (kStagingSweepMs % 1000) * 1000000L;
    t.it_interval = t.it_value;
  }
  ::timerfd_settime(sweep_fd_, 0, &t, nullptr);
}

void ThreadDevice::OnSweepTimer() {
  uint64_t expirations;
  while (sweep_fd_ >= 0 && ::read(sweep_fd_, &expirations, sizeof expirations) > 0) {
  }  // (edge-triggered: read until EAGAIN)
  if (sweeping_) Sweep();
}

void ThreadDevice::Sweep() {
  // Collected first: a connection may close and go while it is looked at (its destructor
  // unregisters it from by_qp_).
  std::vector<std::shared_ptr<CompletionSink>> sinks;
  sinks.reserve(by_qp_.size());
  for (auto& [qp, weak] : by_qp_) {
    if (auto c = weak.lock()) sinks.push_back(std::move(c));
  }
  for (auto& c : sinks) c->OnSweep();
  sinks.clear();
  // Nothing out: no more wake-ups until a connection sends again.
  if (staged_ == 0) ArmSweepTimer(false);
}

size_t ThreadDevice::BulkClass(size_t bytes, size_t* capacity) {
  size_t cls = 0;
  while ((kBulkMinBytes << cls) < bytes) ++cls;
  *capacity = kBulkMinBytes << cls;
  return cls;
}

Expected<ThreadDevice::BulkBuffer> ThreadDevice::AcquireBulk(size_t bytes) {
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
  // kMessageSlopBytes past what is registered: a message read into it is handed up in place.
  if (posix_memalign(&p, 4096, cap + kMessageSlopBytes) != 0) {
    return Error{"out of memory for a large message"};
  }
  b.mem.reset(static_cast<std::byte*>(p));
  b.mr.reset(
      ibv_reg_mr(pd_.get(), p, cap, IBV_ACCESS_LOCAL_WRITE | (mw_type2_ ? IBV_ACCESS_MW_BIND : 0)));
  if (!b.mr) return Error{RegisterErrno("ibv_reg_mr (large message)")};
  b.capacity = cap;
  return b;
}

void ThreadDevice::ReleaseBulk(BulkBuffer b) {
  if (!b || bulk_cached_ + b.capacity > kBulkCacheBytes) return;
  size_t cap = 0;
  const size_t cls = BulkClass(b.capacity, &cap);
  if (bulk_free_.size() <= cls) bulk_free_.resize(cls + 1);
  bulk_cached_ += b.capacity;
  bulk_free_[cls].push_back(std::move(b));
}

Expected<void> ThreadDevice::Init() {
  ibv_device_attr attr{};
  if (ibv_query_device(verbs_, &attr)) return Error{Errno("ibv_query_device")};
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
  if (!pd_) return Error{Errno("ibv_alloc_pd")};
  channel_.reset(ibv_create_comp_channel(verbs_));
  if (!channel_) return Error{Errno("ibv_create_comp_channel")};
  cqe_ = static_cast<uint32_t>(std::min(attr.max_cqe, 65535));
  srq_depth_ = std::min<uint32_t>({kSrqDepth, static_cast<uint32_t>(attr.max_srq_wr), cqe_ / 2});
  if (srq_depth_ == 0) return Error{"the RDMA device supports no shared receive queue"};
  repost_batch_ = std::clamp<uint32_t>(srq_depth_ / 8, 1, kSrqRepostBatch);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = srq_depth_;
  sa.attr.max_sge = 1;
  srq_.reset(ibv_create_srq(pd_.get(), &sa));
  if (!srq_) return Error{Errno("ibv_create_srq")};
  if (!PostReceives(srq_depth_)) return Error{Errno("ibv_post_srq_recv")};
  if (!SetNonBlocking(channel_->fd)) return Error{Errno("fcntl")};
  return {};
}

bool ThreadDevice::PostReceives(uint32_t n) {
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

void ThreadDevice::Arm() {
  if (busy_poll_) {
    std::weak_ptr<ThreadDevice> weak = shared_from_this();
    asio::post(ex_, [weak] {
      if (auto self = weak.lock()) {
        self->PollBurst(self->clock_.Now() + self->burst_);
        self->CountTime(kBusyPollShare, self->clock_.Now());
        self->Arm();
      }
    });
    return;
  }
  Sleep();
}

void ThreadDevice::Sleep() {
  mark_ = clock_.Now();
  if (channel_ready_) [[unlikely]] {
    TakeReportedLater();
    return;
  }
  // The registration with the poller is permanent: sleeping costs no system call, and the
  // channel's next event wakes the thread through OnChannelReady.
  sleeping_ = true;
}

void ThreadDevice::TakeReportedLater() {
  // Events came while the thread was busy; the poller will not say so again. Take them now,
  // from a handler of their own (Sleep may be inside a drain or spin step).
  channel_ready_ = false;
  std::weak_ptr<ThreadDevice> weak = shared_from_this();
  asio::post(ex_, [weak] {
    if (auto self = weak.lock()) {
      self->TakeEventsAndRearm();
      self->DrainEvented();
    }
  });
}

void ThreadDevice::OnChannelReady() {
  if (!sleeping_) {
    channel_ready_ = true;
    return;
  }
  sleeping_ = false;
  channel_ready_ = false;
  Count(Stat::kRdmaWakeups);
  CountTime(kSleepShare, clock_.Now());
  TakeEventsAndRearm();
  DrainEvented();
}

void ThreadDevice::TakeEventsAndRearm() {
  // What the poller reported so far is taken here; events after this are reported anew.
  channel_ready_ = false;
  if (cqs_.size() == 1) [[likely]] {
    // The usual thread, with up to ~100 connections (AcquireCq): one CQ. Written out rather
    // than left to the loops below, whose counting and walking of the CQ list cost ~30
    // instructions per wake-up more even with one entry (callgrind in the VM, both sides).
    CqSlot& slot = *cqs_.front();
    if (slot.armed && NextEvent() != nullptr) TookEvent(slot);
    if (slot.evented && !slot.armed) slot.armed = ArmCq(slot.cq.get());
    return;
  }
  // Read events only while an armed CQ may still have one queued: once every armed CQ's event
  // is read, the channel is empty (no CQ raises a second event before it is re-armed), so the
  // poller's edge-triggered watch sees the next one. Reading on until EAGAIN cost a read()
  // system call per wake-up that never returned anything when one CQ serves the thread.
  size_t armed = 0;
  for (auto& slot : cqs_) armed += slot->armed;
  while (armed > 0) {
    ibv_cq* cq = NextEvent();
    if (cq == nullptr) break;
    // Each CQ's context is its slot (AcquireCq).
    auto& slot = *static_cast<CqSlot*>(cq->cq_context);
    armed -= slot.armed;
    TookEvent(slot);
  }
  for (auto& slot : cqs_) {
    if (slot->evented && !slot->armed) slot->armed = ArmCq(slot->cq.get());
  }
}

void ThreadDevice::TookEvent(CqSlot& slot) {
  slot.armed = false;
  slot.evented = true;
  // Acknowledge in batches: each ack takes a mutex inside libibverbs.
  if (++slot.unacked >= 64) [[unlikely]] {
    ibv_ack_cq_events(slot.cq.get(), slot.unacked);
    slot.unacked = 0;
  }
}

ibv_cq* ThreadDevice::NextEvent() {
  if (direct_arm_) [[likely]]
    return ReadCqEvent(channel_.get());
  ibv_cq* cq;
  void* ctx;
  return ibv_get_cq_event(channel_.get(), &cq, &ctx) == 0 ? cq : nullptr;
}

bool ThreadDevice::ArmCq(ibv_cq* cq) {
  if (direct_arm_) [[likely]] {
    if (ArmByKernelCommand(cq)) return true;
    spdlog::warn("rdma: arming a CQ by its kernel command failed ({}); using ibv_req_notify_cq",
                 std::strerror(errno));
    direct_arm_ = false;
  }
  return ibv_req_notify_cq(cq, 0) == 0;
}

void ThreadDevice::StartSpin() {
  mark_ = clock_.Now();
  spin_until_ = mark_ + spin_window_;
  PostSpin();
}

void ThreadDevice::PostSpin() {
  std::weak_ptr<ThreadDevice> weak = shared_from_this();
  asio::post(ex_, [weak] {
    if (auto self = weak.lock()) self->Spin();
  });
}

void ThreadDevice::Spin() {
  uint32_t taken = PollBurst(std::min(clock_.Now() + burst_, spin_until_));
  const uint64_t now = clock_.Now();
  CountTime(kSpinShare, now);
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

void ThreadDevice::DrainEvented() {
  bool more = false;
  for (auto& slot : cqs_) {
    if (!slot->evented) continue;
    slot->evented = Poll(slot->cq.get()) >= kPollBudget;
    more = more || slot->evented;
  }
  if (!more) {
    if (spin_window_ns_ > 0) {
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

void ThreadDevice::CountTimes(uint64_t now) {
  counted_at_ = now;
  clock_.Calibrate();
  static constexpr Stat kStats[kTimeShares] = {Stat::kRdmaBusyPollNanos, Stat::kRdmaSpinNanos,
                                               Stat::kRdmaSleepNanos};
  for (int i = 0; i < kTimeShares; ++i) {
    if (uncounted_[i]) Count(kStats[i], clock_.ToNanos(uncounted_[i]));
    uncounted_[i] = 0;
  }
  spin_window_ = clock_.FromNanos(spin_window_ns_);
  count_period_ = clock_.FromNanos(kCountPeriodNs);
  burst_ = clock_.FromNanos(kSpinBurstNs);
}

uint32_t ThreadDevice::PollAll() {
  uint32_t taken = 0;
  for (auto& slot : cqs_) taken += Poll(slot->cq.get());
  return taken;
}

uint32_t ThreadDevice::PollBurst(uint64_t until) {
  const long work = poller_->WorkCount();
  for (;;) {
    for (uint32_t i = 0; i < kSpinBurst; ++i) {
      if (const uint32_t taken = PollAll()) return taken;
    }
    if (clock_.Now() >= until || poller_->WorkCount() != work) return 0;
  }
}

uint32_t ThreadDevice::Poll(ibv_cq* cq) {
  ibv_wc wcs[32];
  uint32_t taken = 0, polls = 0;
  while (taken < kPollBudget) {
    int n = ibv_poll_cq(cq, 32, wcs);
    ++polls;
    if (n <= 0) break;
    TsanReceived();  // transport/tsan_wire.h
    taken += static_cast<uint32_t>(n);
    uint32_t receives = 0;
    for (int i = 0; i < n; ++i) {
      // Every receive completion, even of a closed connection or with an error, used one SRQ WR.
      if (wcs[i].wr_id == kRecvWrId) ++receives;
      std::weak_ptr<CompletionSink>* sink = SinkOf(wcs[i].qp_num);
      if (sink == nullptr) continue;
      if (auto c = sink->lock()) c->OnCompletion(wcs[i]);
    }
    receives_owed_ += receives;
    if (receives_owed_ >= repost_batch_) {
      if (!PostReceives(receives_owed_)) {
        spdlog::error("rdma: ibv_post_srq_recv failed: {}", std::strerror(errno));
      }
      receives_owed_ = 0;
    }
    // Fewer than asked for: the CQ was empty just now. Asking again would almost always find
    // nothing (one more poll per wake-up); what completes from here on raises an event (the CQ
    // was re-armed before this drain) or is found by the next spin or busy poll.
    if (n < 32) break;
  }
  Count(Stat::kRdmaCqPolls, polls);
  if (taken) Count(Stat::kRdmaCompletions, taken);
  return taken;
}

namespace {
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
}  // namespace

Expected<std::shared_ptr<ThreadDevice>> ThreadDevice::For(const Executor& ex, ibv_context* verbs,
                                                          const Options& options) {
  auto& service = asio::use_service<DeviceService>(asio::query(ex, asio::execution::context));
  auto& slot = service.devices_[verbs];
  if (auto d = slot.lock()) return d;
  auto d = std::shared_ptr<ThreadDevice>(new ThreadDevice(ex, verbs, options));
  if (auto inited = d->Init(); !inited.ok()) return inited.error();
  // The poller gets a duplicate of the channel's descriptor, which it closes itself once it has
  // let go of it (possibly after the channel is destroyed).
  int error = 0;
  const int fd = ::fcntl(d->channel_->fd, F_DUPFD_CLOEXEC, 0);
  if (fd >= 0) {
    d->poller_ = &Poller::For(ex);
    d->registration_ =
        d->poller_->Add(fd, std::make_shared<Waker>(d, &ThreadDevice::OnChannelReady), &error);
  } else {
    error = errno;
  }
  if (!d->registration_) {
    return Error{std::string("watching the completion channel: ") + std::strerror(error)};
  }
  slot = d;
  d->Arm();
  return d;
}

}  // namespace rdmarpc::transport::rdma

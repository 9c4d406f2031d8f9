#include "transport/rdma/connection.h"

#include <endian.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>
#include <new>
#include <random>

#include "transport/tsan_wire.h"

namespace rdmarpc::transport::rdma {
namespace asio = boost::asio;

Hello WithRing(Hello h, const RingDescriptor& d) {
  h.ring_addr = d.addr;
  h.ring_rkey = d.rkey;
  h.ring_bytes = d.bytes;
  return h;
}

Expected<PeerHello> DecodePeerHello(const void* data, size_t len) {
  Expected<Hello> hello = DecodeHello(data, len);
  if (!hello.ok()) return hello.error();
  const Hello& h = hello.value();
  const RingDescriptor d{h.ring_addr, h.ring_rkey, h.ring_bytes};
  // A sender stages each record at the same offset as in the peer's ring, so it can write into a
  // ring no larger than its own staging buffer (kRingBytes).
  if (d.bytes < 4096 || d.bytes % kRecordAlignBytes != 0 || d.bytes > kRingBytes) {
    return Error{"peer ring size " + std::to_string(d.bytes) + " is not usable (4 KiB to " +
                 std::to_string(kRingBytes >> 10) + " KiB, a multiple of 64)"};
  }
  return PeerHello{h, d};
}

namespace {
uint32_t RandomByte() {
  static thread_local std::mt19937 rng(std::random_device{}());
  return rng() & 0xff;
}
}  // namespace

RdmaConnection::~RdmaConnection() {
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

Expected<void> RdmaConnection::Adopt(CmId id, EventChannel events) {
  id_ = std::move(id);
  events_ = std::move(events);
  if (!SetNonBlocking(events_->fd)) return Error{Errno("fcntl")};
  boost::system::error_code ec;
  event_fd_.assign(events_->fd, ec);
  if (ec) return Error{"assign CM fd: " + ec.message()};
  return {};
}

static_assert(RecordAssembler::kSlopBytes >= kMessageSlopBytes);

Expected<void> RdmaConnection::Setup() {
  if (id_->verbs == nullptr) return Error{"the CM id is not bound to an RDMA device"};
  auto dev = ThreadDevice::For(executor_, id_->verbs, options_);
  if (!dev.ok()) return dev.error();
  dev_ = dev.value();
  // Followed by kMessageSlopBytes that are not registered: a message that ends at the ring's
  // end is followed by readable bytes too (transport.h).
  recv_buf_ = AllocAligned(kRingBytes + kMessageSlopBytes);
  if (!recv_buf_) return Error{"out of memory for the receive ring"};
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
  if (!recv_mr_) return Error{RegisterErrno("ibv_reg_mr (receive ring)")};
  ring_rkey_ = recv_mr_->rkey;
  auto slot = dev_->AcquireCq(kSendDepth);
  if (!slot.ok()) return slot.error();
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
    if (rdma_create_qp(id_.get(), dev_->pd(), &qa)) return Error{Errno("rdma_create_qp")};
  }
  max_inline_ = qa.cap.max_inline_data;
  send_depth_ = qa.cap.max_send_wr;
  qp_num_ = id_->qp->qp_num;
  if (windows) {
    // Allocated after the QP on purpose: a process that dies has its verbs objects destroyed
    // newest first, and rxe (kernel 6.1) stalls 50 s destroying a QP that a bound window
    // still references, which kept killed servers from disconnecting their clients.
    recv_mw_.reset(ibv_alloc_mw(dev_->pd(), IBV_MW_TYPE_2));
    if (!recv_mw_) return Error{Errno("ibv_alloc_mw")};
    uint8_t key = 0;
    while (key == 0 || key == (recv_mw_->rkey & 0xff)) key = static_cast<uint8_t>(RandomByte());
    ring_rkey_ = (recv_mw_->rkey & 0xffffff00u) | key;
  }
  dev_->Register(qp_num_, weak_from_this());
  return {};
}

void RdmaConnection::SetRemoteRing(const RingDescriptor& d) {
  remote_ = d;
  // What every write into the peer's ring has in common (PostWrite fills in the rest).
  write_wr_ = ibv_send_wr{};
  write_wr_.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  write_wr_.wr.rdma.rkey = remote_.rkey;
  write_wr_.sg_list = &write_sge_;
  write_sge_ = ibv_sge{};
  write_sge_.lkey = send_.lkey;
  // No credit until the peer grants its ring (it may not be writable yet: see Open()).
  send_ring_ = SendRing(d.bytes, /*granted=*/false);
}

Expected<void> RdmaConnection::Open() {
  if (recv_mw_) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_BIND_MW;
    wr.bind_mw.mw = recv_mw_.get();
    wr.bind_mw.rkey = ring_rkey_;
    wr.bind_mw.bind_info.mr = recv_mr_.get();
    wr.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(recv_buf_.get());
    wr.bind_mw.bind_info.length = kRingBytes;
    wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (!PostSend(wr)) return Error{"cannot bind the receive ring's memory window"};
  }
  if (!PostWrite(0, 0, kImmCreditBit | (kRingBytes / kRecordAlignBytes))) {
    return Error{"cannot grant the receive ring"};
  }
  return {};
}

asio::awaitable<CmEvent> RdmaConnection::NextEvent(int timeout_ms) {
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

void RdmaConnection::WatchEvents() {
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

void RdmaConnection::Start(std::shared_ptr<ConnectionHandler> handler) {
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

bool RdmaConnection::Send(const MessageWriter& message) {
  if (handler_.closed() || closing_) return false;
  const size_t n = message.size();
  if (n > options_.max_message_bytes) return false;
  const bool fits_record = n + kRecordHeaderBytes <= send_ring_.max_record_bytes();
  if (pending_.empty() && fits_record && CanPost()) {
    if (!HaveStaging()) return false;
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
    if (big.ok()) {
      out.big = std::move(big.value());
      message.WriteTo(out.big.data());
    } else {
      // Registration failed, usually at the locked-memory limit: the message still goes, in
      // chunks through the ring (below), as the peer accepts either way; slower, not lost.
      Count(Stat::kRdmaUnregisteredSent);
      WarnChunkedFallback(n, big.error().message);
    }
  }
  if (!out.big) {
    // No credit or no send-queue room (or too big for one record, without memory windows or
    // registered memory for it: sent in chunks): keep a copy and send it in order as credits
    // come back. Backpressure, never loss.
    out.bytes.resize(n);
    if (n) message.WriteTo(out.bytes.data());  // an empty vector's data() may be null
  }
  pending_bytes_ += n + kPendingOverheadBytes;
  pending_.push_back(std::move(out));
  SendPending();
  return true;
}

bool RdmaConnection::AcquireStaging() {
  auto b = dev_->AcquireSendBuffer();
  if (!b.ok()) {
    CloseWith("no send staging buffer: " + b.error().message);
    return false;
  }
  send_ = b.value();
  write_sge_.lkey = send_.lkey;
  return true;
}

void RdmaConnection::OnSweep() {
  if (!send_.data) return;
  if (std::exchange(wrote_since_sweep_, false)) return;  // busy: keep it
  if (handler_.closed() || closing_ || !pending_.empty()) return;
  if (send_unretired_ == 0) {
    // Every write that read the buffer has completed: nothing on the send queue reads it again.
    dev_->ReleaseSendBuffer(std::exchange(send_, {}));
    return;
  }
  // Unsignaled writes may still be on the send queue: retire them; the next sweep then returns
  // the buffer.
  PostRetiring(retire_posted_);
}

void RdmaConnection::PostRetiring(bool& posted) {
  if (posted || !CanPost()) return;
  posted = true;
  PostWrite(0, 0, kImmCreditBit, /*signal=*/true);  // a credit of 0 bytes: a no-op for the peer
}

void RdmaConnection::WarnChunkedFallback(size_t bytes, const std::string& why) {
  // Once per 1,000 in the process: a sender at its limit would otherwise log every message.
  static std::atomic<uint64_t> fallbacks{0};
  if (fallbacks.fetch_add(1, std::memory_order_relaxed) % 1000 == 0) {
    spdlog::warn("rdma: a {}-byte message goes through the ring in chunks, not by rendezvous: {}",
                 bytes, why);
  }
}

void RdmaConnection::WarnBounced(size_t bytes, size_t piece, const std::string& why) {
  static std::atomic<uint64_t> bounced{0};  // once per 1,000 in the process, as above
  if (bounced.fetch_add(1, std::memory_order_relaxed) % 1000 == 0) {
    spdlog::warn("rdma: a {}-byte message is read in pieces of {} bytes and copied: {}", bytes,
                 piece, why);
  }
}

void RdmaConnection::CloseAfterSending(int limit_ms) {
  if (handler_.closed() || closing_) return;
  closing_ = true;
  paused_ = true;
  MaybeFinishClosing();
  if (handler_.closed()) return;
  auto timer = std::make_shared<asio::steady_timer>(executor_, std::chrono::milliseconds(limit_ms));
  timer->async_wait([self = shared_from_this(), timer](boost::system::error_code) {
    self->CloseWith("closed locally (the peer did not take the last messages in time)");
  });
}

void RdmaConnection::ResumeReceiving() {
  if (!paused_ || closing_) return;
  paused_ = false;
  if (resume_posted_) return;
  resume_posted_ = true;
  asio::post(executor_, [self = shared_from_this()] {
    self->resume_posted_ = false;
    self->Drain();
  });
}

std::optional<uint32_t> RdmaConnection::ReserveRecord(uint32_t bytes) {
  const uint64_t used_before = send_ring_.used();
  auto at = send_ring_.Reserve(bytes);
  if (at) Count(Stat::kRdmaRingBytesWritten, send_ring_.used() - used_before);
  return at;
}

void RdmaConnection::OnCompletion(const ibv_wc& wc) {
  if (handler_.closed()) return;  // flushed work requests after a close
  // Held (their records stay in the ring) until Start and its replay: see StartGate.
  if (early_.Pass(wc)) Process(wc);
}

void RdmaConnection::Process(const ibv_wc& wc) {
  if (handler_.closed()) return;
  if (wc.status != IBV_WC_SUCCESS) [[unlikely]] {
    CloseWith(std::string("RDMA work completion failed: ") + ibv_wc_status_str(wc.status));
    return;
  }
  if (wc.wr_id != kRecvWrId) {
    OnSendCompleted(wc);
    return;
  }
  // A receive (ThreadDevice::Poll reposts its SRQ request).
  if (!(wc.wc_flags & IBV_WC_WITH_IMM)) [[unlikely]] {
    CloseWith("protocol error: receive without immediate data");
    return;
  }
  const uint32_t imm = be32toh(wc.imm_data);
  if (imm & kImmCreditBit) {
    if ((imm & kImmMask) == 0 && !TakeNoop()) [[unlikely]] {
      CloseWith("protocol error: more no-op writes (credits of 0 bytes) than " +
                std::to_string(kNoopBurst) + " at once and one per " +
                std::to_string(kNoopRefillMs) + " ms");
      return;
    }
    const uint64_t used_before = send_ring_.used();
    if (!send_ring_.OnCredit(uint64_t(imm & kImmMask) * kRecordAlignBytes)) {
      CloseWith("protocol error: peer returned more credit than was used");
      return;
    }
    Count(Stat::kRdmaRingBytesCredited, used_before - send_ring_.used());
    SendPendingAndReport();
  } else if (imm & kImmFinBit) {
    OnFin(imm & kImmFinSlotMask);
  } else if (paused_ || !held_.empty() || (!fetches_.empty() && !CanFetchAhead(wc))) [[unlikely]] {
    Hold(wc);
  } else {
    OnRecord(uint64_t(imm & kImmMask) * kRecordAlignBytes, wc.byte_len);
  }
}

bool RdmaConnection::TakeNoop() {
  if (noops_left_ < kNoopBurst) {
    const auto now = std::chrono::steady_clock::now();
    const auto refills = (now - noops_topped_up_) / std::chrono::milliseconds(kNoopRefillMs);
    if (refills > 0) {
      noops_left_ = uint32_t(std::min<int64_t>(kNoopBurst, noops_left_ + refills));
      noops_topped_up_ = now;
    }
  } else {
    noops_topped_up_ = std::chrono::steady_clock::now();  // full: the refill clock starts now
  }
  if (noops_left_ == 0) return false;
  --noops_left_;
  return true;
}

void RdmaConnection::Hold(const ibv_wc& wc) {
  // A record while receiving is paused, or behind a large message still being read: it stays
  // in the ring, unconsumed and uncredited, until its turn (Drain). Send completions, credits
  // and FINs are still taken (Process): they are what lets our own queue drain. A peer that
  // writes more than its credit covers meanwhile is cut off here (ReceiveRing::Accept would,
  // but only once the records are consumed).
  held_bytes_ += AlignRecord(wc.byte_len);
  if (recv_ring_.unreported() + held_bytes_ > kRingBytes) {
    CloseWith("protocol error: peer wrote past its credits while we withheld them");
    return;
  }
  held_.push_back(wc);
}

void RdmaConnection::OnSendCompleted(const ibv_wc& wc) {
  // A signaled send: it and everything before it has left the send queue.
  const size_t queued_before = queued_send_bytes();
  retire_posted_ = false;
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
      if (f.slot != slot) continue;
      if (f.copy) {  // a piece, through the bounce buffer
        const uint32_t piece = f.Piece();
        std::memcpy(f.copy.get() + f.read, f.buf.data(), piece);
        f.read += piece;
        if (f.read < f.bytes) {
          PostRead(f);
          break;
        }
      }
      f.done = true;
      break;
    }
    if (handler_.closed()) return;
    Drain();
    if (handler_.closed()) return;
  }
  // Against the queue as it was before this completion: an invalidation that released an
  // exposed message is progress a paused handler must hear of (it was missed, and a server
  // paused over a large reply never resumed).
  SendPendingAndReport(queued_before);
}

void RdmaConnection::SendPendingAndReport(size_t before) {
  ReturnCredits();  // any held back while the send queue was full
  SendPending();
  if (handler_.closed()) return;
  if (closing_) {
    MaybeFinishClosing();
    return;
  }
  if ((paused_ || watch_progress_) && queued_send_bytes() < before && handler_.get()) {
    handler_.get()->OnSendProgress();
  }
}

void RdmaConnection::MaybeFinishClosing() {
  if (!pending_.empty() || exposed_bytes_ > 0) return;  // the peer has not read everything
  if (send_unretired_ == 0) {
    CloseWith("closed locally");
    return;
  }
  PostRetiring(final_signal_posted_);
}

void RdmaConnection::Drain() {
  while (!paused_ && !handler_.closed()) {
    if (deferred_) {  // the last record taken: its read goes behind those already started
      StartDeferred();
      continue;
    }
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

void RdmaConnection::TakeHeld() {
  const ibv_wc wc = held_.front();
  held_.pop_front();
  held_bytes_ -= AlignRecord(wc.byte_len);
  OnRecord(uint64_t(be32toh(wc.imm_data) & kImmMask) * kRecordAlignBytes, wc.byte_len);
}

bool RdmaConnection::CanFetchAhead(const ibv_wc& wc) const {
  const uint64_t offset = uint64_t(be32toh(wc.imm_data) & kImmMask) * kRecordAlignBytes;
  if (offset + kRecordHeaderBytes > kRingBytes || wc.byte_len < kRecordHeaderBytes) return false;
  const std::byte* rec = recv_buf_.get() + offset;
  if (RecordKind(rec) != kRecordRendezvous) return false;
  return fetches_.size() < kMaxRendezvous && fetch_bytes_ + RecordTotal(rec) <= kFetchAheadBytes;
}

void RdmaConnection::StartFetch(uint32_t total, const Rendezvous& where) {
  const uint32_t slot = where.slot;
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
  Fetch f;
  f.bytes = total;
  f.slot = slot;
  f.addr = where.addr;
  f.rkey = where.rkey;
  auto buf = dev_->AcquireBulk(total);
  if (buf.ok()) {
    f.buf = std::move(buf.value());
  } else {
    // Registration failed, usually at the locked-memory limit: read the message in pieces
    // through a smaller registered buffer, into one that needs no registration. Slower (a copy
    // of every byte), but the message arrives and the connection stays.
    for (const size_t piece : {kBounceBytes, kBulkMinBytes}) {
      auto bounce = dev_->AcquireBulk(std::min<size_t>(total, piece));
      if (bounce.ok()) {
        f.buf = std::move(bounce.value());
        break;
      }
    }
    f.copy.reset(new (std::nothrow) std::byte[size_t(total) + kMessageSlopBytes]);
    if (!f.buf || !f.copy) {
      CloseWith(f.buf ? "out of memory for a large message" : buf.error().message);
      return;
    }
    Count(Stat::kRdmaUnregisteredReceived);
    WarnBounced(total, f.buf.capacity, buf.error().message);
  }
  fetch_bytes_ += total;
  fetches_.push_back(std::move(f));
  PostRead(fetches_.back());
}

void RdmaConnection::PostRead(const Fetch& f) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(f.buf.data());
  sge.length = f.Piece();
  sge.lkey = f.buf.mr->lkey;
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.wr.rdma.remote_addr = f.addr + f.read;
  wr.wr.rdma.rkey = f.rkey;
  // A peer whose window does not cover what it announced fails the read, and its connection.
  PostSend(wr, /*signal=*/true, WrTag(kTagRead, f.slot));
}

void RdmaConnection::StartDeferred() {
  const DeferredFetch d = *deferred_;
  deferred_.reset();
  StartFetch(d.total, d.where);  // (counted as told: fetch_bytes_ takes over from deferred_)
}

void RdmaConnection::TellHeld() {
  const uint64_t held = fetch_bytes_ + (deferred_ ? deferred_->total : 0) + assembler_.buffered();
  if (held == told_held_ || handler_.closed()) return;
  told_held_ = held;
  // Nothing is kept once a message has arrived (buffers go back to the thread's cache), so the
  // answer, whether to give back what is kept, has nothing to act on.
  if (ConnectionHandler* h = handler_.get()) h->OnReceiveHeld(held, held > 0);
}

void RdmaConnection::DeliverFetched() {
  Fetch f = std::move(fetches_.front());
  fetches_.pop_front();
  fetch_bytes_ -= f.bytes;
  TellHeld();
  if (PostWrite(0, 0, kImmFinBit | f.slot)) {
    const std::byte* data = f.copy ? f.copy.get() : f.buf.data();
    handler_.get()->OnMessage(std::span<const std::byte>(data, f.bytes));
  }
  dev_->ReleaseBulk(std::move(f.buf));
}

bool RdmaConnection::Expose(Outgoing& m) {
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
  StoreRendezvous(rec + kRecordHeaderBytes,
                  Rendezvous{reinterpret_cast<uint64_t>(m.big.data()), e.rkey, slot});
  PostRecord(*at, kRecordHeaderBytes + kRendezvousBodyBytes);
  e.buf = std::move(m.big);
  e.bytes = m.size;
  e.state = Exposed::kExposed;
  exposed_bytes_ += m.size + kPendingOverheadBytes;
  return true;
}

void RdmaConnection::OnFin(uint32_t slot) {
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

void RdmaConnection::ReturnCredits() {
  if (paused_ || send_unretired_ + kControlReserve / 2 >= send_depth_) return;
  if (uint64_t c = recv_ring_.TakeCredits(kRingBytes / 4)) {
    PostWrite(0, 0, kImmCreditBit | static_cast<uint32_t>(c / kRecordAlignBytes));
  }
}

bool RdmaConnection::PostWrite(uint32_t offset, uint32_t bytes, uint32_t imm, bool signal) {
  // The connection's own work request, set up once (SetRemoteRing): only what varies is written
  // here. Zeroing a fresh one for every record cost ~21 instructions (callgrind in the VM); the
  // provider reads it during ibv_post_send and keeps nothing of it.
  write_sge_.addr = reinterpret_cast<uint64_t>(send_.data) + offset;
  write_sge_.length = bytes;
  ibv_send_wr& wr = write_wr_;
  wr.wr_id = 0;
  wr.num_sge = bytes ? 1 : 0;
  wr.imm_data = htobe32(imm);
  wr.wr.rdma.remote_addr = remote_.addr + offset;
  wr.send_flags = bytes && bytes <= max_inline_ ? IBV_SEND_INLINE : 0;
  return PostSend(wr, signal);
}

bool RdmaConnection::PostSend(ibv_send_wr& wr, bool signal, uint64_t tag) {
  ++since_signal_;
  ++send_unretired_;
  if (signal || since_signal_ >= kSignalEvery || send_unretired_ * 2 >= send_depth_) {
    wr.send_flags |= IBV_SEND_SIGNALED;
    wr.wr_id = since_signal_ | tag;
    since_signal_ = 0;
  }
  ibv_send_wr* bad = nullptr;
  TsanSent();  // transport/tsan_wire.h
  if (ibv_post_send(id_->qp, &wr, &bad)) {
    CloseWith(Errno("ibv_post_send"));
    return false;
  }
  return true;
}

void RdmaConnection::SendPending() {
  while (!pending_.empty() && !handler_.closed() && CanPost()) {
    if (!HaveStaging()) return;
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

void RdmaConnection::OnRecord(uint64_t offset, uint32_t bytes) {
  // Each step's common case inline first (a record at the ring's head holding a whole message);
  // the general calls decide the rest and name what is wrong.
  if (!recv_ring_.AcceptAtHead(offset, bytes)) {
    if (auto accepted = recv_ring_.Accept(offset, bytes); !accepted.ok()) {
      CloseWith("protocol error: " + accepted.error().message);
      return;
    }
  }
  const std::span<const std::byte> record(recv_buf_.get() + offset, bytes);
  if (std::span<const std::byte> whole; assembler_.Whole(record, &whole)) {
    handler_.get()->OnMessage(whole);  // in place in the ring
  } else {
    RecordAssembler::Result r = assembler_.Add(record);
    switch (r.kind) {
      case RecordAssembler::Result::kError:
        CloseWith(std::move(r.error));
        return;
      case RecordAssembler::Result::kRendezvous:
        // The handler hears of the message's size before its buffer is taken, and may pause
        // us for it (over a server's memory budget): the read then waits for the resume.
        deferred_ = DeferredFetch{r.total, r.rendezvous};
        TellHeld();
        if (!paused_ && !handler_.closed()) StartDeferred();
        break;
      case RecordAssembler::Result::kMessage:
        // Reassembled from chunks (a whole message in one record went the inline way above).
        handler_.get()->OnMessage(r.message);
        assembler_.Release();
        TellHeld();  // (nothing once the handler closed the connection)
        break;
      case RecordAssembler::Result::kNeedMore:
        TellHeld();  // one more chunk assembled
        break;
    }
  }
  if (handler_.closed()) return;
  ReturnCredits();
}

void RdmaConnection::CloseWith(std::string reason) {
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
  deferred_.reset();
  assembler_.Reset();
  asio::post(executor_, [self = shared_from_this()] { self->handler_.DeliverClose(); });
}

}  // namespace rdmarpc::transport::rdma

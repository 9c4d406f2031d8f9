// One RDMA connection: a reliable-connected QP set up by librdmacm (rdma_transport.cc does the
// set-up), and its data path: records written into the peer's receive ring with
// RDMA_WRITE_WITH_IMM under the ring's credits (ring.h), large messages by rendezvous (the peer
// RDMA-READs them through a memory window bound to this QP alone), and the completions its
// ThreadDevice hands it. docs/PROTOCOL.md has the bytes.
//
// Threading: a connection, its QP and its CM event channel live on one I/O thread; every method
// is called there (the Connection interface's callers post to executor()). No locks.
#pragma once

#include <array>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/handler_slot.h"
#include "transport/handshake.h"
#include "transport/rdma/device.h"
#include "transport/rdma/record.h"
#include "transport/rdma/ring.h"
#include "transport/rdma/start_gate.h"
#include "transport/rdma/tunables.h"
#include "transport/rdma/verbs.h"
#include "transport/stats.h"
#include "transport/transport.h"

namespace rdmarpc::transport::rdma {

// Where a receive ring is: what each side's HELLO (the CM private data) tells the other, beside
// the authentication fields.
struct RingDescriptor {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t bytes = 0;
};

// A HELLO carrying `d` (and whatever authentication fields `h` already has).
Hello WithRing(Hello h, const RingDescriptor& d);

// A peer's HELLO from the CM private data, and the receive ring it describes.
struct PeerHello {
  Hello hello;
  RingDescriptor ring;
};
// The HELLO in `data` with a ring this side can write into, or what is wrong with it.
Expected<PeerHello> DecodePeerHello(const void* data, size_t len);

class RdmaConnection final : public Connection,
                             public CompletionSink,
                             public std::enable_shared_from_this<RdmaConnection> {
 public:
  RdmaConnection(Executor ex, const Options& options, std::string peer)
      : executor_(std::move(ex)),
        options_(options),
        peer_(std::move(peer)),
        event_fd_(executor_),
        recv_ring_(kRingBytes),
        send_ring_(kRingBytes),
        assembler_(options.max_message_bytes) {
    Count(Stat::kRdmaConnectionsOpened);
  }

  ~RdmaConnection() override;

  // Takes ownership of `id` and its event channel, whose events NextEvent then waits for.
  Expected<void> Adopt(CmId id, EventChannel events);

  // Once the id is bound to a device: creates the QP on this thread's CQ, registers the rings
  // and posts the receives.
  Expected<void> Setup();

  RingDescriptor LocalRing() const {
    return {reinterpret_cast<uint64_t>(recv_buf_.get()), ring_rkey_, kRingBytes};
  }

  void SetRemoteRing(const RingDescriptor& d);

  // Once ESTABLISHED (the QP can send): makes our ring writable by the peer, through this QP
  // only, and grants it as credit. The grant is a zero-byte write (which touches no memory) that
  // follows the bind on the same send queue, so the peer never writes before the window works.
  Expected<void> Open();

  rdma_cm_id* id() { return id_.get(); }
  uint8_t rd_atom() const { return dev_->rd_atom(); }

  // Waits for the next CM event on this connection's channel, bounded by `timeout_ms`.
  boost::asio::awaitable<CmEvent> NextEvent(int timeout_ms);

  // After ESTABLISHED: watch for the peer's disconnect.
  void WatchEvents();

  // --- Connection ----------------------------------------------------------------------------
  const Executor& executor() const override { return executor_; }
  bool closed() const override { return handler_.closed(); }
  bool fetching_message() const override { return fetch_bytes_ > 0; }
  size_t max_message_bytes() const override { return options_.max_message_bytes; }
  std::string peer() const override { return peer_; }

  void Start(std::shared_ptr<ConnectionHandler> handler) override;

  bool Send(const MessageWriter& message) override;

  void Close() override { CloseWith("closed locally"); }

  void CloseAfterSending(int limit_ms) override;

  size_t queued_send_bytes() const override {
    return pending_bytes_ - pending_sent_ + exposed_bytes_;
  }

  void PauseReceiving() override { paused_ = true; }
  void WatchSendProgress(bool on) override { watch_progress_ = on; }

  void ResumeReceiving() override;

  // send_ring_.Reserve, counted for the ring-occupancy gauge (transport/stats.h).
  std::optional<uint32_t> ReserveRecord(uint32_t bytes);

  // --- completions -----------------------------------------------------------------------------
  void OnCompletion(const ibv_wc& wc) override;
  // Returns the send staging buffer once this connection has written nothing for a sweep
  // period and every write that used it has completed (see kStagingSweepMs).
  void OnSweep() override;

  void Process(const ibv_wc& wc);

 private:
  // Process's rarer branches, out of line so that a record's path saves fewer registers: a
  // record kept in the ring for later (receiving paused, or behind a large message being read)
  // and a signaled send's completion.
  [[gnu::noinline]] void Hold(const ibv_wc& wc);
  [[gnu::noinline]] void OnSendCompleted(const ibv_wc& wc);
  // A no-op from the peer (a credit of 0 bytes): whether it is within kNoopBurst/kNoopRefillMs.
  [[gnu::noinline]] bool TakeNoop();
  // A message waiting for credit: a copy (small, or chunked without windows), or a registered
  // buffer it was serialized into, to be exposed by rendezvous.
  struct Outgoing {
    std::vector<std::byte> bytes;
    ThreadDevice::BulkBuffer big;
    size_t size = 0;
  };

  // Room for a data record or a rendezvous (two requests), short of the control reserve.
  bool CanPost() const { return send_unretired_ + kControlReserve < send_depth_; }

  // From the completion path: sends what credits now allow, finishes a CloseAfterSending, and
  // tells a handler that paused receiving that its queue went down.
  void SendPendingAndReport() { SendPendingAndReport(queued_send_bytes()); }
  void SendPendingAndReport(size_t before);

  // CloseAfterSending: once nothing is queued, one signaled send retires every write before it;
  // its completion (send_unretired_ back to 0) means they all reached the peer.
  void MaybeFinishClosing();

  // Delivers, in order, the large messages whose reads finished and the records held behind
  // them or while paused, until paused again or the front message is still being read (only a
  // further rendezvous within the read-ahead budget goes ahead of it: its read starts now);
  // then returns the credits that freed.
  void Drain();

  void TakeHeld();

  // Whether the record `wc` announces is a rendezvous that may start its read while earlier
  // large messages are still being read: few enough in flight, and within kFetchAheadBytes.
  bool CanFetchAhead(const ibv_wc& wc) const;

  // A rendezvous record: reads the message from the peer's window into a buffer of ours.
  void StartFetch(uint32_t total, const Rendezvous& where);
  // Starts the read of the rendezvous that the handler heard of first (TellHeld) and that
  // paused receiving: deferred_ holds it until receiving resumes.
  void StartDeferred();
  // Tells the handler what is held for messages still arriving (reads started or deferred,
  // chunks assembled so far) when that changed: ConnectionHandler::OnReceiveHeld.
  void TellHeld();

  // The front large message has been read: the FIN lets the peer reuse its buffer, then the
  // message is handed up in place.
  void DeliverFetched();

  // Sends the front pending large message by rendezvous: binds a window over its buffer to this
  // QP alone (read-only, exactly its bytes, a fresh key) and writes a rendezvous record saying
  // where it is. False when it must wait (no free slot, credit or send-queue room).
  bool Expose(Outgoing& m);

  // The peer has read the message exposed in `slot`: invalidate the window; the buffer is
  // reused once that completes.
  void OnFin(uint32_t slot);

  // Returns credits once a quarter of the ring is free (ring.h explains why that suffices);
  // never while paused, so that a peer that does not take our replies cannot send more. With
  // the send queue nearly full (a peer slow to take our writes) they wait, adding up, for the
  // next send completion: credits are cumulative, and posting regardless overflowed the queue.
  void ReturnCredits();

  bool PostWrite(uint32_t offset, uint32_t bytes, uint32_t imm, bool signal = false);

  // Posts one work request, counting it in send_unretired_. Every kSignalEvery-th is signaled,
  // and every one once the queue is half full, so that a signaled completion always comes to
  // retire what is outstanding (its wr_id says how many it retires).
  bool PostSend(ibv_send_wr& wr, bool signal = false, uint64_t tag = 0);

  // Posts a signaled no-op (a zero-byte write crediting 0 bytes) whose completion retires every
  // write before it, unless `posted` says one is on its way already (or the queue is full: the
  // caller tries again later); sets `posted`.
  void PostRetiring(bool& posted);

  void PostRecord(uint32_t offset, uint32_t bytes) {
    wrote_since_sweep_ = true;
    PostWrite(offset, bytes, offset / kRecordAlignBytes);
  }

  // Whether the send staging buffer is here, taking one from the thread if not (the first
  // record, or the first after a quiet spell gave it back). False: none could be had, and the
  // connection is closed, saying why.
  bool HaveStaging() {
    if (send_.data) [[likely]]
      return true;
    return AcquireStaging();
  }
  [[gnu::noinline]] bool AcquireStaging();

  void SendPending();

  void OnRecord(uint64_t offset, uint32_t bytes);

  void CloseWith(std::string reason);
  // Logs (rate-limited) that a large message is sent in chunks because registering memory for
  // its rendezvous failed.
  static void WarnChunkedFallback(size_t bytes, const std::string& why);
  // The same for a large message received in pieces through a bounce buffer (StartFetch).
  static void WarnBounced(size_t bytes, size_t piece, const std::string& why);

  Executor executor_;
  Options options_;
  std::string peer_;
  // Declaration order is destruction order reversed: the QP (in id_) goes before the CQ (dev_)
  // and the memory regions it uses.
  std::shared_ptr<ThreadDevice> dev_;
  AlignedBuffer recv_buf_;
  Mr recv_mr_;
  Mw recv_mw_;  // deallocated first of all (see the destructor), before the MR it windows
  uint32_t ring_rkey_ = 0;  // what the peer writes with: the window's, or the MR's
  // From dev_'s slabs while this connection sends (HaveStaging); returned when it has been quiet
  // (OnSweep) or in the destructor. Records sit at the offsets they take in the peer's ring, so
  // any buffer of the size will do after a quiet spell.
  ThreadDevice::SendBuffer send_;
  bool wrote_since_sweep_ = false;  // a record was posted since the last OnSweep
  bool retire_posted_ = false;      // OnSweep's signaled no-op is on its way
  // The peer's no-ops (credits of 0 bytes) this connection still takes, and when that was last
  // topped up (kNoopBurst, kNoopRefillMs; TakeNoop).
  uint32_t noops_left_ = kNoopBurst;
  std::chrono::steady_clock::time_point noops_topped_up_ = std::chrono::steady_clock::now();
  EventChannel events_;
  boost::asio::posix::stream_descriptor event_fd_;
  CmId id_;
  ThreadDevice::CqSlot* cq_slot_ = nullptr;  // owned by dev_
  uint32_t qp_num_ = 0;
  uint32_t max_inline_ = 0;
  uint32_t send_depth_ = kSendDepth;
  uint32_t send_unretired_ = 0, since_signal_ = 0;
  RingDescriptor remote_;
  // PostWrite's work request and its one scatter entry: the fields every write shares are set
  // by SetRemoteRing. One thread only, and no post keeps a pointer to them.
  ibv_send_wr write_wr_{};
  ibv_sge write_sge_{};
  ReceiveRing recv_ring_;
  SendRing send_ring_;
  std::deque<Outgoing> pending_;
  size_t pending_bytes_ = 0;     // sum of pending_'s sizes
  size_t pending_sent_ = 0;      // of pending_.front()
  bool paused_ = false;          // PauseReceiving: records are held, credits withheld
  bool watch_progress_ = false;  // WatchSendProgress
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
    // The message's buffer, or, when `copy` is set, a smaller bounce buffer read into piece by
    // piece and copied out (a buffer for the whole message could not be registered).
    ThreadDevice::BulkBuffer buf;
    std::unique_ptr<std::byte[]> copy;  // the whole message (plus kMessageSlopBytes)
    uint64_t addr = 0;                  // the peer's window over the message
    uint32_t rkey = 0;
    uint32_t bytes = 0;
    uint32_t read = 0;  // bytes read so far
    uint32_t slot = 0;
    bool done = false;
    // What the next read takes: all of the message, or (bounced) its next piece.
    uint32_t Piece() const {
      return copy ? static_cast<uint32_t>(std::min<size_t>(bytes - read, buf.capacity)) : bytes;
    }
  };
  // Posts the fetch's next read: all of it, or (bounced) its next piece.
  void PostRead(const Fetch& f);
  std::deque<Fetch> fetches_;
  uint64_t fetch_bytes_ = 0;
  struct DeferredFetch {
    uint32_t total = 0;
    Rendezvous where;
  };
  std::optional<DeferredFetch> deferred_;  // a rendezvous whose handler paused us first
  uint64_t told_held_ = 0;                 // what TellHeld last said
  RecordAssembler assembler_;              // records back into messages
  HandlerSlot handler_;
  StartGate<ibv_wc> early_;  // completions that arrived before Start (and its replay)
};

}  // namespace rdmarpc::transport::rdma

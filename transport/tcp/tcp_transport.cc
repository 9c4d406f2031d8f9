#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/defer.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <utility>
#include <vector>

#include "transport/acceptor.h"
#include "transport/handler_slot.h"
#include "transport/handshake.h"
#include "transport/log_limit.h"
#include "transport/poller.h"
#include "transport/stats.h"
#include "transport/tcp/reassembler.h"
#include "transport/tsan_wire.h"

namespace rdmarpc::transport::tcp {
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr size_t kInitialReadBufferBytes = 64 * 1024;
static_assert(StreamReassembler::kSlopBytes >= kMessageSlopBytes);
// Buffers that grew for a large message shrink back once idle, so idle connections stay small.
constexpr size_t kShrinkAboveBytes = 1 << 20;
// Messages at least this large leave through SendGathered: their large fields go from the
// sender's memory to the kernel, not through the send buffer first. Below it, one copy is
// cheaper than a gathered write's bookkeeping, and small messages batch better.
constexpr size_t kGatherAboveBytes = 64 * 1024;
// The most pieces one gathered write hands the kernel (far below the system's IOV_MAX); the
// pieces of a message with more are queued by copy after it.
constexpr int kMaxGatherPieces = 64;

void StoreLe32(std::byte* p, uint32_t v) {
  v = htole32(v);
  std::memcpy(p, &v, 4);
}

std::string EndpointUri(const tcp::endpoint& ep) {
  Endpoint e{Scheme::kTcp, ep.address().to_string(), ep.port()};
  return e.ToUri();
}

int MsLeft(std::chrono::steady_clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      until - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 1));
}

// Reads exactly buffer_size(buf) bytes, or fails with timed_out after `timeout_ms`.
asio::awaitable<std::tuple<boost::system::error_code, size_t>> ReadWithin(tcp::socket& sock,
                                                                          asio::mutable_buffer buf,
                                                                          int timeout_ms) {
  using namespace asio::experimental::awaitable_operators;
  asio::steady_timer timer(sock.get_executor(), std::chrono::milliseconds(timeout_ms));
  auto r = co_await (asio::async_read(sock, buf, asio::as_tuple(asio::use_awaitable)) ||
                     timer.async_wait(asio::as_tuple(asio::use_awaitable)));
  if (r.index() == 1) co_return std::make_tuple(make_error_code(asio::error::timed_out), size_t{0});
  co_return std::get<0>(r);
}

// One connection's data path: the socket is read and written with non-blocking syscalls of our
// own and watched by the event loop's Poller (transport/poller.h), not through Asio socket
// operations; Asio still runs everything else (set-up, timers, posted work).
class TcpConnection final : public Connection,
                            public Poller::Client,
                            public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(tcp::socket socket, const Options& options)
      : executor_(socket.get_executor()),
        options_(options),
        reader_(kInitialReadBufferBytes, options.max_message_bytes) {
    boost::system::error_code ec;
    socket.set_option(tcp::no_delay(true), ec);
    // TCP_INQ (Linux 4.18): each read also says what the socket still holds, counting a
    // received FIN as something, so a read can tell it emptied the socket (see ReadAndDeliver).
    // Without it, every reading goes on to EAGAIN.
    const int on = 1;
    inq_ = ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_INQ, &on, sizeof on) == 0;
    auto remote = socket.remote_endpoint(ec);
    peer_ = ec ? std::string("tcp://?") : EndpointUri(remote);
    // From here on the descriptor is ours (Asio forgets it); it must not block.
    fd_ = socket.release(ec);
    if (ec) fd_ = -1;
    if (fd_ >= 0) {
      const int flags = ::fcntl(fd_, F_GETFL);
      if (flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK) < 0) {
        ::close(fd_);
        fd_ = -1;
      }
    }
    Count(Stat::kTcpConnectionsOpened);
  }
  ~TcpConnection() override {
    // Once registered, the descriptor is the poller's (which closes it when it drops us, if the
    // io_context goes away before we closed).
    if (fd_ >= 0 && registration_ == nullptr) ::close(fd_);
    Count(Stat::kTcpConnectionsClosed);
  }

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
    if (fd_ < 0) {
      CloseWith("the socket could not be taken over");
      return;
    }
    // The connection's reads and writes keep the io_context's run() going, as an outstanding
    // Asio operation would (Poller registrations are not work of their own).
    work_ = asio::prefer(executor_, asio::execution::outstanding_work.tracked);
    int error = 0;
    // From here on the poller owns the descriptor (it closes it when we are removed). Data that
    // arrived before this is reported at once, from the event loop. In a loop of rdmarpc's own
    // that has io_uring, the poller receives for us instead (ArmReceive).
    poller_ = &Poller::For(executor_);
    registration_ = poller_->Add(fd_, shared_from_this(), &error, /*receives=*/true);
    if (!registration_) {
      fd_ = -1;  // closed by Add
      CloseWith(std::string("cannot watch the socket: ") + std::strerror(error));
      return;
    }
    completion_ = Poller::Completes(registration_);
    if (completion_) ArmReceive();
  }

  bool Send(const MessageWriter& message) override {
    if (handler_.closed() || closing_) return false;
    const size_t n = message.size();
    if (n > options_.max_message_bytes) return false;
    // A large message leaves at once, gathered (SendGathered); not while progress is reported
    // (a write that empties the queue here would owe the handler an OnSendProgress, which may
    // not come from inside Send), nor behind a large queue (copied once more if the kernel
    // takes little).
    if (n >= kGatherAboveBytes && !writing_ && !report_progress_ &&
        pending_.size() < kGatherAboveBytes && SendGathered(message, n)) {
      if (pending_.empty()) return true;  // the kernel took it all
    } else {
      std::byte* at = pending_.Append(kLengthPrefixBytes + n);
      StoreLe32(at, static_cast<uint32_t>(n));
      message.WriteTo(at + kLengthPrefixBytes);
    }
    if (!writing_ && !flush_scheduled_ && !delivering_) {
      // Defer the write to the end of this event-loop turn so that every message queued in the
      // same turn leaves in one syscall. (A message queued while a delivery hands out what was
      // read -- a reply a handler sent at once, a caller's next call -- leaves when that ends,
      // without a turn of its own.)
      flush_scheduled_ = true;
      asio::defer(executor_, [self = shared_from_this()] {
        self->flush_scheduled_ = false;
        self->Flush();
      });
    }
    return true;
  }

  void Close() override { CloseWith("closed locally"); }

  void CloseAfterSending(int limit_ms) override {
    if (handler_.closed() || closing_) return;
    closing_ = true;
    PauseReceiving();
    if (!writing_ && pending_.empty()) {
      CloseWith("closed locally");
      return;
    }
    auto timer =
        std::make_shared<asio::steady_timer>(executor_, std::chrono::milliseconds(limit_ms));
    timer->async_wait([self = shared_from_this(), timer](boost::system::error_code) {
      self->CloseWith("closed locally (the peer did not take the last messages in time)");
    });
  }

  // What the send side holds, buffer slack included (buffers grow by doubling): the figure a
  // server's memory budget is about. An empty queue counts nothing: the capacity it keeps for
  // the next batch (at most kShrinkAboveBytes) is not the peer's doing, and counting it would
  // keep a paused receiver paused after everything has been written.
  size_t queued_send_bytes() const override {
    return (pending_.empty() ? 0 : pending_.capacity()) + (writing_ ? inflight_.capacity() : 0);
  }

  void WatchSendProgress(bool on) override {
    watch_progress_ = on;
    report_progress_ = paused_ || watch_progress_;
  }

  void PauseReceiving() override {
    if (paused_) return;
    paused_ = true;
    report_progress_ = true;
    CheckHangUpSoon();
    if (completion_ && !watching_hang_up_ && registration_ != nullptr && !handler_.closed()) {
      // Nothing is received while paused; a hang-up must still be seen (OnHangUp).
      watching_hang_up_ = poller_->WatchHangUp(registration_);
    }
  }

  void ResumeReceiving() override {
    if (!paused_ || closing_) return;
    paused_ = false;
    report_progress_ = watch_progress_;
    if (resume_posted_) return;
    resume_posted_ = true;
    asio::post(executor_, [self = shared_from_this()] {
      self->resume_posted_ = false;
      if (self->paused_ || self->delivering_ || !self->DeliverAndFlush()) return;
      if (self->completion_) {
        self->ArmReceive();
      } else {
        self->ReadAndDeliver();
      }
    });
  }

  void OnPollerGone() override {
    registration_ = nullptr;
    fd_ = -1;  // closed by the poller
  }

  // Receiving through io_uring (Poller::Completes): the receive ArmReceive asked for is done.
  void OnReceived(int result) override {
    receiving_ = false;
    if (handler_.closed()) return;
    if (result <= 0) [[unlikely]] {
      OnReceiveEnded(result);
      return;
    }
    TsanReceived();
    reader_.Commit(static_cast<size_t>(result));
    // A receive that filled its room probably left more in the socket: the next one tries at
    // once; otherwise it waits for data first (a request/response exchange: the socket is empty
    // until our reply has been answered).
    expect_wait_ = static_cast<size_t>(result) < receive_room_;
    if (paused_) return;  // delivered, and the next receive asked for, on ResumeReceiving
    if (DeliverAndFlush()) ArmReceive();
  }

  // Receiving through io_uring, while receiving is paused: the peer hung up (or the socket
  // failed) behind whatever is still unread.
  void OnHangUp() override {
    watching_hang_up_ = false;
    if (paused_ && !handler_.closed()) CloseWith("peer closed the connection");
  }

  // From the Poller, on the event loop (inside the reactor's processing of our descriptor):
  // new data, the end of the stream or an error.
  void OnReady(bool failed) override {
    if (handler_.closed()) return;
    drained_ = false;
    reading_on_ = false;
    if (failed || paused_) [[unlikely]] {
      OnReadyFailedOrPaused(failed);
      return;
    }
    if (!delivering_ && !read_posted_) ReadAndDeliver();
  }

 private:
  // Asks the poller to receive into the reassembler's free room (through io_uring). Nothing
  // touches that room or moves the buffer (Writable, Settle) until OnReceived.
  void ArmReceive() {
    if (receiving_ || paused_ || handler_.closed() || registration_ == nullptr) return;
    auto room = reader_.Writable();
    if (!poller_->Receive(registration_, room, expect_wait_)) [[unlikely]] {
      CloseWith("cannot receive: the event loop's io_uring submission queue is full");
      return;
    }
    receiving_ = true;
    receive_room_ = room.size();
  }

  [[gnu::noinline]] void OnReceiveEnded(int result) {
    if (result == 0) {
      CloseWith("peer closed the connection");
    } else if (result == -EINTR || result == -EAGAIN) {
      ArmReceive();
    } else {
      CloseWith(std::string("read failed: ") + std::strerror(-result));
    }
  }

  // OnReady's rare cases, out of line (inlined, they made every wake-up's OnReady save more
  // registers: ~16 instructions per call).
  [[gnu::noinline]] void OnReadyFailedOrPaused(bool failed) {
    // A reset raises this one event, and TCP_INQ does not count it: read until a read fails.
    if (failed) failed_ = true;
    if (paused_) {
      // Nothing is read while paused (over the server's budget, a protocol error's grace
      // period, a close after sending), so the end of the stream, behind what is unread, would
      // go unseen until then, and a peer that had hung up would keep its calls running for up
      // to that long. The hang-up raises an event all the same; a zero-time poll tells it from
      // data (POLLRDHUP: the peer's FIN, however much is unread before it; POLLHUP or POLLERR:
      // a reset). As when the end is read: the peer is gone, and so is the connection.
      if (failed || PeerHungUp()) CloseWith("peer closed the connection");
      return;
    }
    if (!delivering_ && !read_posted_) ReadAndDeliver();
  }

  // A growable byte buffer that, unlike std::vector, does not zero what it grows into (every
  // byte is written by the message right after).
  class SendBuffer {
   public:
    std::byte* Append(size_t n) {
      if (size_ + n > cap_) Grow(size_ + n);
      std::byte* at = data_.get() + size_;
      size_ += n;
      return at;
    }
    const std::byte* data() const { return data_.get(); }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    size_t capacity() const { return cap_; }
    void clear() { size_ = 0; }
    // Empties it once everything in it is written: keeps its memory for the next batch unless it
    // grew past kShrinkAboveBytes for a large message (idle connections stay small).
    void Written() {
      size_ = 0;
      if (cap_ > kShrinkAboveBytes) Release();
    }
    // Drops what follows the first n bytes (n <= size()).
    void Truncate(size_t n) { size_ = n; }
    void Release() {
      data_.reset();
      size_ = cap_ = 0;
    }
    void swap(SendBuffer& o) noexcept {
      std::swap(data_, o.data_);
      std::swap(size_, o.size_);
      std::swap(cap_, o.cap_);
    }

   private:
    void Grow(size_t need) {
      size_t cap = std::max<size_t>(cap_ * 2, 4096);
      while (cap < need) cap *= 2;
      auto next = std::make_unique_for_overwrite<std::byte[]>(cap);
      if (size_) std::memcpy(next.get(), data_.get(), size_);
      data_ = std::move(next);
      cap_ = cap;
    }
    std::unique_ptr<std::byte[]> data_;
    size_t size_ = 0, cap_ = 0;
  };

  // A large message's pieces (MessageWriter::WritePieces), in order: copied ones are appended
  // to a SendBuffer (kept by offset: it may move as it grows), borrowed ones by address, valid
  // until the Send that gathered them returns.
  class Gather final : public PieceSink {
   public:
    struct Piece {
      const std::byte* borrowed;  // null: in owned_ from `offset`
      size_t offset, size;
    };
    explicit Gather(SendBuffer& owned) : owned_(owned) {}
    void Copy(std::span<const std::byte> b) override {
      if (b.empty()) return;
      const size_t at = owned_.size();
      std::memcpy(owned_.Append(b.size()), b.data(), b.size());
      if (!pieces_.empty() && !pieces_.back().borrowed) {
        pieces_.back().size += b.size();  // (contiguous with the last owned piece)
      } else {
        pieces_.push_back({nullptr, at, b.size()});
      }
      total_ += b.size();
    }
    void Borrow(std::span<const std::byte> b) override {
      if (b.empty()) return;
      pieces_.push_back({b.data(), 0, b.size()});
      total_ += b.size();
    }
    const std::byte* data(const Piece& p) const {
      return p.borrowed ? p.borrowed : owned_.data() + p.offset;
    }
    const std::vector<Piece>& pieces() const { return pieces_; }
    size_t total() const { return total_; }

   private:
    SendBuffer& owned_;
    std::vector<Piece> pieces_;
    size_t total_ = 0;
  };

  // Writes what is queued (less than kGatherAboveBytes) and then the length prefix and `message`
  // (n bytes) in one sendmsg, the message's large fields straight from the writer's memory: one
  // copy fewer than through the queue. What the kernel does not take is queued in order, for
  // Flush. False, with nothing written and the queue as it was, when the writer gives no pieces.
  bool SendGathered(const MessageWriter& message, size_t n) {
    const size_t queued = pending_.size();
    Gather gather(pending_);  // copied pieces go after the queue
    std::byte prefix[kLengthPrefixBytes];
    StoreLe32(prefix, static_cast<uint32_t>(n));
    gather.Copy(prefix);
    if (!message.WritePieces(gather) || gather.total() != kLengthPrefixBytes + n) {
      pending_.Truncate(queued);  // (pieces that disagree with size(): WriteTo is the reference)
      return false;
    }
    iovec iov[kMaxGatherPieces + 1];
    size_t count = 0;
    if (queued) iov[count++] = {const_cast<std::byte*>(pending_.data()), queued};
    for (const auto& p : gather.pieces()) {
      if (count == std::size(iov)) break;
      iov[count++] = {const_cast<std::byte*>(gather.data(p)), p.size};
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = count;
    ssize_t w;
    TsanSent();
    do {
      w = ::syscall(SYS_sendmsg, fd_, &mh, MSG_NOSIGNAL);
    } while (w < 0 && errno == EINTR);
    // A full socket (EAGAIN) queues it all; so does any other error, which Flush then meets
    // again and closes the connection with, as for any queued write.
    size_t skip = w < 0 ? 0 : static_cast<size_t>(w);
    if (skip == queued + gather.total()) {
      pending_.Written();
      return true;
    }
    // The rest, in order, built in inflight_ (unused while not writing) and swapped in.
    auto keep = [&](const std::byte* p, size_t size) {
      if (skip >= size) {
        skip -= size;
        return;
      }
      std::memcpy(inflight_.Append(size - skip), p + skip, size - skip);
      skip = 0;
    };
    keep(pending_.data(), queued);
    for (const auto& p : gather.pieces()) keep(gather.data(p), p.size);
    pending_.swap(inflight_);
    inflight_.Written();
    return true;
  }

  void CloseWith(std::string reason) {
    if (!handler_.MarkClosed(std::move(reason))) return;
    if (write_waiter_) {
      boost::system::error_code ec;
      write_waiter_->close(ec);  // its wait ends with operation_aborted
      write_waiter_.reset();
    }
    // The poller's reference to us goes with the posted close, never inside our own call.
    std::shared_ptr<Poller::Client> held;
    if (fd_ >= 0) {
      ::shutdown(fd_, SHUT_RDWR);  // the peer learns at once, whenever the descriptor closes
      if (registration_) {
        held = poller_->Remove(registration_);  // closes fd_
      } else {
        ::close(fd_);
      }
      registration_ = nullptr;
      fd_ = -1;
    }
    pending_.Release();
    inflight_.Release();  // (a write the kernel never finished)
    asio::post(executor_, [self = shared_from_this(), held = std::move(held)] {
      self->handler_.DeliverClose();
      self->work_ = Executor();
    });
  }

  // Receiving has just paused: the peer's hang-up may have come already, its event taken by a
  // read that stopped at the pause without reaching it (a request, a protocol error, then the
  // end of the stream, all in one read). Looked at once, after the caller's turn.
  void CheckHangUpSoon() {
    asio::post(executor_, [self = shared_from_this()] {
      if (self->paused_ && !self->handler_.closed() && self->fd_ >= 0 && self->PeerHungUp()) {
        self->CloseWith("peer closed the connection");
      }
    });
  }

  bool PeerHungUp() const {
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

  // Raw syscalls: glibc's recv/send wrappers are thread-cancellation points (~60 instructions
  // each for nothing here), and Asio's add error_code handling on top.
  // (Each says what it sent or received to ThreadSanitizer: transport/tsan_wire.h.)
  static ssize_t RecvSome(int fd, std::byte* p, size_t n) {
    const ssize_t got = ::syscall(SYS_recvfrom, fd, p, n, 0, nullptr, nullptr);
    if (got > 0) TsanReceived();
    return got;
  }
  // RecvSome on a socket with TCP_INQ: *left is what the socket still holds after this read
  // (non-zero once the peer's FIN has arrived, even with no data left), or -1 when the kernel
  // did not say.
  static ssize_t RecvSomeInq(int fd, std::byte* p, size_t n, int* left) {
    iovec iov{p, n};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t got = ::syscall(SYS_recvmsg, fd, &msg, 0);
    if (got > 0) TsanReceived();
    *left = -1;
    if (got > 0 && msg.msg_controllen >= CMSG_LEN(sizeof(int))) {
      const cmsghdr* c = CMSG_FIRSTHDR(&msg);
      if (c && c->cmsg_level == IPPROTO_TCP && c->cmsg_type == TCP_CM_INQ) {
        std::memcpy(left, CMSG_DATA(c), sizeof(int));
      }
    }
    return got;
  }
  static ssize_t SendSome(int fd, const std::byte* p, size_t n) {
    TsanSent();
    return ::syscall(SYS_sendto, fd, p, n, MSG_NOSIGNAL, nullptr, 0);
  }

  void Flush() {
    if (handler_.closed() || writing_ || pending_.empty()) return;
    // Usually the kernel takes the whole batch at once; what it does not take is written by
    // WriteInflight when the socket has room again (WaitWritable). (This first send is not left
    // to WriteInflight: the swap and the extra steps cost ~30 instructions per call.)
    ssize_t n;
    do {
      n = SendSome(fd_, pending_.data(), pending_.size());
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        CloseWith(std::string("write failed: ") + std::strerror(errno));
        return;
      }
      n = 0;
    }
    if (static_cast<size_t>(n) == pending_.size()) {
      pending_.Written();
      AfterWrite();
      return;
    }
    writing_ = true;
    pending_.swap(inflight_);
    inflight_written_ = static_cast<size_t>(n);
    WaitWritable();
  }

  // The kernel's send buffer is full (rare: a large message, or a peer that does not read):
  // waits for room through an Asio wait on a duplicate of the descriptor, made for the
  // occasion and closed once everything is written (the poller watches reads only).
  void WaitWritable() {
    if (!write_waiter_) {
      const int dup_fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
      boost::system::error_code ec;
      if (dup_fd >= 0) {
        write_waiter_ = std::make_unique<asio::posix::stream_descriptor>(executor_);
        write_waiter_->assign(dup_fd, ec);
        if (ec) ::close(dup_fd);
      }
      if (dup_fd < 0 || ec) {
        write_waiter_.reset();
        CloseWith(std::string("cannot wait to write: ") +
                  (dup_fd < 0 ? std::strerror(errno) : ec.message()));
        return;
      }
    }
    write_waiter_->async_wait(asio::posix::stream_descriptor::wait_write,
                              [self = shared_from_this()](boost::system::error_code ec) {
                                if (ec || self->handler_.closed()) return;
                                self->WriteInflight();
                              });
  }

  // The socket has room again (WaitWritable): write more of what the kernel did not take.
  void WriteInflight() {
    while (inflight_written_ < inflight_.size()) {
      const ssize_t n =
          SendSome(fd_, inflight_.data() + inflight_written_, inflight_.size() - inflight_written_);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          WaitWritable();
          return;
        }
        CloseWith(std::string("write failed: ") + std::strerror(errno));
        return;
      }
      inflight_written_ += static_cast<size_t>(n);
    }
    writing_ = false;
    write_waiter_.reset();  // (inside its own handler is fine: the wait is over)
    inflight_.Written();
    if (AfterWrite()) Flush();
  }

  // After everything handed to the kernel so far is written: closes a closing connection whose
  // queue is empty, tells a paused receiver that the send queue shrank. False once closed.
  bool AfterWrite() {
    if (closing_ && pending_.empty()) {
      CloseWith("closed locally");
      return false;
    }
    if (report_progress_ && handler_.get() && !closing_) {
      handler_.get()->OnSendProgress();
    }
    return true;
  }

  // Reads until the kernel has nothing more for us (EAGAIN: the edge-triggered poller reports
  // whatever arrives after that), delivering each batch as it comes; stops when receiving is
  // paused or the connection closes. After a short read the next read usually finds nothing,
  // and it comes after the batch's replies were written, so it is not on a call's path. After
  // a read that filled all the room it had, more is probably waiting: the rest is read from a
  // posted handler, so that what this batch woke runs first -- a stream's reader returning
  // window credit, other connections of the thread. (Reading on at once starved a server
  // stream's reader: its credit went back only once the socket was empty, and 64 KiB messages
  // crawled at a tenth of their speed, stop-and-wait.)
  void ReadAndDeliver() {
    while (!drained_ && !paused_ && !handler_.closed()) {
      auto room = reader_.Writable();
      int left = -1;
      const ssize_t n = inq_ ? RecvSomeInq(fd_, room.data(), room.size(), &left)
                             : RecvSome(fd_, room.data(), room.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (reading_on_ && read_on_ > 0) --read_on_;
          reading_on_ = false;
          drained_ = true;
          return;
        }
        CloseWith(std::string("read failed: ") + std::strerror(errno));
        return;
      }
      if (n == 0) {
        CloseWith("peer closed the connection");
        return;
      }
      if (reading_on_) read_on_ = kReadOnAfterFind;
      reading_on_ = false;
      reader_.Commit(static_cast<size_t>(n));
      if (left == 0 && !failed_) {
        // The socket is empty (no data, no FIN): whatever arrives from now on raises a new
        // edge. Read on past it only while that has been finding bytes (see read_on_), and
        // now and then to notice a flow starting.
        if (read_on_ > 0 || ++probe_ % kReadOnProbeEvery == 0) {
          reading_on_ = true;
        } else {
          drained_ = true;
        }
      }
      if (!DeliverAndFlush()) return;
      if (static_cast<size_t>(n) == room.size() && !drained_) {
        read_posted_ = true;
        asio::post(executor_, [self = shared_from_this()] {
          self->read_posted_ = false;
          if (!self->delivering_) self->ReadAndDeliver();
        });
        return;
      }
    }
  }

  // Delivers every complete message in the buffer, in place, then writes what the handler
  // queued meanwhile. False when delivery stopped early (paused, closed, a message over the
  // limit): the rest stays in the buffer.
  [[gnu::always_inline]] bool DeliverAndFlush() {
    delivering_ = true;
    const bool all = DeliverAll();
    delivering_ = false;
    if (!pending_.empty() && !flush_scheduled_) Flush();  // (does nothing once closed)
    // (Not while the kernel receives into the buffer: Settle may move it.)
    if (all && !receiving_) reader_.Settle(kShrinkAboveBytes);
    // Only a buffer grown, or about to grow, for a large message holds anything to tell (and
    // one told of before may have shrunk since: Settle).
    if (reader_.capacity() > kInitialReadBufferBytes || told_held_ != 0 || reader_.full())
        [[unlikely]] {
      TellHeld();
    }
    return all && !handler_.closed();
  }

  // Tells the handler what the read buffer holds once grown past its initial size (its whole
  // capacity: StreamReassembler::held), and whether a large message is arriving, when either
  // changed (ConnectionHandler::OnReceiveHeld); it may pause receiving, or have a buffer kept for
  // the next large message given back.
  [[gnu::noinline]] void TellHeld() {
    const size_t held = reader_.held();
    const bool unfinished = reader_.unfinished_large();
    if ((held == told_held_ && unfinished == told_unfinished_) || handler_.closed()) return;
    told_held_ = held;
    told_unfinished_ = unfinished;
    ConnectionHandler* h = handler_.get();
    if (!h || h->OnReceiveHeld(held, unfinished) || unfinished) return;
    // (Not while the kernel receives into the buffer: Shrink moves it.)
    if (!receiving_ && !handler_.closed() && reader_.Shrink()) {
      told_held_ = reader_.held();
      h->OnReceiveHeld(told_held_, false);
    }
  }

  // False when delivery stopped early: paused, closed or a message over the limit.
  bool DeliverAll() {
    std::span<const std::byte> message;
    uint32_t too_large = 0;
    for (;;) {
      if (paused_) return false;  // ResumeReceiving continues from here
      const auto r = reader_.Next(&message, &too_large);
      if (r == StreamReassembler::Result::kNeedMore) return true;
      if (r == StreamReassembler::Result::kTooLarge) {
        static LogLimit limit;
        WarnLimited(limit, "tcp {}: message of {} bytes exceeds the limit of {}; closing", peer_,
                    too_large, options_.max_message_bytes);
        CloseWith("peer sent a message of " + std::to_string(too_large) +
                  " bytes, over the limit of " + std::to_string(options_.max_message_bytes));
        return false;
      }
      handler_.get()->OnMessage(message);
      if (handler_.closed()) return false;
    }
  }

  int fd_ = -1;
  Poller* poller_ = nullptr;
  Poller::Registration* registration_ = nullptr;
  // Receiving through io_uring (the poller receives into reader_ for us) instead of reading on
  // readiness; a receive in flight (of receive_room_ bytes at most); the last one left the
  // socket probably empty; a hang-up watch in flight (while paused).
  bool completion_ = false;
  bool receiving_ = false;
  bool expect_wait_ = false;
  bool watching_hang_up_ = false;
  size_t receive_room_ = 0;
  Executor executor_;
  Executor work_;  // tracked (outstanding work) while the connection is open
  Options options_;
  std::string peer_;
  HandlerSlot handler_;
  StreamReassembler reader_;
  size_t told_held_ = 0;          // what TellHeld last said
  bool told_unfinished_ = false;  // (both)
  SendBuffer pending_, inflight_;
  size_t inflight_written_ = 0;  // bytes of inflight_ the kernel has taken
  bool writing_ = false;         // inflight_ waits for room in the socket
  bool flush_scheduled_ = false;
  bool delivering_ = false;  // inside DeliverAndFlush: it flushes when it is done
  bool drained_ = false;     // the kernel's queue was found empty (EAGAIN, or TCP_INQ 0)
  bool failed_ = false;      // the poller reported an error or hang-up: read on to EAGAIN
  bool inq_ = false;         // TCP_INQ is on: reads say what the socket still holds
  // Reading on past a read that emptied the socket (TCP_INQ 0). In a request/response exchange
  // that recv only ever says EAGAIN (a system call, ~1.2 us of CPU per message on each side on
  // this host): the next bytes come after our reply has been answered. In a flow (a stream,
  // many calls in flight) it usually finds bytes that arrived while the last ones were being
  // delivered, which is cheaper than a sleep and a wake-up for them (skipping it always cut a
  // 64 KiB stream by a third). So each connection learns which it is: a read on that finds
  // bytes sets read_on_ to kReadOnAfterFind, one that finds nothing takes one off, and at zero
  // the reading stops at TCP_INQ 0, reading on only every kReadOnProbeEvery-th time.
  static constexpr uint8_t kReadOnAfterFind = 8;
  static constexpr uint8_t kReadOnProbeEvery = 16;
  uint8_t read_on_ = kReadOnAfterFind;
  uint8_t probe_ = 0;
  bool reading_on_ = false;   // the read in progress follows one that emptied the socket
  bool read_posted_ = false;  // ReadAndDeliver continues from a posted handler
  // Only while the kernel's send buffer is full (WaitWritable).
  std::unique_ptr<asio::posix::stream_descriptor> write_waiter_;
  bool paused_ = false;           // PauseReceiving: deliver nothing, read nothing
  bool watch_progress_ = false;   // WatchSendProgress
  bool report_progress_ = false;  // paused_ || watch_progress_: OnSendProgress is owed
  bool resume_posted_ = false;
  bool closing_ = false;  // CloseAfterSending: close once pending_ is written
};

class TcpListener final : public Listener {
 public:
  struct State : AcceptorCore {
    State(const std::vector<Executor>& executors, AcceptHandler on_accept, const Options& options)
        : AcceptorCore(executors, std::move(on_accept), options), acceptor(executors[0]) {
      spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    ~State() {
      if (spare_fd >= 0) close(spare_fd);
    }
    tcp::acceptor acceptor;
    tcp protocol = tcp::v4();  // the listening socket's: the sockets it accepts are the same
    // A descriptor held in reserve: when the process runs out (EMFILE), it is given up for one
    // moment to accept the newest client and refuse it with "busy", so that clients get a
    // clear RESOURCE_EXHAUSTED at once instead of waiting in the backlog for their timeout.
    // Only on the listener's thread.
    int spare_fd = -1;
    bool refusing = false;                // the spare is lent to RefuseBusy
    bool accept_waits_for_spare = false;  // an accept hit EMFILE while the spare was lent out
    int64_t refused_busy = 0;
  };

  explicit TcpListener(std::shared_ptr<State> s, std::string uri)
      : state_(std::move(s)), uri_(std::move(uri)) {}
  ~TcpListener() override { Close(); }

  // A descriptor accepted on the listener's loop on its way to its connection's loop, where it
  // is registered with that loop's reactor; closed if it never gets there.
  struct AcceptedSocket {
    AcceptedSocket(int fd, tcp protocol) : fd(fd), protocol(protocol) {}
    AcceptedSocket(AcceptedSocket&& o) noexcept
        : fd(std::exchange(o.fd, -1)), protocol(o.protocol) {}
    AcceptedSocket& operator=(AcceptedSocket&&) = delete;
    ~AcceptedSocket() {
      if (fd >= 0) ::close(fd);
    }
    tcp::socket Take(const Executor& ex, boost::system::error_code& ec) {
      tcp::socket sock(ex);
      sock.assign(protocol, fd, ec);
      if (!ec) fd = -1;
      return sock;
    }
    int fd;
    tcp protocol;
  };

  static void AcceptNext(std::shared_ptr<State> s) {
    if (s->closed) return;
    // Accepted onto the listener's own loop, then handed over as a bare descriptor: a loop's
    // descriptors are registered and used by that loop's thread only. The loops may run without
    // the reactor's per-descriptor lock (rpc's EventLoopThread does), and the reactor pools its
    // per-descriptor state: registering a socket with another loop's reactor from here raced
    // with that loop on a reused state (ThreadSanitizer showed it).
    s->acceptor.async_accept([s](boost::system::error_code ec, tcp::socket sock) {
      if (s->closed) return;
      if (ec) {
        if (ec == asio::error::no_descriptors || ec.value() == ENFILE) {
          // (accept fails so whenever the process has no descriptor free, whether or not a
          // client is waiting.)
          if (RefuseOneBusy(s)) {
            AcceptNext(s);
            return;
          }
          if (s->spare_fd < 0 && s->refusing) {
            // The spare is refusing someone right now: accept again when it is back.
            s->accept_waits_for_spare = true;
            return;
          }
          if (s->spare_fd >= 0) {
            // Nobody is waiting: try again when someone is, not on a timer.
            s->acceptor.async_wait(tcp::acceptor::wait_read,
                                   [s](boost::system::error_code) { AcceptNext(s); });
            return;
          }
        }
        static LogLimit limit;  // (a peer's reset before the accept is one such error)
        WarnLimited(limit, "tcp accept failed: {}", ec.message());
        // Back off briefly on errors such as EMFILE rather than spinning.
        auto timer = std::make_shared<asio::steady_timer>(s->acceptor.get_executor(),
                                                          std::chrono::milliseconds(50));
        timer->async_wait([s, timer](boost::system::error_code) { AcceptNext(s); });
        return;
      }
      boost::system::error_code how;
      const auto remote = sock.remote_endpoint(how);
      std::string peer = how ? std::string("tcp://?") : EndpointUri(remote);
      // Each connection in set-up holds a descriptor until its HELLO comes or the connect
      // timeout passes: at the bound the oldest gives up, at twice the bound the new one is
      // closed at once (see AcceptorCore::MakeRoom). (No "busy" answer: its HELLO may be
      // unread, and a close with unread data resets the connection before the answer is read.)
      if (!s->MakeRoom("tcp", peer)) {
        sock.close(how);
        AcceptNext(s);
        return;
      }
      const int fd = sock.release(how);
      if (how) {
        spdlog::warn("tcp: cannot hand over an accepted connection: {}", how.message());
      } else {
        const Executor& target = s->NextExecutor();
        auto set_up = s->BeginSetUp(target);
        asio::co_spawn(target,
                       Handshake(s, set_up, AcceptedSocket(fd, s->protocol), std::move(peer)),
                       asio::bind_cancellation_slot(set_up->give_up.slot(), asio::detached));
      }
      AcceptNext(s);
    });
  }

  // Out of descriptors: accepts the newest client with the spare descriptor and answers its
  // HELLO with "busy" (see State::spare_fd). False when there is no spare or nobody to accept.
  static bool RefuseOneBusy(const std::shared_ptr<State>& s) {
    if (s->spare_fd < 0) return false;
    close(s->spare_fd);
    s->spare_fd = -1;
    const int fd =
        ::accept4(s->acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      spdlog::debug("tcp: accepting a client to refuse it failed: {}", std::strerror(errno));
      s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      return false;
    }
    Count(Stat::kRefusedDescriptors);
    if (s->refused_busy++ % 1000 == 0) {
      spdlog::warn("tcp: out of file descriptors: refusing new clients as busy ({} so far)",
                   s->refused_busy);
    }
    tcp::socket sock(s->acceptor.get_executor());
    boost::system::error_code ec;
    sock.assign(s->protocol, fd, ec);
    if (ec) {
      ::close(fd);
      s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      return false;
    }
    s->refusing = true;
    asio::co_spawn(s->acceptor.get_executor(), RefuseBusy(s, std::move(sock)), asio::detached);
    return true;
  }

  // Reads the HELLO (closing with unread data would reset the connection before the client reads
  // our answer), answers "busy", closes, and puts the spare descriptor back.
  static asio::awaitable<void> RefuseBusy(std::shared_ptr<State> s, tcp::socket sock) {
    uint8_t hello[kHelloBytes];
    co_await ReadWithin(sock, asio::buffer(hello), 1000);
    Answer answer;
    answer.code = Refusal::kBusy;
    uint8_t out[kAnswerBytes];
    EncodeAnswer(answer, out);
    co_await asio::async_write(sock, asio::buffer(out), asio::as_tuple(asio::use_awaitable));
    boost::system::error_code ec;
    sock.shutdown(tcp::socket::shutdown_both, ec);
    sock.close(ec);
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->refusing = false;
    if (s->accept_waits_for_spare) {
      s->accept_waits_for_spare = false;
      AcceptNext(s);
    }
  }

  // The server's half of the handshake, on the connection's own thread: read the client's
  // HELLO (the whole exchange bounded by the connect timeout, so a silent peer cannot hold a
  // socket), challenge it when we have a secret, answer, and only then hand the connection to
  // the server. Given up early when newer connections need its place (MakeRoom).
  static asio::awaitable<void> Handshake(std::shared_ptr<State> s,
                                         std::shared_ptr<AcceptorCore::SetUp> set_up,
                                         AcceptedSocket accepted, std::string peer) {
    const AcceptorCore::SetUpEnd end(*s, std::move(set_up));
    // Given up: the read or write in progress ends with operation_aborted, without a throw.
    co_await asio::this_coro::throw_if_cancelled(false);
    boost::system::error_code ec;
    tcp::socket sock = accepted.Take(co_await asio::this_coro::executor, ec);
    if (ec) {
      static LogLimit limit;
      WarnLimited(limit, "tcp: cannot take an accepted connection: {}", ec.message());
      co_return;
    }
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(s->options().connect_timeout_ms);
    Answer answer;
    for (int round = 0;; ++round) {
      uint8_t buf[kHelloBytes];
      auto [rec, n] = co_await ReadWithin(sock, asio::buffer(buf), MsLeft(until));
      if ((co_await asio::this_coro::cancellation_state).cancelled() !=
          asio::cancellation_type::none) [[unlikely]] {
        // One per connection of a flood: MakeRoom's warning counts them instead.
        spdlog::debug("tcp: handshake from {} given up for a newer connection", peer);
        co_return;
      }
      if (rec) {
        static LogLimit limit;
        WarnLimited(limit, "tcp: no handshake from {}: {}", peer, rec.message());
        co_return;
      }
      const Expected<Hello> hello = DecodeHello(buf, n);
      std::string why;
      answer = s->Screen(buf, n, hello, /*retry=*/round > 0, peer, &why);
      if (answer.code == Refusal::kNone) {
        answer.proof = s->auth().ProveServer(hello.value(), Hello{});
      } else if (answer.code != Refusal::kChallenge && !why.empty()) {
        static LogLimit limit;
        WarnLimited(limit, "tcp: refusing connection from {}: {}", peer, why);
      }
      uint8_t out[kAnswerBytes];
      EncodeAnswer(answer, out);
      auto [wec, wn] =
          co_await asio::async_write(sock, asio::buffer(out), asio::as_tuple(asio::use_awaitable));
      if (wec) co_return;
      if (answer.code != Refusal::kChallenge) break;
    }
    if (answer.code != Refusal::kNone || s->closed) co_return;  // the socket closes here
    s->Deliver(std::make_shared<TcpConnection>(std::move(sock), s->options()));
  }

  void Close() override {
    if (state_->closed.exchange(true)) return;
    asio::post(state_->acceptor.get_executor(), [s = state_] {
      boost::system::error_code ec;
      s->acceptor.close(ec);
    });
  }

  std::string uri() const override { return uri_; }
  int connections_in_setup() const override { return state_->set_ups_now(); }

 private:
  std::shared_ptr<State> state_;
  std::string uri_;
};

}  // namespace

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options) {
  if (executors.empty()) return Error{"tcp listen: no executors"};
  auto addr = ListenAddress(endpoint);
  if (!addr.ok()) return Error{"tcp listen on " + endpoint.ToUri() + ": " + addr.error().message};
  auto state = std::make_shared<TcpListener::State>(executors, std::move(on_accept), options);
  boost::system::error_code ec;
  tcp::endpoint ep(addr.value(), endpoint.port);
  auto& a = state->acceptor;
  state->protocol = ep.protocol();
  if (a.open(ep.protocol(), ec); ec) return Error{"tcp listen: socket: " + ec.message()};
  a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (a.bind(ep, ec); ec) return Error{"tcp listen on " + endpoint.ToUri() + ": " + ec.message()};
  if (a.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return Error{"tcp listen on " + endpoint.ToUri() + ": " + ec.message()};
  }
  auto local = a.local_endpoint(ec);
  std::string uri = EndpointUri(local);
  TcpListener::AcceptNext(state);
  return std::unique_ptr<Listener>(new TcpListener(state, uri));
}

asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                               Executor executor,
                                                               const Options& options) {
  tcp::resolver resolver(executor);
  auto [rec, results] = co_await resolver.async_resolve(
      endpoint.host, std::to_string(endpoint.port), asio::as_tuple(asio::use_awaitable));
  if (rec) {
    co_return Error{"cannot resolve " + endpoint.ToUri() + ": " + rec.message()};
  }
  tcp::socket socket(executor);
  asio::steady_timer timer(executor, std::chrono::milliseconds(options.connect_timeout_ms));
  using namespace asio::experimental::awaitable_operators;
  auto outcome =
      co_await (asio::async_connect(socket, results, asio::as_tuple(asio::use_awaitable)) ||
                timer.async_wait(asio::as_tuple(asio::use_awaitable)));
  if (outcome.index() == 1) {
    co_return Error{"connect to " + endpoint.ToUri() + " timed out after " +
                    std::to_string(options.connect_timeout_ms) + " ms"};
  }
  auto [cec, ep] = std::get<0>(outcome);
  if (cec) co_return Error{"connect to " + endpoint.ToUri() + " failed: " + cec.message()};
  // The client's half of the handshake: HELLO, a proof if the server challenges us, then its
  // answer, which must prove the server knows our secret when we have one.
  const Authenticator auth(options.auth_secret);
  Hello hello = auth.NewHello();
  Answer answer;
  for (int round = 0;; ++round) {
    uint8_t buf[kHelloBytes];
    EncodeHello(hello, buf);
    auto [wec, wn] =
        co_await asio::async_write(socket, asio::buffer(buf), asio::as_tuple(asio::use_awaitable));
    if (wec) co_return Error{"connect to " + endpoint.ToUri() + " failed: " + wec.message()};
    uint8_t in[kAnswerBytes];
    auto [rec, rn] = co_await ReadWithin(socket, asio::buffer(in), options.connect_timeout_ms);
    // A server of another version answers a shorter refusal and closes: still read it.
    if (rec && !(rec == asio::error::eof && rn >= 8)) {
      co_return Error{"connect to " + endpoint.ToUri() + ": no handshake answer (" + rec.message() +
                      "); is it an rdmarpc server?"};
    }
    Expected<Answer> decoded = DecodeAnswer(in, rn);
    if (!decoded.ok())
      co_return Error{"connect to " + endpoint.ToUri() + ": " + decoded.error().message};
    answer = decoded.value();
    if (answer.code != Refusal::kChallenge || round > 0 || !hello.wants_auth) break;
    auth.Prove(&hello, answer.challenge);
  }
  if (answer.code != Refusal::kNone) {
    Error e{"connect to " + endpoint.ToUri() +
            " refused by the server: " + RefusalText(answer.code, answer.busy)};
    e.busy = answer.code == Refusal::kBusy;
    co_return e;
  }
  if (auto proved = auth.CheckServer(hello, Hello{}, answer); !proved.ok()) {
    co_return Error{"connect to " + endpoint.ToUri() + ": " + proved.error().message};
  }
  co_return std::shared_ptr<Connection>(
      std::make_shared<TcpConnection>(std::move(socket), options));
}

}  // namespace rdmarpc::transport::tcp

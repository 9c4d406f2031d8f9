// tcp_wait_probe: how an echo server waits for and reads its next message, measured on its own.
// An experiment behind docs/BENCHMARKS.md's TCP 64 B notes, not part of rdmarpc: it serves one
// tcp_pingpong client on 127.0.0.1, echoing every byte, with one of these read paths:
//
//   blocking        recv() blocks, then send(): the raw ping-pong's server (the floor)
//   epoll           edge-triggered epoll, recv() until EAGAIN, send(): rdmarpc's TCP transport
//                   (transport/tcp, through the reactor's epoll) reads this way
//   uring-eventfd   epoll waits on an eventfd that an io_uring signals; a multishot recv with a
//                   ring of provided buffers has the data read by the time epoll wakes: no recv()
//   uring-oneshot   as uring-eventfd, but one single-shot recv into a fixed buffer, submitted
//                   again (io_uring_enter) after each send
//   uring-wait      io_uring alone (no epoll): wait for the multishot recv's completion in
//                   io_uring_enter (DEFER_TASKRUN); what a loop built on io_uring would do
//
// When the client leaves it prints one JSON line: messages read, CPU (user + system) per
// message, and how often the wait returned early (EINTR) or woke with nothing to read.
//
//   tcp_wait_probe --mode epoll --port 7601 &     (prints "listening on 127.0.0.1:7601")
//   tcp_pingpong --port 7601 --bytes 64 --duration 3 --warmup 1 --json
//
// tools/bench/tcp_wait_ab.sh runs the modes in interleaved rounds and compares them.
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "tools/common/flags.h"

namespace {

struct Counts {
  unsigned long messages = 0;   // reads that returned data
  unsigned long waits = 0;      // epoll_wait / io_uring waits
  unsigned long eintr = 0;      // waits that returned EINTR
  unsigned long empty = 0;      // wake-ups that found nothing to read
  unsigned long overflows = 0;  // times io_uring had parked completions in its overflow list
  unsigned long stalls = 0;     // of those, found only after a second with no wake-up
};

void Fail(const char* what, int error) {
  std::fprintf(stderr, "tcp_wait_probe: %s: %s\n", what, std::strerror(error));
  std::exit(1);
}

int AcceptOne(int port) {
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 4) != 0) {
    Fail("listen", errno);
  }
  socklen_t len = sizeof a;
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  std::printf("listening on 127.0.0.1:%d\n", ntohs(a.sin_port));
  std::fflush(stdout);
  const int fd = accept(l, nullptr, nullptr);
  if (fd < 0) Fail("accept", errno);
  close(l);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void Echo(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) continue;  // 64 B replies: the socket buffer is never full here
      // The client left with echoes unread (its run ended): the next read says so and ends
      // the serving, with the counts printed.
      if (errno == ECONNRESET || errno == EPIPE) return;
      Fail("send", errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

int EpollOn(int fd) {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ev.data.fd = fd;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) Fail("epoll_ctl", errno);
  return ep;
}

// Waits in epoll_wait; counts EINTR (an io_uring completion's task work interrupts the wait).
// False when `timeout_ms` passed without an event.
bool EpollWait(int ep, Counts& c, int timeout_ms = -1) {
  epoll_event out[4];
  ++c.waits;
  const int n = epoll_wait(ep, out, 4, timeout_ms);
  if (n < 0) {
    if (errno != EINTR) Fail("epoll_wait", errno);
    ++c.eintr;
  }
  return n != 0;
}

void ServeBlocking(int fd, Counts& c) {
  std::vector<char> buf(1 << 16);
  for (;;) {
    const ssize_t r = recv(fd, buf.data(), buf.size(), 0);
    if (r <= 0) return;
    ++c.messages;
    Echo(fd, buf.data(), static_cast<size_t>(r));
  }
}

void ServeEpoll(int fd, Counts& c) {
  const int ep = EpollOn(fd);
  std::vector<char> buf(1 << 16);
  for (;;) {
    EpollWait(ep, c);
    for (bool first = true;; first = false) {
      const ssize_t r = recv(fd, buf.data(), buf.size(), 0);
      if (r == 0) return;
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) return;
        if (first) ++c.empty;
        break;
      }
      ++c.messages;
      Echo(fd, buf.data(), static_cast<size_t>(r));
    }
  }
}

// The io_uring modes: a ring, and for the multishot receive a ring of provided buffers (group 0).
class Uring {
 public:
  Uring(unsigned flags, bool provided) {
    io_uring_params p{};
    p.flags = flags;
    if (int e = io_uring_queue_init_params(64, &ring_, &p); e < 0) Fail("io_uring_setup", -e);
    if (!provided) return;
    // liburing 2.3 (Debian 12) has no io_uring_setup_buf_ring: register the ring by hand.
    // aligned_alloc wants a size that is a multiple of the alignment (glibc lets it pass,
    // AddressSanitizer does not): the ring's 1 KiB rounded up to the page.
    constexpr size_t kRingBytes = (kBuffers * sizeof(io_uring_buf) + 4095) / 4096 * 4096;
    ring_mem_ = std::aligned_alloc(4096, kRingBytes);
    std::memset(ring_mem_, 0, kRingBytes);
    bufs_ = static_cast<io_uring_buf_ring*>(ring_mem_);
    io_uring_buf_ring_init(bufs_);
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<uintptr_t>(ring_mem_);
    reg.ring_entries = kBuffers;
    reg.bgid = 0;
    if (int e = io_uring_register_buf_ring(&ring_, &reg, 0); e < 0) Fail("register buffers", -e);
    data_.resize(kBuffers * kBufferBytes);
    for (unsigned i = 0; i < kBuffers; ++i) GiveBack(i, i);
    io_uring_buf_ring_advance(bufs_, static_cast<int>(kBuffers));
  }
  // The ring first: the kernel may use the provided buffers' ring until it is closed.
  ~Uring() {
    io_uring_queue_exit(&ring_);
    std::free(ring_mem_);
  }
  Uring(const Uring&) = delete;
  Uring& operator=(const Uring&) = delete;
  io_uring* ring() { return &ring_; }

  void ArmMultishot(int fd) {
    io_uring_sqe* s = io_uring_get_sqe(&ring_);
    io_uring_prep_recv_multishot(s, fd, nullptr, 0, 0);
    s->flags |= IOSQE_BUFFER_SELECT;
    s->buf_group = 0;
    io_uring_submit(&ring_);
  }
  void ArmOneshot(int fd, char* buf, size_t n) {
    io_uring_sqe* s = io_uring_get_sqe(&ring_);
    io_uring_prep_recv(s, fd, buf, n, 0);
    io_uring_submit(&ring_);
  }

  // Echoes what the multishot receive's completions hold and gives the buffers back; re-arms it
  // when it ended (buffers ran out). False at the end of the stream.
  bool ReapMultishot(int fd, Counts& c) {
    io_uring_cqe* cqe;
    unsigned head, seen = 0;
    bool rearm = false, open = true;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      if (cqe->res == 0 || (cqe->res < 0 && cqe->res != -ENOBUFS)) {
        open = false;
        continue;
      }
      if (cqe->res > 0) {
        const unsigned id = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
        ++c.messages;
        Echo(fd, &data_[id * kBufferBytes], static_cast<size_t>(cqe->res));
        GiveBack(id, 0);
        io_uring_buf_ring_advance(bufs_, 1);
      }
      if (!(cqe->flags & IORING_CQE_F_MORE)) rearm = true;
    }
    if (seen == 0) ++c.empty;
    io_uring_cq_advance(&ring_, seen);
    if (open && rearm) ArmMultishot(fd);
    if (open && io_uring_cq_has_overflow(&ring_)) {
      FlushOverflow(c);
      return ReapMultishot(fd, c);
    }
    return open;
  }

  // A wait of a second with no completion (the probe's client never pauses). On Linux 6.18
  // io_uring now and then puts a multishot receive's completion on its overflow list although
  // the completion queue has room (seen with the queue empty, at its first wrap, 128), and an
  // overflowed completion does not signal the eventfd: before ReapMultishot looked for them,
  // uring-eventfd waited forever in 5 of 60 one-second runs at depth 2 (its client with it);
  // since, 7 of 50 runs counted one overflow, none stalled. Moves such completions into the
  // queue; with none, says so and exits with status 3 rather than hang the client.
  void Stalled(int fd, Counts& c) {
    if (io_uring_cq_has_overflow(&ring_)) {
      ++c.stalls;
      FlushOverflow(c);
      return;
    }
    int queued = -1;
    ioctl(fd, FIONREAD, &queued);
    std::fprintf(stderr,
                 "tcp_wait_probe: stalled: no io_uring completion for a second, its receive "
                 "armed, %d bytes in the socket\n",
                 queued);
    std::exit(3);
  }

 private:
  static constexpr unsigned kBuffers = 64;
  static constexpr unsigned kBufferBytes = 16384;
  void FlushOverflow(Counts& c) {
    ++c.overflows;
    if (int e = io_uring_get_events(&ring_); e < 0) Fail("io_uring_get_events", -e);
  }
  void GiveBack(unsigned id, unsigned offset) {
    io_uring_buf_ring_add(bufs_, &data_[id * kBufferBytes], kBufferBytes,
                          static_cast<unsigned short>(id), io_uring_buf_ring_mask(kBuffers),
                          static_cast<int>(offset));
  }
  io_uring ring_{};
  void* ring_mem_ = nullptr;
  io_uring_buf_ring* bufs_ = nullptr;
  std::vector<char> data_;
};

int EventfdFor(Uring& u) {
  const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (int e = io_uring_register_eventfd(u.ring(), efd); e < 0) Fail("register eventfd", -e);
  // Edge-triggered and never read: every completion posted signals it, and each signal is a
  // new edge for epoll.
  return EpollOn(efd);
}

void ServeUringEventfd(int fd, Counts& c) {
  Uring u(0, true);
  const int ep = EventfdFor(u);
  u.ArmMultishot(fd);
  // A completion posted before the eventfd was watched raised no edge: look once first.
  if (!u.ReapMultishot(fd, c)) return;
  for (;;) {
    if (!EpollWait(ep, c, 1000)) u.Stalled(fd, c);
    if (!u.ReapMultishot(fd, c)) return;
  }
}

void ServeUringOneshot(int fd, Counts& c) {
  Uring u(0, false);
  const int ep = EventfdFor(u);
  std::vector<char> buf(1 << 16);
  u.ArmOneshot(fd, buf.data(), buf.size());
  for (;;) {
    if (!EpollWait(ep, c, 1000)) u.Stalled(fd, c);
    io_uring_cqe* cqe;
    bool any = false;
    while (io_uring_peek_cqe(u.ring(), &cqe) == 0) {
      any = true;
      const int r = cqe->res;
      io_uring_cqe_seen(u.ring(), cqe);
      if (r <= 0) return;
      ++c.messages;
      Echo(fd, buf.data(), static_cast<size_t>(r));
      u.ArmOneshot(fd, buf.data(), buf.size());
    }
    if (!any) ++c.empty;
  }
}

void ServeUringWait(int fd, Counts& c) {
  Uring u(IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, true);
  u.ArmMultishot(fd);
  for (;;) {
    io_uring_cqe* cqe;
    ++c.waits;
    if (int e = io_uring_wait_cqe(u.ring(), &cqe); e < 0) {
      if (e != -EINTR) Fail("io_uring_wait_cqe", -e);
      ++c.eintr;
    }
    if (!u.ReapMultishot(fd, c)) return;
  }
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  rdmarpc::cmdline::Flags flags(argc, argv, {{"mode", true}, {"port", true}, {"help", false}});
  const std::string mode = flags.get("mode", "epoll");
  const long port = flags.get_int("port", 0, 0, 65535);
  if (flags.has("help") || !flags.error().empty()) {
    if (!flags.error().empty()) std::cerr << "tcp_wait_probe: " << flags.error() << "\n";
    std::cerr << "usage: tcp_wait_probe --mode blocking|epoll|uring-eventfd|uring-oneshot|"
                 "uring-wait [--port N] (0, the default: any free port)\n";
    return flags.has("help") ? 0 : 2;
  }
  void (*serve)(int, Counts&) = nullptr;
  if (mode == "blocking") serve = ServeBlocking;
  if (mode == "epoll") serve = ServeEpoll;
  if (mode == "uring-eventfd") serve = ServeUringEventfd;
  if (mode == "uring-oneshot") serve = ServeUringOneshot;
  if (mode == "uring-wait") serve = ServeUringWait;
  if (!serve) {
    std::cerr << "tcp_wait_probe: unknown --mode " << mode << "\n";
    return 2;
  }
  const int fd = AcceptOne(static_cast<int>(port));
  // Every path but the blocking one reads until the socket (or io_uring) says "nothing now".
  if (serve != ServeBlocking) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  Counts c;
  const double cpu0 = CpuSeconds();
  serve(fd, c);
  const double cpu = CpuSeconds() - cpu0;
  const double n = c.messages ? static_cast<double>(c.messages) : 1.0;
  std::printf(
      "{\"mode\":\"%s\",\"messages\":%lu,\"cpu_us_per_message\":%.2f,"
      "\"waits_per_message\":%.3f,\"eintr_per_message\":%.3f,\"empty_wakeups_per_message\":%.3f,"
      "\"cq_overflows\":%lu,\"stalls\":%lu}\n",
      mode.c_str(), c.messages, cpu * 1e6 / n, static_cast<double>(c.waits) / n,
      static_cast<double>(c.eintr) / n, static_cast<double>(c.empty) / n, c.overflows, c.stalls);
  return 0;
}

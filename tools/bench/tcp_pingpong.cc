// tcp_pingpong: the floor for any RPC over TCP on this machine. Blocking sockets, TCP_NODELAY,
// fixed-size messages with no framing and no serialisation: the client sends `depth` messages,
// then sends one more each time a reply arrives; the server echoes every message whole.
//
//   tcp_pingpong --server [--port 7495]
//   tcp_pingpong --port 7495 --bytes 64 --depth 1 --duration 5 [--warmup 1] [--json]
//
// Only 127.0.0.1: this is a loopback baseline.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench/histogram.h"
#include "tools/common/flags.h"

using Clock = std::chrono::steady_clock;

namespace {

bool ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t r = write(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int Serve(int port) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = Loopback(port);
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) || listen(l, 64)) {
    std::perror("tcp_pingpong: bind/listen");
    return 1;
  }
  std::cout << "listening on 127.0.0.1:" << port << std::endl;
  for (;;) {
    int c = accept(l, nullptr, nullptr);
    if (c < 0) continue;
    NoDelay(c);
    std::thread([c] {
      // First 4 bytes: the message size the client will use.
      uint32_t n = 0;
      if (ReadFull(c, reinterpret_cast<char*>(&n), 4)) {
        std::vector<char> buf(n);
        while (ReadFull(c, buf.data(), n) && WriteFull(c, buf.data(), n)) {
        }
      }
      close(c);
    }).detach();
  }
}

}  // namespace

int main(int argc, char** argv) {
  rdmarpc::cmdline::Flags flags(argc, argv,
                                {{"server", false},
                                 {"port", true},
                                 {"bytes", true},
                                 {"depth", true},
                                 {"duration", true},
                                 {"warmup", true},
                                 {"json", false},
                                 {"help", false}});
  const long port = flags.get_int("port", 7495, 1, 65535);
  const long bytes = flags.get_int("bytes", 64, 1, 64 << 20);
  const long depth = flags.get_int("depth", 1, 1, 4096);
  const long duration = flags.get_int("duration", 5, 1, 3600);
  const long warmup = flags.get_int("warmup", 1, 0, 3600);
  if (flags.has("help") || !flags.error().empty()) {
    if (!flags.error().empty()) std::cerr << "tcp_pingpong: " << flags.error() << "\n";
    std::cerr << "usage: tcp_pingpong --server [--port P] | --port P --bytes N --depth D "
                 "--duration S [--warmup S] [--json]\n";
    return flags.has("help") ? 0 : 2;
  }
  if (flags.has("server")) return Serve(static_cast<int>(port));

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Loopback(static_cast<int>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a)) {
    std::perror("tcp_pingpong: connect");
    return 1;
  }
  NoDelay(fd);
  const uint32_t n = static_cast<uint32_t>(bytes);
  WriteFull(fd, reinterpret_cast<const char*>(&n), 4);
  std::vector<char> out(n, 'p'), in(n);
  std::deque<Clock::time_point> sent;
  for (long i = 0; i < depth; ++i) {
    sent.push_back(Clock::now());
    WriteFull(fd, out.data(), n);
  }
  rdmarpc::bench::Histogram h;
  const auto measure_from = Clock::now() + std::chrono::seconds(warmup);
  const auto until = measure_from + std::chrono::seconds(duration);
  uint64_t counted = 0;
  for (;;) {
    if (!ReadFull(fd, in.data(), n)) {
      std::cerr << "tcp_pingpong: connection lost\n";
      return 1;
    }
    const auto now = Clock::now();
    if (now >= measure_from) {
      h.Record(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - sent.front()).count()));
      ++counted;
    }
    sent.pop_front();
    if (now >= until) break;
    sent.push_back(Clock::now());
    WriteFull(fd, out.data(), n);
  }
  const double secs = static_cast<double>(duration);
  auto us = [&](double q) { return h.Quantile(q) / 1000.0; };
  if (flags.has("json")) {
    std::printf(
        "{\"bytes\":%ld,\"depth\":%ld,\"calls\":%lu,\"calls_per_s\":%.0f,\"p50_us\":%.1f,"
        "\"p90_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f}\n",
        bytes, depth, static_cast<unsigned long>(counted), counted / secs, us(0.5), us(0.9),
        us(0.99), us(0.999), h.max() / 1000.0);
  } else {
    std::printf(
        "tcp_pingpong: %ld B, depth %ld: %.0f round trips/s; latency us: p50 %.1f p90 %.1f "
        "p99 %.1f p99.9 %.1f max %.1f\n",
        bytes, depth, counted / secs, us(0.5), us(0.9), us(0.99), us(0.999), h.max() / 1000.0);
  }
  close(fd);
  return 0;
}

// A raw TCP client for hostile-client tests: a socket that has done the handshake and then speaks
// frames byte by byte, without a channel, so that tests can send what no channel would.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "rpc/internal/frame.h"
#include "transport/handshake.h"

namespace rdmarpc::testing {

// A blocking socket connected to 127.0.0.1:`port`, nothing sent; from address `from` (another
// loopback address, e.g. 127.0.0.2, for a second client address) when given.
inline int RawConnect(uint16_t port, const char* from = nullptr) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  if (from) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    REQUIRE(inet_pton(AF_INET, from, &src.sin_addr) == 1);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) == 0);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// A connection to 127.0.0.1:`port` that has sent its HELLO (the answer is left unread, like
// everything else the server sends), non-blocking from then on.
inline int RawClient(uint16_t port, const char* from = nullptr) {
  const int fd = RawConnect(port, from);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint8_t hello[transport::kHelloBytes];
  transport::EncodeHello(transport::Hello{}, hello);
  REQUIRE(write(fd, hello, sizeof hello) == ssize_t(sizeof hello));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

// `frame` as the TCP transport carries it: a u32 little-endian length prefix, then its bytes.
inline std::string LengthPrefixed(std::string_view frame) {
  const uint32_t len = htole32(static_cast<uint32_t>(frame.size()));
  return std::string(reinterpret_cast<const char*>(&len), 4) + std::string(frame);
}

// One length-prefixed frame: `h` (its metadata_bytes as given), then `body` (metadata and
// payload).
inline std::string FrameBytes(const FrameHeader& h, std::string_view body) {
  std::string f(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(h, reinterpret_cast<std::byte*>(f.data()));
  f += body;
  return LengthPrefixed(f);
}

// Sends `bytes`, waiting while the socket is full: true once all went; false when the server
// closed the connection, or `within` passed first (a server that stopped reading us may never
// take the rest).
inline bool SendAll(int fd, std::string_view bytes,
                    std::chrono::milliseconds within = std::chrono::hours(24)) {
  const auto until = std::chrono::steady_clock::now() + within;
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n > 0) {
      at += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      if (std::chrono::steady_clock::now() >= until) return false;
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 20);
    } else {
      return false;  // closed by the server
    }
  }
  return true;
}

// What a server sends on a raw connection, frame by frame: the handshake's answer is skipped,
// decoded bytes are let go of (a stream can send a lot). Keep one per connection.
class FrameReader {
 public:
  enum class Got { kFrame, kNothing, kClosed, kBad };

  // The next frame in `*out` (valid until the next call): kFrame; kNothing when none came
  // within `within` (0: only what is waiting now); kClosed when the server closed or reset;
  // kBad when what came is not a frame (`error()` says why).
  Got Next(int fd, std::chrono::milliseconds within, DecodedFrame* out) {
    const auto until = std::chrono::steady_clock::now() + within;
    in_.erase(0, consumed_);
    consumed_ = 0;
    for (;;) {
      if (skip_ == 0 && in_.size() >= 4) {
        uint32_t len;
        std::memcpy(&len, in_.data(), 4);
        len = le32toh(len);
        if (len > (64u << 20)) {
          error_ = "a length prefix of " + std::to_string(len);
          return Got::kBad;
        }
        if (in_.size() >= 4 + size_t{len}) {
          auto frame = std::span(reinterpret_cast<const std::byte*>(in_.data() + 4), len);
          if (std::string err = DecodeFrame(frame, out); !err.empty()) {
            error_ = "a frame that does not decode: " + err;
            return Got::kBad;
          }
          consumed_ = 4 + size_t{len};
          return Got::kFrame;
        }
      }
      char buf[65536];
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return Got::kClosed;
      if (n > 0) {
        size_t at = 0;
        if (skip_ > 0) {
          at = std::min(skip_, static_cast<size_t>(n));
          skip_ -= at;
        }
        in_.append(buf + at, static_cast<size_t>(n) - at);
        continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return Got::kNothing;
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
    }
  }
  const std::string& error() const { return error_; }

 private:
  std::string in_;
  size_t consumed_ = 0;
  size_t skip_ = transport::kAnswerBytes;
  std::string error_;
};

}  // namespace rdmarpc::testing

// Internal: turns the TCP byte stream back into messages. Each message on the wire is a u32
// little-endian length, then that many bytes. The socket reads straight into the buffer
// (Writable/Commit) and messages are handed out in place (Next), so nothing is copied; a message
// larger than the buffer grows it once to fit. Pure logic, no I/O: fuzzed by tools/fuzz.
#pragma once

#include <endian.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace rdmarpc::transport::tcp {

inline constexpr size_t kLengthPrefixBytes = 4;

class StreamReassembler {
 public:
  enum class Result { kMessage, kNeedMore, kTooLarge };

  // `max_message` bounds one message's length (a larger prefix is an error, not an allocation).
  StreamReassembler(size_t initial_bytes, size_t max_message)
      : initial_(initial_bytes), max_message_(max_message) {
    buf_.resize(initial_bytes);
  }

  // Where the next read may put bytes (never empty).
  std::span<std::byte> Writable() {
    if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);
    return {buf_.data() + end_, buf_.size() - end_};
  }
  void Commit(size_t n) { end_ += n; }

  // The next complete message, in place: valid until the next call to anything but Next.
  // kTooLarge: the prefix announces more than max_message (`too_large` says how much).
  Result Next(std::span<const std::byte>* message, uint32_t* too_large = nullptr) {
    if (end_ - begin_ < kLengthPrefixBytes) return Result::kNeedMore;
    uint32_t len;
    std::memcpy(&len, buf_.data() + begin_, 4);
    len = le32toh(len);
    if (len > max_message_) {
      if (too_large) *too_large = len;
      return Result::kTooLarge;
    }
    const size_t need = kLengthPrefixBytes + size_t{len};
    if (end_ - begin_ < need) {
      // Make room for the rest of this message in one go.
      if (begin_ > 0) {
        std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      if (need > buf_.size()) buf_.resize(need);
      return Result::kNeedMore;
    }
    *message = std::span<const std::byte>(buf_.data() + begin_ + kLengthPrefixBytes, len);
    begin_ += need;
    return Result::kMessage;
  }

  // Call when Next says kNeedMore: an empty buffer that grew for a large message shrinks back,
  // so that idle connections stay small.
  void Settle(size_t shrink_above) {
    if (begin_ != end_) return;
    begin_ = end_ = 0;
    if (buf_.size() > shrink_above) {
      buf_.resize(initial_);
      buf_.shrink_to_fit();
    }
  }

  size_t buffered() const { return end_ - begin_; }
  size_t capacity() const { return buf_.size(); }

 private:
  size_t initial_, max_message_;
  std::vector<std::byte> buf_;
  size_t begin_ = 0, end_ = 0;
};

}  // namespace rdmarpc::transport::tcp

// Internal: turns the TCP byte stream back into messages. Each message on the wire is a u32
// little-endian length, then that many bytes. The socket reads straight into the buffer
// (Writable/Commit) and messages are handed out in place (Next), so nothing is copied.
//
// Memory is bounded by what the peer actually sent, never by what it announced: a length prefix
// alone allocates nothing, the buffer grows (doubling) only as bytes arrive, and it never holds
// more than max(initial, one whole message of at most max_message) — so capacity() <=
// max(initial_bytes, kLengthPrefixBytes + max_message) whatever the read boundaries are.
// Pure logic, no I/O: fuzzed by tools/fuzz (which checks that bound too).
//
// Each allocation has kSlopBytes more than its capacity, never written, so that every message
// handed out is followed by that many readable bytes (transport::kMessageSlopBytes: the next
// message's, or those).
#pragma once

#include <endian.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

namespace rdmarpc::transport::tcp {

inline constexpr size_t kLengthPrefixBytes = 4;

class StreamReassembler {
 public:
  enum class Result { kMessage, kNeedMore, kTooLarge };

  // `max_message` bounds one message's length (a larger prefix is an error, not an allocation).
  StreamReassembler(size_t initial_bytes, size_t max_message)
      : initial_(std::max<size_t>(initial_bytes, kLengthPrefixBytes)),
        max_message_(max_message),
        buf_(std::make_unique_for_overwrite<std::byte[]>(initial_ + kSlopBytes)),
        cap_(initial_) {}

  // Where the next read may put bytes (never empty). Call only after Next said kNeedMore (or
  // kTooLarge): the buffer then holds at most part of one message, and makes room for the rest
  // of it by moving that part to the front, then by growing.
  std::span<std::byte> Writable() {
    const size_t want = Wanted();
    if (begin_ > 0 && (end_ == cap_ || begin_ + want > cap_)) {
      std::memmove(buf_.get(), buf_.get() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == cap_) Reallocate(GrownCapacity());
    return {buf_.get() + end_, cap_ - end_};
  }
  void Commit(size_t n) { end_ += n; }

  // The next complete message, in place: valid until the next call to anything but Next.
  // kTooLarge: the prefix announces more than max_message (`too_large` says how much).
  Result Next(std::span<const std::byte>* message, uint32_t* too_large = nullptr) {
    if (end_ - begin_ < kLengthPrefixBytes) return Result::kNeedMore;
    const uint32_t len = PrefixAt(begin_);
    if (len > max_message_) {
      if (too_large) *too_large = len;
      return Result::kTooLarge;
    }
    const size_t need = kLengthPrefixBytes + size_t{len};
    if (end_ - begin_ < need) return Result::kNeedMore;
    *message = std::span<const std::byte>(buf_.get() + begin_ + kLengthPrefixBytes, len);
    begin_ += need;
    return Result::kMessage;
  }

  // Call when Next says kNeedMore. A buffer that grew past `shrink_above` for a large message
  // shrinks back once kQuietSettles calls in a row found nothing large pending, so that a
  // connection that stops sending large messages gets small again. Not at the first such call:
  // shrinking as soon as each large message was gone made a stream of them regrow the buffer,
  // copying each message once more (1 MiB messages over TCP at a third of their speed).
  void Settle(size_t shrink_above) {
    if (begin_ == end_) begin_ = end_ = 0;
    if (cap_ <= shrink_above) return;
    if (end_ - begin_ > initial_ || Wanted() > initial_) {
      quiet_settles_ = 0;
      return;
    }
    if (++quiet_settles_ >= kQuietSettles) {
      Reallocate(initial_);
      quiet_settles_ = 0;
    }
  }

  static constexpr int kQuietSettles = 8;
  static constexpr size_t kSlopBytes = 16;

  size_t buffered() const { return end_ - begin_; }
  size_t capacity() const { return cap_; }
  // Whether a message larger than the initial buffer has partly arrived: the buffer grows, or
  // has grown, for it.
  bool unfinished_large() const { return end_ != begin_ && Wanted() > initial_; }
  // What the buffer holds once grown past its initial size, or takes at its next growth, as
  // whole capacities: when it is full of an unfinished large message (the next Writable grows
  // it), the capacity it grows to; else its capacity once it has grown (for a message arriving,
  // or kept for the next); else 0. What a peer's large messages make us hold, known before the
  // buffer grows for them.
  size_t held() const {
    if (full() && unfinished_large()) return GrownCapacity();
    return cap_ > initial_ ? cap_ : 0;
  }
  // Whether the buffer is full (part of a message in all of it).
  bool full() const { return end_ - begin_ == cap_; }
  // Gives a grown buffer back, keeping what it holds, when that fits the initial size: true if
  // it did. Not while a read may write into the buffer.
  bool Shrink() {
    if (cap_ <= initial_ || end_ - begin_ > initial_) return false;
    Reallocate(initial_);
    quiet_settles_ = 0;
    return true;
  }
  // Times the buffer was replaced (grown or shrunk), each a copy of what it held: for tests.
  size_t reallocations() const { return reallocations_; }

 private:
  uint32_t PrefixAt(size_t at) const {
    uint32_t len;
    std::memcpy(&len, buf_.get() + at, 4);
    return le32toh(len);
  }

  // Bytes the message at begin_ occupies in all, as far as is known (just its prefix until the
  // prefix has arrived; an oversized one is refused by Next, so it asks for nothing more).
  size_t Wanted() const {
    if (end_ - begin_ < kLengthPrefixBytes) return kLengthPrefixBytes;
    const uint32_t len = PrefixAt(begin_);
    if (len > max_message_) return kLengthPrefixBytes;
    return kLengthPrefixBytes + size_t{len};
  }

  // What a full buffer grows to: double, but never past what the message being read needs.
  size_t GrownCapacity() const {
    const size_t next = std::min(cap_ * 2, std::max(Wanted(), initial_));
    return next > cap_ ? next : cap_ + initial_;  // (only when misused: a whole message unread)
  }

  // Moves the buffered bytes to the front of a new buffer of `bytes` (left uninitialised: reads
  // overwrite it, so zeroing it would be wasted work).
  void Reallocate(size_t bytes) {
    auto next = std::make_unique_for_overwrite<std::byte[]>(bytes + kSlopBytes);
    const size_t n = end_ - begin_;
    if (n) std::memcpy(next.get(), buf_.get() + begin_, n);
    buf_ = std::move(next);
    ++reallocations_;
    cap_ = bytes;
    begin_ = 0;
    end_ = n;
  }

  size_t initial_, max_message_;
  std::unique_ptr<std::byte[]> buf_;
  size_t cap_;
  size_t begin_ = 0, end_ = 0;
  int quiet_settles_ = 0;
  size_t reallocations_ = 0;
};

}  // namespace rdmarpc::transport::tcp

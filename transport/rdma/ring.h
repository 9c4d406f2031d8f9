// The ring protocol's bookkeeping, free of verbs so that it can be unit-tested without a NIC.
//
// The sender writes records into the peer's receive ring (RDMA_WRITE_WITH_IMM). Records are
// 64-byte aligned and never wrap: when the tail lacks room, the sender skips to offset 0 and the
// skipped bytes count as used. The receiver frees records as it consumes them and returns the
// freed byte count as credits; the sender never has more than the ring's size unfreed, so a full
// ring is backpressure, never an overwrite. See docs/PROTOCOL.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "transport/expected.h"

namespace rdmarpc::transport::rdma {

inline constexpr uint32_t kRecordAlignBytes = 64;
// Immediate data: bit 31 set = credit return of (imm & kImmMask) * 64 bytes; else bit 30 set =
// FIN: the large message exposed in slot (imm & kImmFinSlotMask) has been read; else a record at
// offset (imm & kImmMask) * 64 (a ring is at most 32 KiB, so offsets never reach bit 30).
inline constexpr uint32_t kImmCreditBit = 0x80000000u;
inline constexpr uint32_t kImmFinBit = 0x40000000u;
inline constexpr uint32_t kImmFinSlotMask = 0xffu;
inline constexpr uint32_t kImmMask = 0x7fffffffu;

constexpr uint64_t AlignRecord(uint64_t n) {
  return (n + kRecordAlignBytes - 1) & ~uint64_t(kRecordAlignBytes - 1);
}

// Sender's view of the peer's ring.
class SendRing {
 public:
  // `granted`: whether the whole ring may be written at once. A connection starts without
  // credit (false) and waits for the receiver's first credit, which grants the whole ring once
  // it is writable (see docs/PROTOCOL.md, "Ring protection").
  explicit SendRing(uint32_t ring_bytes, bool granted = true)
      : size_(ring_bytes), granted_(granted) {}

  // The largest record Reserve accepts: a quarter of the ring, which guarantees progress (the
  // receiver returns credits at latest once a quarter of the ring is freed).
  uint32_t max_record_bytes() const { return size_ / 4; }

  // Reserves room for a record of `bytes`; returns its offset, or nullopt when the credits do not
  // cover it yet (try again after OnCredit). bytes must be <= max_record_bytes().
  std::optional<uint32_t> Reserve(uint32_t bytes) {
    if (!granted_) return std::nullopt;
    const uint64_t need = AlignRecord(bytes);
    const uint64_t skip = size_ - tail_ < need ? size_ - tail_ : 0;
    if (used() + skip + need > size_) return std::nullopt;
    if (skip) tail_ = 0;
    const uint32_t at = tail_;
    tail_ += need;
    if (tail_ == size_) tail_ = 0;
    written_ += skip + need;
    return at;
  }

  // The receiver freed `bytes` more (or, first of all, granted the whole ring). Returns false
  // if that is more than was ever written, or a first credit that is not the whole ring (a
  // protocol violation).
  bool OnCredit(uint64_t bytes) {
    if (!granted_) {
      granted_ = bytes == size_;
      return granted_;
    }
    if (freed_ + bytes > written_) return false;
    freed_ += bytes;
    return true;
  }

  uint64_t used() const { return written_ - freed_; }
  uint32_t size() const { return size_; }

 private:
  uint32_t size_;
  bool granted_;
  uint32_t tail_ = 0;
  uint64_t written_ = 0, freed_ = 0;
};

// Receiver's view of its own ring: validates each arriving record against the protocol and
// counts what it frees.
class ReceiveRing {
 public:
  explicit ReceiveRing(uint32_t ring_bytes) : size_(ring_bytes) {}

  // A record of `bytes` arrived at `offset`. Succeeds if that is where the protocol says the
  // next record may be (at the head, or at 0 after a skip) and it fits; else says what is
  // wrong. On success the record counts as consumed (call after using it).
  Expected<void> Accept(uint64_t offset, uint64_t bytes) {
    if (offset >= size_ || bytes > size_ - offset) {
      return Error{"record at " + std::to_string(offset) + " of " + std::to_string(bytes) +
                   " bytes is outside the " + std::to_string(size_) + "-byte ring"};
    }
    if (bytes == 0) return Error{"empty record"};
    uint64_t skipped = 0;
    if (offset != head_) {
      if (offset != 0) {
        return Error{"record at " + std::to_string(offset) + ", expected " + std::to_string(head_)};
      }
      skipped = size_ - head_;
    }
    const uint64_t used = AlignRecord(bytes);
    if (offset + used > size_) return Error{"record overruns the ring"};
    // Everything consumed since the last credit return is still charged to the sender, which may
    // never have more than the ring unfreed: beyond that it wrote without credit (over records
    // this side has not consumed yet, or past a pause that withholds credit).
    if (unreported_ + skipped + used > size_) {
      return Error{"peer wrote past its credits (" + std::to_string(unreported_ + skipped + used) +
                   " bytes unreturned in a " + std::to_string(size_) + "-byte ring)"};
    }
    head_ = offset + used;
    if (head_ == size_) head_ = 0;
    unreported_ += skipped + used;
    return {};
  }

  // Accept's common case, small enough to inline and building no result: a record at the head
  // that fits and is covered by credit. Returns false, changing nothing, for anything else;
  // Accept then decides (a skip to 0 is valid) and says what is wrong.
  bool AcceptAtHead(uint64_t offset, uint64_t bytes) {
    if (offset != head_ || bytes == 0 || offset >= size_ || bytes > size_ - offset) return false;
    const uint64_t used = AlignRecord(bytes);
    if (offset + used > size_ || unreported_ + used > size_) return false;
    head_ = offset + used;
    if (head_ == size_) head_ = 0;
    unreported_ += used;
    return true;
  }

  // Credits to return now: everything freed since the last report, once at least `threshold`
  // bytes (or `force`). Returns 0 when nothing is due.
  uint64_t TakeCredits(uint64_t threshold) {
    if (unreported_ == 0 || unreported_ < threshold) return 0;
    uint64_t c = unreported_;
    unreported_ = 0;
    return c;
  }

  uint64_t unreported() const { return unreported_; }
  uint64_t head() const { return head_; }

 private:
  uint64_t size_;
  uint64_t head_ = 0;
  uint64_t unreported_ = 0;
};

}  // namespace rdmarpc::transport::rdma

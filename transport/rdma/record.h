// Records, the unit a sender writes into its peer's receive ring (docs/PROTOCOL.md): an 8-byte
// header (u32 total message bytes, u32 kind, little-endian), then a body. A data record carries
// a message, or one chunk of a message too large for one record; a rendezvous record says where
// the peer may RDMA READ a large message from (u64 address, u32 rkey, u32 slot).
//
// RecordAssembler is the receiving side's turning of records back into messages. It is free of
// verbs (the ring's bookkeeping is ring.h's), so that the parsing of bytes a peer wrote is unit
// tested (test/rdma_record_test.cc) and fuzzed (tools/fuzz/record_fuzz.cc) without a NIC.
// Threading: none; one per connection, on its I/O thread.
#pragma once

#include <endian.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace rdmarpc::transport::rdma {

inline constexpr uint32_t kRecordHeaderBytes = 8;
inline constexpr uint32_t kRecordData = 0;
inline constexpr uint32_t kRecordRendezvous = 1;
inline constexpr uint32_t kRendezvousBodyBytes = 16;

inline uint32_t LoadLe32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return le32toh(v);
}
inline void StoreLe32(std::byte* p, uint32_t v) {
  v = htole32(v);
  std::memcpy(p, &v, 4);
}

// A record's header fields; `rec` must hold at least kRecordHeaderBytes.
inline void StoreRecordHeader(std::byte* rec, uint32_t total, uint32_t kind) {
  StoreLe32(rec, total);
  StoreLe32(rec + 4, kind);
}
inline uint32_t RecordTotal(const std::byte* rec) { return LoadLe32(rec); }
inline uint32_t RecordKind(const std::byte* rec) { return LoadLe32(rec + 4); }

// Where a large message waits to be read: the sender's address, the rkey of the window over it,
// and the slot the reader names in its FIN.
struct Rendezvous {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t slot = 0;
};
inline void StoreRendezvous(std::byte* body, const Rendezvous& r) {
  const uint64_t addr = htole64(r.addr);
  std::memcpy(body, &addr, 8);
  StoreLe32(body + 8, r.rkey);
  StoreLe32(body + 12, r.slot);
}
inline Rendezvous LoadRendezvous(const std::byte* body) {
  Rendezvous r;
  std::memcpy(&r.addr, body, 8);
  r.addr = le64toh(r.addr);
  r.rkey = LoadLe32(body + 8);
  r.slot = LoadLe32(body + 12);
  return r;
}

class RecordAssembler {
 public:
  // Messages over `max_message_bytes` are refused (as the peer's error) from their header alone.
  explicit RecordAssembler(size_t max_message_bytes) : max_message_bytes_(max_message_bytes) {}

  // A reassembled message is followed by this many bytes of padding in its buffer
  // (transport::kMessageSlopBytes: messages handed up are followed by readable bytes).
  static constexpr size_t kSlopBytes = 16;

  struct Result {
    enum Kind {
      kNeedMore,    // a chunk of a message whose rest is still to come
      kMessage,     // a whole message: `message`
      kRendezvous,  // a large message to read: `total` bytes at `rendezvous`
      kError,       // the peer broke the protocol: `error` says how; close the connection
    };
    Kind kind = kNeedMore;
    // kMessage: inside the record itself when it came whole (the common case, no copy), else in
    // this assembler, valid until the next Add, Release or Reset.
    std::span<const std::byte> message;
    uint32_t total = 0;
    Rendezvous rendezvous;
    std::string error;
  };

  // Add's common case, small enough to inline and building no Result (whose error string and
  // return cost ~50 instructions per message): a whole message in one data record while nothing
  // is being assembled. Sets `*message` to it (inside the record) and returns true; else
  // returns false, changing nothing, and the record goes to Add.
  bool Whole(std::span<const std::byte> record, std::span<const std::byte>* message) const {
    if (assembling_ || record.size() < kRecordHeaderBytes ||
        RecordKind(record.data()) != kRecordData) {
      return false;
    }
    const uint32_t total = RecordTotal(record.data());
    if (total > max_message_bytes_ || record.size() - kRecordHeaderBytes != total) return false;
    *message = record.subspan(kRecordHeaderBytes);
    return true;
  }

  // The next record of the ring, header included, in ring order.
  Result Add(std::span<const std::byte> record) {
    Result r;
    if (Whole(record, &r.message)) {  // (the one definition of a whole message in one record)
      r.kind = Result::kMessage;
      return r;
    }
    if (record.size() < kRecordHeaderBytes) {
      return Error("protocol error: record shorter than its header");
    }
    const uint32_t total = RecordTotal(record.data());
    const uint32_t kind = RecordKind(record.data());
    const std::span<const std::byte> body = record.subspan(kRecordHeaderBytes);
    if (total > max_message_bytes_) {
      return Error("peer sent a message of " + std::to_string(total) +
                   " bytes, over the limit of " + std::to_string(max_message_bytes_));
    }
    if (kind == kRecordRendezvous) {
      if (assembling_ || body.size() != kRendezvousBodyBytes || total == 0) {
        return Error("protocol error: malformed rendezvous record");
      }
      r.kind = Result::kRendezvous;
      r.total = total;
      r.rendezvous = LoadRendezvous(body.data());
      return r;
    }
    if (kind != kRecordData) {
      return Error("protocol error: unknown record kind " + std::to_string(kind));
    }
    if (!assembling_) {
      if (body.size() > total) return Error("protocol error: record longer than its message");
      assembling_ = true;
      partial_total_ = total;
      partial_.clear();
      // Grows with the chunks that arrive, not with what the header announces: a peer cannot
      // make us allocate for a message it never sends.
      partial_.insert(partial_.end(), body.begin(), body.end());
      return r;
    }
    if (total != partial_total_ || partial_.size() + body.size() > total) {
      return Error("protocol error: inconsistent chunk of a large message");
    }
    // The last chunk: room for the padding a message handed up is followed by (at most one
    // reallocation, which the insert would otherwise have made).
    if (partial_.size() + body.size() == total) partial_.reserve(total + kSlopBytes);
    partial_.insert(partial_.end(), body.begin(), body.end());
    if (partial_.size() < total) return r;
    assembling_ = false;
    partial_.resize(total + kSlopBytes);
    r.kind = Result::kMessage;
    r.message = std::span<const std::byte>(partial_.data(), total);
    return r;
  }

  // After a reassembled message was handed on: frees its buffer (large messages are rare on
  // this path, and an idle connection should not keep one's worth of memory).
  void Release() {
    if (!assembling_ && partial_.capacity() != 0) partial_ = {};
  }
  // Drops a half-assembled message (the connection closed).
  void Reset() {
    assembling_ = false;
    partial_ = {};
  }

  bool assembling() const { return assembling_; }
  // Bytes of the message being assembled held so far (for tests: never more than arrived).
  size_t buffered() const { return partial_.size(); }

 private:
  static Result Error(std::string why) {
    Result r;
    r.kind = Result::kError;
    r.error = std::move(why);
    return r;
  }

  size_t max_message_bytes_;
  bool assembling_ = false;
  uint32_t partial_total_ = 0;
  std::vector<std::byte> partial_;
};

}  // namespace rdmarpc::transport::rdma

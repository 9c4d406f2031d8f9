// Fuzz target: the RDMA receiver's record reassembly (transport/rdma/record.h), fed the records
// a hostile peer could write into its ring, through the whole-message fast path first (Whole)
// and the general Add after, as the receiver does. Input: byte 0 sets the message limit (1 + 4*b),
// then records as [u8 length][length bytes] (header included). The messages and rendezvous handed
// out must be exactly those a plain reference parse finds, an error must stop the stream, and the
// reassembly buffer must never hold more than the chunks that arrived for the current message.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "transport/rdma/record.h"

namespace {
using rdmarpc::transport::rdma::RecordAssembler;
using Result = RecordAssembler::Result;

uint32_t Le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// What each record must produce: "M:<bytes>", "R:<total>:<addr>:<rkey>:<slot>", "" (need more)
// or "E" (error, end of stream).
struct Reference {
  size_t max;
  bool assembling = false;
  uint32_t total = 0;
  std::string buf;
  std::string Add(const uint8_t* r, size_t n) {
    if (n < 8) return "E";
    const uint32_t t = Le32(r), kind = Le32(r + 4);
    const std::string body(reinterpret_cast<const char*>(r + 8), n - 8);
    if (t > max) return "E";
    if (kind == 1) {
      if (assembling || body.size() != 16 || t == 0) return "E";
      uint64_t addr = 0;
      for (int i = 7; i >= 0; --i) addr = addr << 8 | r[8 + i];
      return "R:" + std::to_string(t) + ":" + std::to_string(addr) + ":" +
             std::to_string(Le32(r + 16)) + ":" + std::to_string(Le32(r + 20));
    }
    if (kind != 0) return "E";
    if (!assembling) {
      if (body.size() == t) return "M:" + body;
      if (body.size() > t) return "E";
      assembling = true;
      total = t;
      buf = body;
      return "";
    }
    if (t != total || buf.size() + body.size() > t) return "E";
    buf += body;
    if (buf.size() < t) return "";
    assembling = false;
    return "M:" + buf;
  }
};

std::string Describe(const Result& r) {
  switch (r.kind) {
    case Result::kNeedMore:
      return "";
    case Result::kError:
      return "E";
    case Result::kMessage:
      return "M:" + std::string(reinterpret_cast<const char*>(r.message.data()), r.message.size());
    case Result::kRendezvous:
      return "R:" + std::to_string(r.total) + ":" + std::to_string(r.rendezvous.addr) + ":" +
             std::to_string(r.rendezvous.rkey) + ":" + std::to_string(r.rendezvous.slot);
  }
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t max_message = 1 + data[0] * 4;
  RecordAssembler a(max_message);
  Reference ref{max_message};
  size_t arrived = 0;  // body bytes of the message being assembled
  for (size_t at = 1; at < size;) {
    const size_t n = std::min<size_t>(data[at], size - at - 1);
    // A copy of exactly the record's bytes, so that ASan sees any read past it.
    std::vector<std::byte> rec(n);
    if (n) std::memcpy(rec.data(), data + at + 1, n);
    at += 1 + n;
    const std::string want = ref.Add(data + at - n, n);
    // The receiver tries the whole-message fast path first, as RdmaConnection::OnRecord does:
    // it must hand out exactly the reference's message, in place, and leave no state behind.
    if (std::span<const std::byte> whole; a.Whole(rec, &whole)) {
      if (want != "M:" + std::string(reinterpret_cast<const char*>(whole.data()), whole.size()) ||
          whole.data() != rec.data() + 8 || a.assembling() || a.buffered() != 0) {
        std::abort();
      }
      continue;
    }
    const Result r = a.Add(rec);
    if (Describe(r) != want) std::abort();
    // A message in place in the record is one the fast path should have taken.
    if (r.kind == Result::kMessage && !r.message.empty() && r.message.data() >= rec.data() &&
        r.message.data() < rec.data() + n) {
      std::abort();
    }
    if (r.kind == Result::kError) break;
    if (r.kind == Result::kNeedMore) {
      arrived += n - 8;
      if (a.buffered() != arrived || !a.assembling()) std::abort();
    } else if (r.kind == Result::kMessage) {
      if (r.message.size() > max_message) std::abort();
      a.Release();
      arrived = 0;
      if (a.buffered() != 0) std::abort();
    }
  }
  return 0;
}

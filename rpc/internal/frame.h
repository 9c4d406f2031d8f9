// The RPC frame: a fixed 32-byte header, optional metadata, then the payload. The byte-by-byte
// layout is in docs/PROTOCOL.md; keep the two in step. All integers are little-endian.
//
// A frame is one transport message, so its total length comes from the transport and the
// payload length is derived: payload = message - header - metadata.
#pragma once

#include <endian.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rpc/metadata.h"

namespace rdmarpc {

inline constexpr uint8_t kFrameMagic = 0xA7;
inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 32;
// Metadata is small by design (routing keys, trace ids); larger data belongs in the message.
inline constexpr size_t kMaxMetadataBytes = 64 * 1024;
// ... and has few entries. Each decoded entry costs two strings (64 bytes) beyond its bytes on
// the wire (6 + key + value): 64 KiB of empty entries (10,922) took ~700 KiB to hold, for as
// long as their call ran.
inline constexpr size_t kMaxMetadataEntries = 1024;
// What a server counts against its memory budgets (ServerOptions::max_buffered_bytes*) for a
// running call beside its request's bytes: what the runtime holds for it (its context, the
// call's state, the handler's coroutine frames; measured in malloc'd bytes per call with 1,000
// running: a unary call of the test service 2,371, a client stream 2,816, a bidirectional one
// 3,160), and for each entry of its metadata the pair of strings and the allocator's overhead
// of the two that do not fit in place. Uncounted, a peer held 3 KiB of a server for each
// 48-byte REQUEST opening a stream it never used, up to max_concurrent_calls_per_connection on
// each connection, and the server-wide bound saw 48 bytes.
inline constexpr size_t kCallHeldBytes = 3 << 10;
inline constexpr size_t kMetadataEntryHeldBytes = sizeof(Metadata::value_type) + 32;
// ... and for each client stream message waiting to be read, beside its frame's bytes (what the
// flow-control window counts): its string, the 16 bytes of padding it is kept with and the
// allocator's overhead. Empty messages, 32 bytes on the wire, held about twice that: two
// clients filling their streams' windows with them took a server to 26 MiB each against a
// budget of 16.
inline constexpr size_t kStreamMessageHeldBytes = 64;

// Empty if `md` may be sent (within kMaxMetadataBytes encoded and kMaxMetadataEntries), else why
// not: the RESOURCE_EXHAUSTED a caller gets before anything is sent.
std::string MetadataOverLimit(const Metadata& md);

// The text of the RESOURCE_EXHAUSTED for a frame over the message limit, both ends alike: `what`
// ("request", "reply", "stream message") of `frame_bytes` against `limit`.
inline std::string OverLimitText(std::string_view what, size_t frame_bytes, size_t limit) {
  return std::string(what) + " of " + std::to_string(frame_bytes) +
         " bytes exceeds the message limit of " + std::to_string(limit);
}

// A status message on the wire (RESPONSE with an error, GOAWAY) is text for people and logs, not a
// data channel: at most this many bytes. StatusTextCut: the longest prefix of `text` within the
// limit that does not end inside a UTF-8 sequence.
inline constexpr size_t kMaxStatusMessageBytes = 4096;
inline std::string_view StatusTextCut(std::string_view text) {
  if (text.size() <= kMaxStatusMessageBytes) return text;
  size_t cut = kMaxStatusMessageBytes;
  // Back up over continuation bytes (10xxxxxx) so that the sequence they belong to is left out
  // whole (at most 3 steps in valid UTF-8; text that is not UTF-8 just loses a few bytes more).
  for (int i = 0; i < 3 && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80; ++i) {
    --cut;
  }
  return text.substr(0, cut);
}

// GOAWAY flags: the server closes a connection that was idle (ServerOptions::idle_timeout);
// nothing is wrong, and the client reconnects when it next has a call.
inline constexpr uint8_t kGoAwayFlagIdle = 0x01;
// How an UNIMPLEMENTED answer for an unserved method_id begins ("... 0x1234abcd on this
// server"): the wire carries only the id, and the client, which knows the method's name, finds
// this prefix and puts the name in the Status it returns.
inline constexpr std::string_view kUnknownMethodPrefix = "unknown method id ";

enum class FrameType : uint8_t {
  kRequest = 1,
  kResponse = 2,
  kCancel = 3,
  kPing = 4,
  kPong = 5,
  kGoAway = 6,
  kSettings = 7,
  kStreamMessage = 8,  // one message of a stream, in order (either direction)
  kWindow = 9,         // stream flow control: the receiver read this much more (either direction)
};

// REQUEST flags: which way the call streams. The server refuses (UNIMPLEMENTED, naming both
// kinds) a request whose flags do not match its method's kind, so that client and server built
// from different .proto files fail clearly instead of waiting on each other.
inline constexpr uint8_t kRequestFlagClientStream = 0x01;  // messages follow as STREAM_MESSAGE
inline constexpr uint8_t kRequestFlagServerStream = 0x02;  // replies come as STREAM_MESSAGE
// STREAM_MESSAGE flag, client -> server only: the client has sent its last message (half-close,
// "writes done"); the payload is empty.
inline constexpr uint8_t kStreamFlagEnd = 0x01;

// Streams, in each direction: a sender may send a stream's next message while the frame bytes
// it has sent on that stream beyond what the receiver has acknowledged with WINDOW frames are
// under this (so a message larger than the window still goes, alone). The receiver acknowledges
// as its reader takes messages, once half a window has been read. What a slow reader makes
// either side hold per stream: at most this plus one message.
inline constexpr uint64_t kStreamWindowBytes = 256 * 1024;
// A stream's send credit after a WINDOW frame of `bytes`: one frame counts for at most 2^40 and
// the credit stays at or under 2^62, so that a peer repeating huge WINDOW frames can neither
// overflow it (undefined behaviour) nor wrap it negative (a writer stalled for good).
inline int64_t AddStreamCredit(int64_t credit, uint64_t bytes) {
  constexpr int64_t kMaxCredit = int64_t{1} << 62;
  const auto add = static_cast<int64_t>(std::min<uint64_t>(bytes, uint64_t{1} << 40));
  return credit >= kMaxCredit - add ? kMaxCredit : credit + add;
}
// A WINDOW frame's payload: u64, the frame bytes read since the last one.
inline constexpr size_t kWindowBytes = 8;
void EncodeWindow(uint64_t bytes, std::byte* dst);  // writes kWindowBytes
// Returns an empty string on success (exactly kWindowBytes), else what is wrong.
std::string DecodeWindow(std::span<const std::byte> payload, uint64_t* bytes);

struct FrameHeader {
  FrameType type = FrameType::kRequest;
  uint8_t flags = 0;
  uint32_t method_id = 0;   // requests: which method; else 0
  uint64_t call_id = 0;     // chosen by the caller, echoed in the response
  uint64_t timeout_us = 0;  // requests: remaining deadline budget; 0 = no deadline
  uint32_t status = 0;      // responses: StatusCode
  uint32_t metadata_bytes = 0;
};

// Writes the header's 32 bytes to dst.
void EncodeFrameHeader(const FrameHeader& h, std::byte* dst);

struct DecodedFrame {
  FrameHeader header;
  std::span<const std::byte> metadata;  // raw; see DecodeMetadata
  std::span<const std::byte> payload;
};

// Little-endian field access for the wire format (memcpy: fields are not aligned). Shared by
// the inline parser below and frame.cc.
namespace frame_detail {
template <class T>
inline void Put(std::byte* dst, T v) {
  if constexpr (sizeof(T) == 2) v = htole16(v);
  if constexpr (sizeof(T) == 4) v = htole32(v);
  if constexpr (sizeof(T) == 8) v = htole64(v);
  std::memcpy(dst, &v, sizeof(T));
}

template <class T>
inline T Get(const std::byte* src) {
  T v;
  std::memcpy(&v, src, sizeof(T));
  if constexpr (sizeof(T) == 2) v = le16toh(v);
  if constexpr (sizeof(T) == 4) v = le32toh(v);
  if constexpr (sizeof(T) == 8) v = le64toh(v);
  return v;
}
}  // namespace frame_detail

// Parses a whole frame in place: true when it is well formed. Builds no error text, so that a
// good frame costs no string (this runs for every message); DecodeFrame says what is wrong.
inline bool ParseFrame(std::span<const std::byte> m, DecodedFrame* out) {
  if (m.size() < kFrameHeaderBytes) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(m.data());
  if (p[0] != kFrameMagic || p[1] != kProtocolVersion) return false;
  if (p[2] < static_cast<uint8_t>(FrameType::kRequest) ||
      p[2] > static_cast<uint8_t>(FrameType::kWindow)) {
    return false;
  }
  FrameHeader& h = out->header;
  h.type = static_cast<FrameType>(p[2]);
  h.flags = p[3];
  const std::byte* b = m.data();
  h.method_id = frame_detail::Get<uint32_t>(b + 4);
  h.call_id = frame_detail::Get<uint64_t>(b + 8);
  h.timeout_us = frame_detail::Get<uint64_t>(b + 16);
  h.status = frame_detail::Get<uint32_t>(b + 24);
  h.metadata_bytes = frame_detail::Get<uint32_t>(b + 28);
  const size_t rest = m.size() - kFrameHeaderBytes;
  if (h.metadata_bytes > rest || h.metadata_bytes > kMaxMetadataBytes) return false;
  out->metadata = m.subspan(kFrameHeaderBytes, h.metadata_bytes);
  out->payload = m.subspan(kFrameHeaderBytes + h.metadata_bytes);
  return true;
}

// Parses a whole frame in place (as ParseFrame). Returns an empty string on success, else what
// is wrong (truncated, bad magic, unsupported version, unknown type, metadata past the end).
std::string DecodeFrame(std::span<const std::byte> message, DecodedFrame* out);

// Metadata entries: u16 key length, u32 value length, key bytes, value bytes; repeated.
size_t MetadataEncodedSize(const Metadata& md);
void EncodeMetadata(const Metadata& md, std::byte* dst);
// The entries of raw metadata, counted no further than kMaxMetadataEntries + 1 (so that a peer's
// 10,000 cost no more to refuse than 1,025) and only as far as they parse (DecodeMetadata then
// says what is wrong).
size_t CountMetadataEntries(std::span<const std::byte> raw);
// Returns an empty string on success, else what is wrong. `entries`, when known
// (CountMetadataEntries), sizes `out` at once.
std::string DecodeMetadata(std::span<const std::byte> raw, Metadata* out, size_t entries = 0);

const char* FrameTypeName(FrameType t);

// The absolute deadline a request's `timeout_us` budget gives when it arrives at `now`. 0 means
// none, and so does a budget beyond a century (kMaxBudgetUs): no caller means it, and adding it
// to the clock would overflow (2^64-1 used to read as "already passed").
inline constexpr uint64_t kMaxBudgetUs = 100ull * 365 * 24 * 3600 * 1000000;
inline std::chrono::steady_clock::time_point DeadlineFromBudget(
    uint64_t timeout_us, std::chrono::steady_clock::time_point now) {
  if (timeout_us == 0 || timeout_us > kMaxBudgetUs)
    return std::chrono::steady_clock::time_point::max();
  return now + std::chrono::microseconds(static_cast<int64_t>(timeout_us));
}

// The payload of the SETTINGS frame a server sends first on every connection: u32 the most
// calls it runs at once for this connection (0 = no limit), u32 the largest message it accepts
// (0 = not announced), u32 feature bits (absent from servers that predate them: read as 0). A
// client waits for it before its first call and keeps within both limits.
struct Settings {
  uint32_t max_concurrent_calls = 0;
  // The largest message the server accepts (0 = not announced): a client fails a larger request
  // alone with RESOURCE_EXHAUSTED instead of sending it and losing the connection.
  uint32_t max_message_bytes = 0;
  uint32_t features = 0;  // kFeature* bits
};
// The server takes client streams (client-streaming and bidirectional calls). A client does not
// open one on a server without it: the caller gets UNIMPLEMENTED saying so, not a hang.
inline constexpr uint32_t kFeatureClientStreams = 0x1;
inline constexpr size_t kSettingsBytes = 12;    // what we send
inline constexpr size_t kMinSettingsBytes = 8;  // what we accept (before feature bits)
void EncodeSettings(const Settings& s, std::byte* dst);
// Returns an empty string on success, else what is wrong.
std::string DecodeSettings(std::span<const std::byte> payload, Settings* out);

}  // namespace rdmarpc

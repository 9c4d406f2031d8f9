// The RPC frame: a fixed 32-byte header, optional metadata, then the payload. The byte-by-byte
// layout is in docs/PROTOCOL.md; keep the two in step. All integers are little-endian.
//
// A frame is one transport message, so its total length comes from the transport and the
// payload length is derived: payload = message - header - metadata.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rdmarpc {

inline constexpr uint8_t kFrameMagic = 0xA7;
inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 32;
// Metadata is small by design (routing keys, trace ids); larger data belongs in the message.
inline constexpr size_t kMaxMetadataBytes = 64 * 1024;

enum class FrameType : uint8_t {
  kRequest = 1,
  kResponse = 2,
  kCancel = 3,
  kPing = 4,
  kPong = 5,
  kGoAway = 6,
  kSettings = 7,
};

struct FrameHeader {
  FrameType type = FrameType::kRequest;
  uint8_t flags = 0;
  uint32_t method_id = 0;     // requests: which method; else 0
  uint64_t call_id = 0;       // chosen by the caller, echoed in the response
  uint64_t timeout_us = 0;    // requests: remaining deadline budget; 0 = no deadline
  uint32_t status = 0;        // responses: StatusCode
  uint32_t metadata_bytes = 0;
};

using Metadata = std::vector<std::pair<std::string, std::string>>;

// Writes the header's 32 bytes to dst.
void EncodeFrameHeader(const FrameHeader& h, std::byte* dst);

struct DecodedFrame {
  FrameHeader header;
  std::span<const std::byte> metadata;  // raw; see DecodeMetadata
  std::span<const std::byte> payload;
};

// Parses a whole frame in place. Returns an empty string on success, else what is wrong
// (truncated, bad magic, unsupported version, unknown type, metadata past the end, ...).
std::string DecodeFrame(std::span<const std::byte> message, DecodedFrame* out);

// Metadata entries: u16 key length, u32 value length, key bytes, value bytes; repeated.
size_t MetadataEncodedSize(const Metadata& md);
void EncodeMetadata(const Metadata& md, std::byte* dst);
// Returns an empty string on success, else what is wrong.
std::string DecodeMetadata(std::span<const std::byte> raw, Metadata* out);

const char* FrameTypeName(FrameType t);

// The payload of the SETTINGS frame a server sends first on every connection: u32 the most
// calls it runs at once for this connection (0 = no limit), u32 reserved. A client waits for it
// before its first call and keeps within the limit.
struct Settings {
  uint32_t max_concurrent_calls = 0;
};
inline constexpr size_t kSettingsBytes = 8;
void EncodeSettings(const Settings& s, std::byte* dst);
// Returns an empty string on success, else what is wrong.
std::string DecodeSettings(std::span<const std::byte> payload, Settings* out);

}  // namespace rdmarpc

#include "rpc/internal/frame.h"

#include <endian.h>

#include <cstring>

namespace rdmarpc {
using frame_detail::Get;
using frame_detail::Put;

const char* FrameTypeName(FrameType t) {
  switch (t) {
    case FrameType::kRequest:
      return "REQUEST";
    case FrameType::kResponse:
      return "RESPONSE";
    case FrameType::kCancel:
      return "CANCEL";
    case FrameType::kPing:
      return "PING";
    case FrameType::kPong:
      return "PONG";
    case FrameType::kGoAway:
      return "GOAWAY";
    case FrameType::kSettings:
      return "SETTINGS";
    case FrameType::kStreamMessage:
      return "STREAM_MESSAGE";
    case FrameType::kWindow:
      return "WINDOW";
  }
  return "UNKNOWN";
}

void EncodeFrameHeader(const FrameHeader& h, std::byte* dst) {
  dst[0] = std::byte{kFrameMagic};
  dst[1] = std::byte{kProtocolVersion};
  dst[2] = std::byte{static_cast<uint8_t>(h.type)};
  dst[3] = std::byte{h.flags};
  Put<uint32_t>(dst + 4, h.method_id);
  Put<uint64_t>(dst + 8, h.call_id);
  Put<uint64_t>(dst + 16, h.timeout_us);
  Put<uint32_t>(dst + 24, h.status);
  Put<uint32_t>(dst + 28, h.metadata_bytes);
}

std::string DecodeFrame(std::span<const std::byte> m, DecodedFrame* out) {
  if (ParseFrame(m, out)) return "";
  // Malformed: say which check failed (ParseFrame's, in its order).
  if (m.size() < kFrameHeaderBytes) {
    return "truncated frame: " + std::to_string(m.size()) + " bytes, header needs " +
           std::to_string(kFrameHeaderBytes);
  }
  if (static_cast<uint8_t>(m[0]) != kFrameMagic) return "bad frame magic";
  if (static_cast<uint8_t>(m[1]) != kProtocolVersion) {
    return "unsupported protocol version " + std::to_string(static_cast<uint8_t>(m[1]));
  }
  const uint8_t type = static_cast<uint8_t>(m[2]);
  if (type < static_cast<uint8_t>(FrameType::kRequest) ||
      type > static_cast<uint8_t>(FrameType::kWindow)) {
    return "unknown frame type " + std::to_string(type);
  }
  return "metadata length " + std::to_string(Get<uint32_t>(m.data() + 28)) + " exceeds the frame";
}

size_t MetadataEncodedSize(const Metadata& md) {
  size_t n = 0;
  for (const auto& [k, v] : md) n += 6 + k.size() + v.size();
  return n;
}

void EncodeMetadata(const Metadata& md, std::byte* dst) {
  for (const auto& [k, v] : md) {
    Put<uint16_t>(dst, static_cast<uint16_t>(k.size()));
    Put<uint32_t>(dst + 2, static_cast<uint32_t>(v.size()));
    std::memcpy(dst + 6, k.data(), k.size());
    std::memcpy(dst + 6 + k.size(), v.data(), v.size());
    dst += 6 + k.size() + v.size();
  }
}

std::string MetadataOverLimit(const Metadata& md) {
  if (md.size() > kMaxMetadataEntries) {
    return "call metadata of " + std::to_string(md.size()) + " entries exceeds the limit of " +
           std::to_string(kMaxMetadataEntries);
  }
  const size_t bytes = MetadataEncodedSize(md);
  if (bytes <= kMaxMetadataBytes) return "";
  return "call metadata of " + std::to_string(bytes) + " bytes encoded exceeds the limit of " +
         std::to_string(kMaxMetadataBytes);
}

size_t CountMetadataEntries(std::span<const std::byte> raw) {
  size_t n = 0, at = 0;
  while (raw.size() - at >= 6 && n <= kMaxMetadataEntries) {
    const size_t len = size_t{Get<uint16_t>(raw.data() + at)} + Get<uint32_t>(raw.data() + at + 2);
    if (len > raw.size() - at - 6) break;
    at += 6 + len;
    ++n;
  }
  return n;
}

std::string DecodeMetadata(std::span<const std::byte> raw, Metadata* out, size_t entries) {
  out->clear();
  out->reserve(entries);
  size_t at = 0;
  while (at < raw.size()) {
    if (raw.size() - at < 6) return "truncated metadata entry";
    const size_t klen = Get<uint16_t>(raw.data() + at);
    const size_t vlen = Get<uint32_t>(raw.data() + at + 2);
    at += 6;
    if (klen > raw.size() - at || vlen > raw.size() - at - klen) {
      return "metadata entry runs past the end";
    }
    const char* p = reinterpret_cast<const char*>(raw.data() + at);
    out->emplace_back(std::string(p, klen), std::string(p + klen, vlen));
    at += klen + vlen;
  }
  return "";
}

void EncodeWindow(uint64_t bytes, std::byte* dst) { Put<uint64_t>(dst, bytes); }

std::string DecodeWindow(std::span<const std::byte> payload, uint64_t* bytes) {
  if (payload.size() != kWindowBytes) {
    return "WINDOW payload of " + std::to_string(payload.size()) + " bytes, need " +
           std::to_string(kWindowBytes);
  }
  *bytes = Get<uint64_t>(payload.data());
  return "";
}

void EncodeSettings(const Settings& s, std::byte* dst) {
  Put<uint32_t>(dst, s.max_concurrent_calls);
  Put<uint32_t>(dst + 4, s.max_message_bytes);
  Put<uint32_t>(dst + 8, s.features);
}

std::string DecodeSettings(std::span<const std::byte> payload, Settings* out) {
  if (payload.size() < kMinSettingsBytes) {
    return "SETTINGS payload of " + std::to_string(payload.size()) + " bytes, need " +
           std::to_string(kMinSettingsBytes);
  }
  out->max_concurrent_calls = Get<uint32_t>(payload.data());
  out->max_message_bytes = Get<uint32_t>(payload.data() + 4);
  out->features = payload.size() >= 12 ? Get<uint32_t>(payload.data() + 8) : 0;
  return "";
}

}  // namespace rdmarpc

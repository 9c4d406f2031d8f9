// Internal: writes one RPC frame (header, metadata, payload) straight into transport memory.
#pragma once

#include <google/protobuf/message_lite.h>

#include <cstring>
#include <string_view>

#include "rpc/internal/frame.h"
#include "transport/transport.h"

namespace rdmarpc::internal {

class FrameWriter final : public transport::MessageWriter {
 public:
  // Payload is a protobuf message (serialized in place) ...
  FrameWriter(const FrameHeader& h, const Metadata* md, const google::protobuf::MessageLite* msg)
      : header_(h), metadata_(md), message_(msg) {
    header_.metadata_bytes = md ? static_cast<uint32_t>(MetadataEncodedSize(*md)) : 0;
    payload_bytes_ = msg ? msg->ByteSizeLong() : 0;
  }
  // ... or raw bytes (an error message).
  FrameWriter(const FrameHeader& h, std::string_view raw) : header_(h), raw_(raw) {
    header_.metadata_bytes = 0;
    payload_bytes_ = raw.size();
  }

  size_t size() const override {
    return kFrameHeaderBytes + header_.metadata_bytes + payload_bytes_;
  }

  void WriteTo(std::byte* dst) const override {
    EncodeFrameHeader(header_, dst);
    dst += kFrameHeaderBytes;
    if (header_.metadata_bytes) {
      EncodeMetadata(*metadata_, dst);
      dst += header_.metadata_bytes;
    }
    if (message_) {
      message_->SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(dst));
    } else if (!raw_.empty()) {
      std::memcpy(dst, raw_.data(), raw_.size());
    }
  }

 private:
  FrameHeader header_;
  const Metadata* metadata_ = nullptr;
  const google::protobuf::MessageLite* message_ = nullptr;
  std::string_view raw_;
  size_t payload_bytes_ = 0;
};

// Sends a keepalive PING (both ends of a connection may).
inline void SendPing(transport::Connection& conn, uint64_t id) {
  FrameHeader ping;
  ping.type = FrameType::kPing;
  ping.call_id = id;
  conn.Send(FrameWriter(ping, std::string_view()));
}

// Sends a stream's WINDOW: the receiver read `bytes` more frame bytes of call `call_id` (the
// channel for server streams, the server for client streams).
inline void SendWindow(transport::Connection& conn, uint64_t call_id, uint64_t bytes) {
  FrameHeader h;
  h.type = FrameType::kWindow;
  h.call_id = call_id;
  std::byte payload[kWindowBytes];
  EncodeWindow(bytes, payload);
  conn.Send(FrameWriter(h, std::string_view(reinterpret_cast<const char*>(payload), kWindowBytes)));
}

// Answers a PING with a PONG carrying the same call id (both ends of a connection do this).
inline void SendPong(transport::Connection& conn, uint64_t call_id) {
  FrameHeader pong;
  pong.type = FrameType::kPong;
  pong.call_id = call_id;
  conn.Send(FrameWriter(pong, std::string_view()));
}

}  // namespace rdmarpc::internal

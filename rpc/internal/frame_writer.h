// Internal: writes one RPC frame (header, metadata, payload) straight into transport memory.
#pragma once

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream.h>
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

  // For large messages over TCP: the header and metadata are copied, the message serialized by
  // protobuf with aliasing on, so that its bytes and string fields of a few KiB and more are
  // borrowed where they lie (see PieceStream). Not for raw payloads (small), nor with more
  // metadata than fits the stack buffer below (rare; WriteTo then does it all).
  bool WritePieces(transport::PieceSink& sink) const override {
    if (!message_) return false;
    std::byte head[kFrameHeaderBytes + kInlineMetadataBytes];
    if (header_.metadata_bytes > kInlineMetadataBytes) return false;
    sink.Copy(std::span<const std::byte>(head, WriteHead(head)));
    PieceStream pieces(sink);
    {
      google::protobuf::io::CodedOutputStream out(&pieces);
      out.EnableAliasing(true);
      message_->SerializeWithCachedSizes(&out);
    }  // (its destructor hands back what it did not use of the last chunk)
    pieces.Finish();
    return true;
  }

  void WriteTo(std::byte* dst) const override {
    dst += WriteHead(dst);
    if (message_) {
      message_->SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(dst));
    } else if (!raw_.empty()) {
      std::memcpy(dst, raw_.data(), raw_.size());
    }
  }

 private:
  static constexpr size_t kInlineMetadataBytes = 1024;

  // Writes the frame header and the metadata to dst; returns how many bytes that was.
  size_t WriteHead(std::byte* dst) const {
    EncodeFrameHeader(header_, dst);
    if (header_.metadata_bytes) EncodeMetadata(*metadata_, dst + kFrameHeaderBytes);
    return kFrameHeaderBytes + header_.metadata_bytes;
  }

  // protobuf's output stream over a PieceSink. It serializes into one chunk on the stack and
  // hands each filled chunk to Copy; with aliasing enabled, protobuf passes a bytes or string
  // field that does not fit the room left in the current chunk to WriteAliasedRaw instead,
  // which borrows it (so fields of about kChunk bytes and more are never copied here).
  class PieceStream final : public google::protobuf::io::ZeroCopyOutputStream {
   public:
    explicit PieceStream(transport::PieceSink& sink) : sink_(sink) {}
    bool Next(void** data, int* size) override {
      Finish();
      *data = chunk_;
      *size = kChunk;
      given_ = true;
      count_ += kChunk;
      return true;
    }
    void BackUp(int count) override {
      // protobuf trims (BackUp) again after an aliased write, with nothing given out: count 0.
      if (!given_) return;
      sink_.Copy(std::span<const std::byte>(chunk_, kChunk - count));
      given_ = false;
      count_ -= count;
    }
    int64_t ByteCount() const override { return count_; }
    bool AllowsAliasing() const override { return true; }
    bool WriteAliasedRaw(const void* data, int size) override {
      Finish();  // (protobuf trims the chunk before aliasing: normally nothing to hand over)
      sink_.Borrow(std::span<const std::byte>(static_cast<const std::byte*>(data), size));
      count_ += size;
      return true;
    }
    // Hands over a chunk that was given out and filled to the end (no BackUp came).
    void Finish() {
      if (given_) sink_.Copy(std::span<const std::byte>(chunk_, kChunk));
      given_ = false;
    }

   private:
    static constexpr int kChunk = 4096;
    transport::PieceSink& sink_;
    std::byte chunk_[kChunk];
    bool given_ = false;
    int64_t count_ = 0;
  };

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

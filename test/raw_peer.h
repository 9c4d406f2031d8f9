// A peer that speaks the transport (handshake included) but not the RPC protocol, for tests
// that must send what our Channel never would. Shared by reliability_test and hostile_test.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/this_coro.hpp>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rpc/internal/frame.h"
#include "rpc/service.h"
#include "test/protos/test_service.pb.h"
#include "transport/factory.h"
#include "transport/transport.h"

namespace rdmarpc::testing {

// A peer that speaks the transport (handshake included) but not the RPC protocol: it sends
// whatever bytes a test gives it and records what comes back. Lives on the test's io_context.
struct RawPeer final : transport::ConnectionHandler {
  std::vector<std::string> received;
  bool closed = false;
  std::string close_reason;
  void OnMessage(std::span<const std::byte> m) override {
    received.emplace_back(reinterpret_cast<const char*>(m.data()), m.size());
  }
  void OnClose(const transport::Error& e) override {
    closed = true;
    close_reason = e.message;
  }
  // The decoded frames of the given type received so far.
  std::vector<FrameHeader> Frames(FrameType type) const {
    std::vector<FrameHeader> out;
    for (const auto& m : received) {
      DecodedFrame f;
      if (DecodeFrame(std::as_bytes(std::span(m.data(), m.size())), &f).empty() &&
          f.header.type == type) {
        out.push_back(f.header);
      }
    }
    return out;
  }
};

struct Bytes final : transport::MessageWriter {
  explicit Bytes(std::string b) : bytes(std::move(b)) {}
  size_t size() const override { return bytes.size(); }
  void WriteTo(std::byte* dst) const override {
    if (!bytes.empty()) std::memcpy(dst, bytes.data(), bytes.size());
  }
  std::string bytes;
};

inline std::string Frame(const FrameHeader& h, const std::string& payload) {
  std::string out(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(h, reinterpret_cast<std::byte*>(out.data()));
  return out + payload;
}

// The same with metadata `md` before the payload (its length set in the header).
inline std::string Frame(FrameHeader h, const Metadata& md, const std::string& payload) {
  h.metadata_bytes = static_cast<uint32_t>(MetadataEncodedSize(md));
  std::string encoded(h.metadata_bytes, '\0');
  EncodeMetadata(md, reinterpret_cast<std::byte*>(encoded.data()));
  return Frame(h, encoded + payload);
}

// Grants stream `call_id` 2^42 bytes of credit on `conn` (four WINDOW frames of 2^40, the most
// one frame counts for): more than any peer could ever write, from one that means to read none
// of it, or all of it as fast as it comes.
inline void GrantUnboundedCredit(transport::Connection& conn, uint64_t call_id) {
  FrameHeader w;
  w.type = FrameType::kWindow;
  w.call_id = call_id;
  std::string credit(kWindowBytes, '\0');
  EncodeWindow(uint64_t{1} << 40, reinterpret_cast<std::byte*>(credit.data()));
  for (int i = 0; i < 4; ++i) conn.Send(Bytes(Frame(w, credit)));
}

inline std::string SleepRequestFrame(uint64_t call_id, uint32_t ms, const Metadata& md = {}) {
  FrameHeader h;
  h.type = FrameType::kRequest;
  h.method_id = MethodId("/rdmarpc.testing.TestService/Sleep");
  h.call_id = call_id;
  SleepRequest req;
  req.set_ms(ms);
  return Frame(h, md, req.SerializeAsString());
}

inline boost::asio::awaitable<
    std::pair<std::shared_ptr<transport::Connection>, std::shared_ptr<RawPeer>>>
RawConnect(const std::string& uri) {
  auto ex = co_await boost::asio::this_coro::executor;
  const transport::Options options;  // named: GCC 12 mishandles class temporaries in co_await
  auto conn = co_await transport::Connect(uri, ex, options);
  if (!conn.ok()) throw std::runtime_error("raw connect: " + conn.error().message);
  auto peer = std::make_shared<RawPeer>();
  conn.value()->Start(peer);
  co_return std::make_pair(conn.value(), peer);
}

// The decoded frames (header and payload) of the given type that `peer` received.
inline std::vector<std::pair<FrameHeader, std::string>> FramesWithPayload(const RawPeer& peer,
                                                                          FrameType type) {
  std::vector<std::pair<FrameHeader, std::string>> out;
  for (const auto& m : peer.received) {
    DecodedFrame f;
    if (DecodeFrame(std::as_bytes(std::span(m.data(), m.size())), &f).empty() &&
        f.header.type == type) {
      out.emplace_back(
          f.header, std::string(reinterpret_cast<const char*>(f.payload.data()), f.payload.size()));
    }
  }
  return out;
}

}  // namespace rdmarpc::testing

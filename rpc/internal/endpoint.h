// Internal: what both ends of an RPC connection do alike -- ChannelCore on the client,
// ServerConnection on the server. Each owns its transport connection, watches the peer with
// keepalive PINGs, and takes every message apart the same way before its role sees it: the peer
// is alive (the keepalive hears it), the frame decodes (if not, the role decides what that
// costs: the client drops the connection, the server lets the calls already running finish).
// CRTP, not virtual: OnMessage is on every call's path. Use only on the connection's executor.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "rpc/internal/frame.h"
#include "rpc/internal/frame_writer.h"
#include "rpc/internal/keepalive.h"
#include "transport/transport.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace rdmarpc::internal {

// Role implements OnFrame(const DecodedFrame&, size_t message_bytes) and
// OnMalformedFrame(const std::string& why), reachable from this class.
template <class Role>
class FrameEndpoint : public transport::ConnectionHandler {
 public:
  void OnMessage(std::span<const std::byte> message) final {
#if defined(__SANITIZE_ADDRESS__)
    // ParsePayload reads into the bytes the transport promises after each message
    // (kMessageSlopBytes); AddressSanitizer builds check the promise on every message.
    if (__asan_region_is_poisoned(const_cast<std::byte*>(message.data() + message.size()),
                                  transport::kMessageSlopBytes)) {
      std::fprintf(stderr,
                   "transport broke its promise: fewer than %zu readable bytes after a "
                   "message of %zu bytes\n",
                   transport::kMessageSlopBytes, message.size());
      std::abort();
    }
#endif
    keepalive_.Heard();
    DecodedFrame f;
    if (!ParseFrame(message, &f)) {
      static_cast<Role*>(this)->OnMalformedFrame(DecodeFrame(message, &f));
      return;
    }
    static_cast<Role*>(this)->OnFrame(f, message.size());
  }

 protected:
  FrameEndpoint(const transport::Executor& ex, std::shared_ptr<transport::Connection> conn)
      : conn_(std::move(conn)), keepalive_(ex) {}
  ~FrameEndpoint() override = default;

  // Watches the peer (nothing when `interval` is zero): a PING once it has been quiet for
  // `interval`; `on_dead(role, why)` once, when nothing at all came for `timeout` after one.
  // `self` points at the role itself; nothing happens once it is gone.
  void WatchPeer(std::weak_ptr<Role> self, std::chrono::milliseconds interval,
                 std::chrono::milliseconds timeout,
                 std::function<void(Role&, std::string)> on_dead) {
    keepalive_.Start(
        self, interval, timeout,
        [self] {
          auto role = self.lock();
          if (!role) return;
          FrameEndpoint& me = *role;
          if (me.conn_) SendPing(*me.conn_, ++me.pings_);
        },
        [self, on_dead = std::move(on_dead)](std::string why) {
          if (auto role = self.lock()) on_dead(*role, std::move(why));
        });
  }

  // The peer's PING: answered at once (both ends may send them).
  void AnswerPing(const DecodedFrame& f) {
    if (conn_) SendPong(*conn_, f.header.call_id);
  }

  std::shared_ptr<transport::Connection> conn_;  // null once closed (or not yet connected)
  Keepalive keepalive_;

 private:
  uint64_t pings_ = 0;  // PINGs sent, numbered
};

}  // namespace rdmarpc::internal

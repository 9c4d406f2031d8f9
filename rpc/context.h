// Per-call options (client side) and the per-call context a handler sees (server side).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "rpc/metadata.h"

namespace rdmarpc {

class ServerContext;
namespace internal {
struct ContextAccess;  // the runtime's side: cancellation, byte counts (rpc/internal/dispatch.h)
}

// Options for one call. Copyable value; `{}` means no deadline and no metadata. (A new field
// must also be copied where the channel copies options for its interceptors, in channel.cc.)
struct CallOptions {
  // Time allowed for the whole call; zero or negative means no deadline. When it passes, the
  // call fails with DEADLINE_EXCEEDED and the server is told to stop working on it.
  std::chrono::nanoseconds timeout{0};
  // An absolute deadline (steady clock); max() = none. When both this and `timeout` are set, the
  // earlier one applies. Set by Inherit() for calls made from inside a handler.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Key/value pairs delivered to the handler's ServerContext.
  Metadata metadata;
  // When the channel is not connected (reconnecting after a lost connection, or the server sent
  // GOAWAY), false fails the call at once with UNAVAILABLE; true waits, within the deadline, for
  // the channel to be ready again.
  bool wait_for_ready = false;

  // For a call made while handling another: takes over the caller's deadline, so that the
  // nested call gives up no later than the call it serves (a shorter own timeout still applies).
  // Cancellation needs nothing: cancelling the handler cancels what it awaits, nested calls too.
  CallOptions& Inherit(const ServerContext& parent);
};

// What a handler knows about the call it serves. Owned by the runtime; valid for the whole
// handler coroutine. Use only from the handler's own thread.
class ServerContext {
 public:
  using Clock = std::chrono::steady_clock;

  ServerContext() = default;
  // `peer` is shared with the connection: one string per connection, not a copy per call.
  ServerContext(std::shared_ptr<const std::string> peer, std::string_view method,
                Clock::time_point deadline, Metadata metadata)
      : peer_(std::move(peer)),
        method_(method),
        deadline_(deadline),
        metadata_(std::move(metadata)) {}
  ServerContext(std::string peer, std::string_view method, Clock::time_point deadline,
                Metadata metadata)
      : ServerContext(std::make_shared<const std::string>(std::move(peer)), method, deadline,
                      std::move(metadata)) {}

  // The caller's address, e.g. "tcp://127.0.0.1:50123".
  const std::string& peer() const { return peer_ ? *peer_ : kEmptyPeer; }
  // The full method name, e.g. "/demo.Echo/Say".
  std::string_view method() const { return method_; }
  bool has_deadline() const { return deadline_ != Clock::time_point::max(); }
  // Clock::time_point::max() when the caller set no deadline.
  Clock::time_point deadline() const { return deadline_; }
  // Budget left; nanoseconds::max() without a deadline, zero or negative once it has passed.
  std::chrono::nanoseconds remaining() const {
    if (!has_deadline()) return std::chrono::nanoseconds::max();
    return deadline_ - Clock::now();
  }
  const Metadata& metadata() const { return metadata_; }
  // True once the caller cancelled the call (explicitly, or because its deadline passed). The
  // runtime also cancels what the handler is awaiting; no reply is delivered after this. As Asio
  // does for any cancelled coroutine, a later co_await in the handler on an Asio operation or
  // another awaitable throws boost::system::system_error (operation_aborted) rather than start
  // (harmless: nothing the handler returns is delivered any more); the stream handles' Read and
  // Write return false instead.
  bool cancelled() const { return cancelled_; }
  // For server interceptors (rpc/interceptor.h): metadata the handler will see as if the caller
  // had sent it, e.g. the identity an authentication interceptor established.
  void AddMetadata(std::string key, std::string value) {
    metadata_.emplace_back(std::move(key), std::move(value));
  }
  // Serialized message bytes of this call so far, for interceptors (metrics): received = the
  // request, or the client-stream messages the handler has read; sent = the stream messages
  // written and, when OnFinish runs, the reply about to go out.
  uint64_t bytes_received() const { return bytes_received_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  // The first value for `key`, or nullptr.
  const std::string* FindMetadata(std::string_view key) const {
    for (const auto& [k, v] : metadata_) {
      if (k == key) return &v;
    }
    return nullptr;
  }

 private:
  friend struct internal::ContextAccess;
  // As Status's empty message: constant-initialized, so peer() has no guard check to pass.
  static inline const std::string kEmptyPeer{};

  std::shared_ptr<const std::string> peer_;
  std::string_view method_;  // points at the generated method table (static storage)
  Clock::time_point deadline_ = Clock::time_point::max();
  Metadata metadata_;
  uint64_t bytes_received_ = 0, bytes_sent_ = 0;
  bool cancelled_ = false;
};

inline CallOptions& CallOptions::Inherit(const ServerContext& parent) {
  if (parent.has_deadline() && parent.deadline() < deadline) deadline = parent.deadline();
  return *this;
}

}  // namespace rdmarpc

// Server streams on the client side: what a generated stub returns for a server-streaming method
// (`rpc Watch(Req) returns (stream Ev)`).
//
//   auto call = co_await stub.Watch(req, options);
//   while (auto ev = co_await call.Read()) { ... }
//   Status s = co_await call.Finish();
//
// Messages arrive in order, each exactly once, or the stream ends with a Status saying why.
// Flow control: the server sends at most kStreamWindowBytes ahead of what Read has taken, so a
// reader that stops reading holds back the server instead of buffering without bound. The
// call's deadline (CallOptions) covers the whole stream; cancelling a Read (Asio per-operation
// cancellation), Cancel() or dropping the reader ends the stream and tells the server at once.
// A stream is not resumed across a reconnect: a lost connection ends it with UNAVAILABLE.
//
// Threading: a reader is used by one coroutine at a time (Read and Finish are not concurrent);
// from any executor (calls hop to the channel's). BlockingReader is for ordinary code, not on the
// channel's own thread.
#pragma once

#include <google/protobuf/message_lite.h>

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <optional>
#include <utility>

#include "rpc/channel.h"
#include "rpc/status.h"

namespace rdmarpc {

template <class Resp>
class ClientReader {
 public:
  ClientReader() = default;  // an empty reader: Read ends at once, Finish fails
  explicit ClientReader(internal::StreamRef ref) : ref_(std::move(ref)) {
    if (!ref_.core) finished_ = ref_.error;
  }
  ClientReader(ClientReader&& other) noexcept
      : ref_(std::move(other.ref_)), finished_(std::move(other.finished_)) {
    other.ref_.core.reset();
  }
  ClientReader& operator=(ClientReader&&) = delete;
  ClientReader(const ClientReader&) = delete;
  ~ClientReader() {
    if (ref_.core) internal::ReleaseStream(ref_);  // cancels a stream still running
  }

  // The next message, or nullopt once the stream is over (then Finish says how it ended).
  boost::asio::awaitable<std::optional<Resp>> Read() {
    if (!ref_.core) co_return std::nullopt;
    Resp message;
    if (co_await internal::ReadStream(ref_, message))
      co_return std::optional<Resp>(std::move(message));
    co_return std::nullopt;
  }

  // How the stream ended: OK, the server handler's error, or the transport's (UNAVAILABLE),
  // DEADLINE_EXCEEDED, CANCELLED. Waits for the end of the stream, dropping unread messages.
  boost::asio::awaitable<Status> Finish() {
    if (!ref_.core) {
      co_return finished_ ? *finished_
                          : Status(StatusCode::kFailedPrecondition, "empty stream reader");
    }
    Status s = co_await internal::FinishStream(ref_);
    ref_.core.reset();
    finished_ = s;
    co_return s;
  }

  // Ends the stream now (the server is told); Finish then returns CANCELLED. Thread-safe.
  void Cancel() {
    if (ref_.core) internal::CancelStream(ref_);
  }

 private:
  internal::StreamRef ref_;
  std::optional<Status> finished_;
};

// The same for ordinary (non-coroutine) code.
template <class Resp>
class BlockingReader {
 public:
  BlockingReader(std::shared_ptr<Channel> channel, ClientReader<Resp> reader)
      : channel_(std::move(channel)), reader_(std::move(reader)) {}
  std::optional<Resp> Read() { return channel_->Run(reader_.Read()); }
  Status Finish() { return channel_->Run(reader_.Finish()); }
  void Cancel() { reader_.Cancel(); }

 private:
  std::shared_ptr<Channel> channel_;
  ClientReader<Resp> reader_;  // after channel_: released before it
};

}  // namespace rdmarpc

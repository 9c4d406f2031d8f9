// Streams on the client side: what generated stubs return for streaming methods.
//
//   // rpc Watch(Req) returns (stream Ev): a ClientReader
//   auto call = co_await stub.Watch(req, options);
//   while (auto ev = co_await call.Read()) { ... }
//   Status s = co_await call.Finish();
//
//   // rpc Upload(stream Chunk) returns (Summary): a ClientWriter
//   auto call = co_await stub.Upload(options);
//   for (...) if (!co_await call.Write(chunk)) break;  // false: the call is over; Finish says why
//   Result<Summary> summary = co_await call.Finish();  // half-closes, then waits for the reply
//
//   // rpc Chat(stream Msg) returns (stream Msg): a ClientReaderWriter
//   auto call = co_await stub.Chat(options);
//   co_await call.Write(msg);  ...  co_await call.WritesDone();
//   while (auto m = co_await call.Read()) { ... }
//   Status s = co_await call.Finish();
//
// Messages arrive in order, each exactly once, or the call ends with a Status saying why. Flow
// control, each way: a sender is at most kStreamWindowBytes ahead of what the other side's Read
// has taken, so a reader that stops holds the sender back (its Write waits) instead of either
// side buffering without bound. The call's deadline (CallOptions) covers the whole stream;
// cancelling a Read or Write (Asio per-operation cancellation), Cancel() or dropping the handle
// ends the call and tells the server at once. A stream is not resumed across a reconnect: a lost
// connection ends it with UNAVAILABLE.
//
// Threading: a handle is used by one coroutine at a time for reading and one for writing (a
// Read and a Write may wait at once; two Reads may not); from any executor (calls hop to the
// channel's). The Blocking* variants are for ordinary code, not on the channel's own thread.
#pragma once

#include <google/protobuf/message_lite.h>

#include <boost/asio/awaitable.hpp>
#include <memory>
#include <optional>
#include <utility>

#include "rpc/channel.h"
#include "rpc/status.h"

namespace rdmarpc {

namespace internal {
// What every client stream handle holds: the stream's place in its channel, or why it did not
// start, and how it ended once Finish has said so.
class ClientStreamBase {
 public:
  ClientStreamBase() = default;  // an empty handle: Read and Write end at once, Finish fails
  explicit ClientStreamBase(StreamRef ref) : ref_(std::move(ref)) {
    if (!ref_.core) finished_ = ref_.error;
  }
  ClientStreamBase(ClientStreamBase&& other) noexcept
      : ref_(std::move(other.ref_)), finished_(std::move(other.finished_)) {
    other.ref_.core.reset();
  }
  ClientStreamBase& operator=(ClientStreamBase&&) = delete;
  ClientStreamBase(const ClientStreamBase&) = delete;
  ~ClientStreamBase() {
    if (ref_.core) ReleaseStream(ref_);  // cancels a stream still running
  }

  // Ends the call now (the server is told); Finish then returns CANCELLED, a Read or Write
  // waiting elsewhere returns at once, and messages received but not yet read are dropped (the
  // next Read ends). After the server's end it changes nothing. Thread-safe.
  void Cancel() {
    if (ref_.core) CancelStream(ref_);
  }

 protected:
  // One coroutine frame per Read when a message is already there, and per Write when the window
  // has room: the synchronous first try (TryReadStream, TryWriteStream) does it; only one that
  // must wait, or hop to the channel's thread, goes through the channel's own coroutine.
  boost::asio::awaitable<bool> ReadMessage(google::protobuf::MessageLite& out) {
    if (!ref_.core) co_return false;
    const StreamTry got = TryReadStream(ref_, out);
    if (got != StreamTry::kWait) co_return got == StreamTry::kDone;
    co_return co_await ReadStream(ref_, out);
  }
  template <class Resp>
  boost::asio::awaitable<std::optional<Resp>> ReadAs() {
    std::optional<Resp> message;
    if (!ref_.core) co_return message;
    message.emplace();
    StreamTry got = TryReadStream(ref_, *message);
    if (got == StreamTry::kWait) {
      got = co_await ReadStream(ref_, *message) ? StreamTry::kDone : StreamTry::kOver;
    }
    if (got != StreamTry::kDone) message.reset();
    co_return std::move(message);
  }
  boost::asio::awaitable<bool> WriteMessage(const google::protobuf::MessageLite& message) {
    if (!ref_.core) co_return false;
    const StreamTry sent = TryWriteStream(ref_, message);
    if (sent != StreamTry::kWait) co_return sent == StreamTry::kDone;
    co_return co_await WriteStream(ref_, message);
  }
  boost::asio::awaitable<bool> HalfClose() {
    if (!ref_.core) co_return false;
    co_return co_await HalfCloseStream(ref_);
  }
  boost::asio::awaitable<Status> FinishWith(google::protobuf::MessageLite* reply) {
    if (!ref_.core) {
      co_return finished_ ? *finished_
                          : Status(StatusCode::kFailedPrecondition, "empty stream handle");
    }
    Status s = co_await FinishStream(ref_, reply);
    ref_.core.reset();
    finished_ = s;
    co_return s;
  }

 private:
  StreamRef ref_;
  std::optional<Status> finished_;
};
}  // namespace internal

// The client's end of a server stream.
template <class Resp>
class ClientReader : public internal::ClientStreamBase {
 public:
  using ClientStreamBase::ClientStreamBase;
  ClientReader() = default;
  ClientReader(ClientReader&&) noexcept = default;

  // The next message, or nullopt once the stream is over (then Finish says how it ended).
  boost::asio::awaitable<std::optional<Resp>> Read() { return ReadAs<Resp>(); }
  // The same into `out`, which a loop can reuse: its fields keep their memory from message to
  // message (a new Resp per message allocates its strings anew). True for a message, false
  // where Read() returns nullopt (then `out` is unspecified). `out` must outlive the co_await.
  boost::asio::awaitable<bool> Read(Resp& out) { return ReadMessage(out); }

  // How the stream ended: OK, the server handler's error, or the transport's (UNAVAILABLE),
  // DEADLINE_EXCEEDED, CANCELLED. Waits for the end of the stream, dropping unread messages.
  boost::asio::awaitable<Status> Finish() { return FinishWith(nullptr); }
};

// The client's end of a client stream: any number of Writes, then Finish for the one reply.
template <class Req, class Resp>
class ClientWriter : public internal::ClientStreamBase {
 public:
  using ClientStreamBase::ClientStreamBase;
  ClientWriter() = default;
  ClientWriter(ClientWriter&&) noexcept = default;

  // Sends `message` after those written before it, once the server's window has room (waits
  // while it has none). `message` must outlive the co_await. False when the call is over (the
  // server answered already, the call was cancelled or its deadline passed, the connection is
  // gone, `message` is over the message limit): stop writing; Finish says why.
  boost::asio::awaitable<bool> Write(const Req& message) { return WriteMessage(message); }

  // Tells the server no more messages come (its Read ends after the last). Finish does this
  // itself; false when the call is over or this was done already.
  boost::asio::awaitable<bool> WritesDone() { return HalfClose(); }

  // Half-closes if not yet done and waits for the server's reply: `reply` is filled when the
  // Status is OK.
  boost::asio::awaitable<Status> Finish(Resp& reply) { return FinishWith(&reply); }
  boost::asio::awaitable<Result<Resp>> Finish() {
    Resp reply;
    Status s = co_await FinishWith(&reply);
    if (!s.ok()) co_return s;
    co_return std::move(reply);
  }
};

// The client's end of a bidirectional stream: Read and Write are independent (each direction
// has its own order and window); one of each may wait at once.
template <class Req, class Resp>
class ClientReaderWriter : public internal::ClientStreamBase {
 public:
  using ClientStreamBase::ClientStreamBase;
  ClientReaderWriter() = default;
  ClientReaderWriter(ClientReaderWriter&&) noexcept = default;

  // As ClientReader::Read (both forms).
  boost::asio::awaitable<std::optional<Resp>> Read() { return ReadAs<Resp>(); }
  boost::asio::awaitable<bool> Read(Resp& out) { return ReadMessage(out); }
  // As ClientWriter::Write.
  boost::asio::awaitable<bool> Write(const Req& message) { return WriteMessage(message); }
  // Half-close: the server's Read ends; the server may go on writing.
  boost::asio::awaitable<bool> WritesDone() { return HalfClose(); }
  // Half-closes if not yet done, waits for the server's end (dropping unread messages) and
  // returns its Status.
  boost::asio::awaitable<Status> Finish() { return FinishWith(nullptr); }
};

// A stream of any kind with messages handled as MessageLite, for code that builds its message
// types at run time (protobuf's DynamicMessage, e.g. the `rdmarpc call` tool); generated stubs
// give the typed handles above. Open it with Channel::OpenStream; Read, Write, WritesDone and
// Finish behave as in the typed handles (`reply`: a client-streaming call's reply, else null).
class GenericClientStream : public internal::ClientStreamBase {
 public:
  using ClientStreamBase::ClientStreamBase;
  GenericClientStream() = default;
  GenericClientStream(GenericClientStream&&) noexcept = default;
  boost::asio::awaitable<bool> Read(google::protobuf::MessageLite& out) { return ReadMessage(out); }
  boost::asio::awaitable<bool> Write(const google::protobuf::MessageLite& message) {
    return WriteMessage(message);
  }
  boost::asio::awaitable<bool> WritesDone() { return HalfClose(); }
  boost::asio::awaitable<Status> Finish(google::protobuf::MessageLite* reply) {
    return FinishWith(reply);
  }
};

// The same for ordinary (non-coroutine) code. Each holds the channel, whose loop runs the calls.
template <class Resp>
class BlockingReader {
 public:
  BlockingReader(std::shared_ptr<Channel> channel, ClientReader<Resp> reader)
      : channel_(std::move(channel)), reader_(std::move(reader)) {}
  std::optional<Resp> Read() { return channel_->Run(reader_.Read()); }
  bool Read(Resp& out) { return channel_->Run(reader_.Read(out)); }
  Status Finish() { return channel_->Run(reader_.Finish()); }
  void Cancel() { reader_.Cancel(); }

 private:
  std::shared_ptr<Channel> channel_;
  ClientReader<Resp> reader_;  // after channel_: released before it
};

template <class Req, class Resp>
class BlockingWriter {
 public:
  BlockingWriter(std::shared_ptr<Channel> channel, ClientWriter<Req, Resp> writer)
      : channel_(std::move(channel)), writer_(std::move(writer)) {}
  bool Write(const Req& message) { return channel_->Run(writer_.Write(message)); }
  bool WritesDone() { return channel_->Run(writer_.WritesDone()); }
  Result<Resp> Finish() { return channel_->Run(writer_.Finish()); }
  void Cancel() { writer_.Cancel(); }

 private:
  std::shared_ptr<Channel> channel_;
  ClientWriter<Req, Resp> writer_;
};

// Read and Write may be called from two threads at once (one reader, one writer).
template <class Req, class Resp>
class BlockingReaderWriter {
 public:
  BlockingReaderWriter(std::shared_ptr<Channel> channel, ClientReaderWriter<Req, Resp> stream)
      : channel_(std::move(channel)), stream_(std::move(stream)) {}
  std::optional<Resp> Read() { return channel_->Run(stream_.Read()); }
  bool Read(Resp& out) { return channel_->Run(stream_.Read(out)); }
  bool Write(const Req& message) { return channel_->Run(stream_.Write(message)); }
  bool WritesDone() { return channel_->Run(stream_.WritesDone()); }
  Status Finish() { return channel_->Run(stream_.Finish()); }
  void Cancel() { stream_.Cancel(); }

 private:
  std::shared_ptr<Channel> channel_;
  ClientReaderWriter<Req, Resp> stream_;
};

}  // namespace rdmarpc

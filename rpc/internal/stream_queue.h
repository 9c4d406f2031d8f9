// Internal: the messages of one stream direction that arrived and were not read yet.
//
// Why not a deque of strings as they came: each message then cost an allocation (its string)
// and a free when read, and its parse copied the last 16 bytes (protobuf's flat-array parser
// reads ahead; see parse.h). Here each message is kept with transport::kMessageSlopBytes of
// padding after it, so that it parses in place (ParsePayload), and the buffers of messages read
// go to a pool of the thread's for the next messages that arrive on it, so that a reader keeping
// up with its streams costs no allocation per message. (Senders write ahead in bursts of up to
// the window, so one spare buffer per stream would serve only the first message of each burst.)
//
// Memory: a stream's queue holds what its flow-control window lets the peer send
// (kStreamWindowBytes of frames) and the padding. The pool is per thread, not per stream or
// connection, so that no peer can make it grow: at most kPoolBytes of buffer capacity per thread.
//
// Threading: a queue is used on its connection's thread only.
#pragma once

#include <google/protobuf/message_lite.h>

#include <cstddef>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "rpc/internal/decoded_size.h"
#include "rpc/internal/parse.h"
#include "transport/transport.h"

namespace rdmarpc::internal {

// What the synchronous first try of a stream Read or Write did: took a message (read into the
// caller's) or sent one, found the stream over, or could do neither yet (a Read with nothing
// received, a Write out of window, or a caller off the connection's thread: the coroutine path
// then). A message that is there to read, or window to write into, costs no coroutine frame
// beyond the caller's own.
enum class StreamTry { kDone, kOver, kWait };

class StreamQueue {
 public:
  // Buffers of messages read are kept for reuse, per thread, while their capacities add up to
  // at most this (a window's worth).
  static constexpr size_t kPoolBytes = 256 * 1024;

  bool empty() const { return messages_.empty(); }
  size_t size() const { return messages_.size(); }

  // Queues a copy of `payload`.
  void Push(std::span<const std::byte> payload) {
    std::string m;
    if (!pool_gone) {
      Pool& pool = ThreadPool();
      if (!pool.buffers.empty()) {
        m = std::move(pool.buffers.back());
        pool.buffers.pop_back();
        pool.bytes -= m.capacity();
      }
    }
    m.reserve(payload.size() + transport::kMessageSlopBytes);
    m.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
    m.append(transport::kMessageSlopBytes, '\0');
    messages_.push_back(std::move(m));
  }

  // The payload size of the oldest message. Not empty().
  size_t FrontSize() const { return messages_.front().size() - transport::kMessageSlopBytes; }

  enum class Popped { kParsed, kMalformed, kTooLarge };
  // Parses the oldest message into `out` (as ParseFromArray: cleared first, required fields
  // checked) and drops it: kParsed, or kMalformed when it does not parse. One that would take
  // more than `allowed` bytes parsed beyond its own (DecodedExcess: many small or unknown
  // fields) is not parsed: kTooLarge. Dropped in every case; `*excess` is what it takes parsed
  // beyond its bytes. Not empty().
  Popped PopInto(google::protobuf::MessageLite& out, size_t allowed, size_t* excess) {
    std::string& m = messages_.front();
    const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(m.data()),
                                             m.size() - transport::kMessageSlopBytes);
    *excess = DecodedExcess(out, payload);
    Popped result = Popped::kTooLarge;
    if (*excess <= allowed)
      result = ParsePayload(out, payload) ? Popped::kParsed : Popped::kMalformed;
    if (!pool_gone) {
      Pool& pool = ThreadPool();
      if (pool.bytes + m.capacity() <= kPoolBytes) {
        pool.bytes += m.capacity();
        pool.buffers.push_back(std::move(m));
      }
    }
    messages_.pop_front();
    return result;
  }

  // Drops the oldest message unread. Not empty().
  void Pop() { messages_.pop_front(); }

  void Clear() { messages_.clear(); }

 private:
  struct Pool {
    std::vector<std::string> buffers;
    size_t bytes = 0;  // their capacities added up (<= kPoolBytes)
    ~Pool() { pool_gone = true; }
  };
  static Pool& ThreadPool() {
    static thread_local Pool pool;
    return pool;
  }
  // Set when this thread's pool is destroyed (thread exit): buffers are then freed, not kept.
  // Trivial, so it can still be read then.
  static inline thread_local bool pool_gone = false;

  std::deque<std::string> messages_;
};

}  // namespace rdmarpc::internal

#include "rpc/channel.h"

#include <spdlog/spdlog.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include "rpc/frame_writer.h"

namespace rdmarpc {
namespace asio = boost::asio;

namespace internal {

// The per-connection client state: pending-call slots indexed by call id. Lives on one thread;
// no locks. A call id is (slot generation << 32 | slot index), so a late response for a slot that
// has since been reused is recognised and dropped. Slots are reused, so a steady state of calls
// allocates nothing here.
class ChannelCore final : public transport::ConnectionHandler,
                          public std::enable_shared_from_this<ChannelCore> {
 public:
  ChannelCore(std::string target, std::shared_ptr<transport::Connection> conn)
      : target_(std::move(target)),
        conn_(std::move(conn)),
        executor_(conn_->executor()),
        keepalive_timer_(executor_) {}

  // Starts the keepalive loop (see ChannelOptions). Call once, on the channel's executor.
  void StartKeepalive(std::chrono::milliseconds interval, std::chrono::milliseconds timeout) {
    if (interval.count() <= 0) return;
    keepalive_interval_ = interval;
    keepalive_timeout_ = timeout;
    ScheduleKeepalive(interval);
  }

  const transport::Executor& executor() const { return executor_; }

  asio::awaitable<Status> Call(const MethodInfo& method,
                               const google::protobuf::MessageLite& request,
                               google::protobuf::MessageLite& reply, const CallOptions& options) {
    if (closed_) {
      co_return Status(StatusCode::kUnavailable,
                       "channel to " + target_ + " is closed: " + close_reason_);
    }
    auto self = shared_from_this();  // the connection may close while we wait
    const uint32_t index = AllocSlot();
    Slot& slot = *slots_[index];
    slot.reply = &reply;
    slot.done = false;
    const uint64_t call_id = (static_cast<uint64_t>(slot.generation) << 32) | index;

    FrameHeader h;
    h.type = FrameType::kRequest;
    h.method_id = method.id;
    h.call_id = call_id;
    auto deadline = ServerContext::Clock::time_point::max();
    if (options.timeout.count() > 0) {
      deadline = ServerContext::Clock::now() + options.timeout;
      h.timeout_us = std::max<uint64_t>(
          1, std::chrono::duration_cast<std::chrono::microseconds>(options.timeout).count());
    }
    internal::FrameWriter writer(h, options.metadata.empty() ? nullptr : &options.metadata,
                                 &request);
    if (writer.size() > conn_->max_message_bytes()) {
      FreeSlot(index);
      co_return Status(StatusCode::kResourceExhausted,
                       "request of " + std::to_string(writer.size()) +
                           " bytes exceeds the message limit of " +
                           std::to_string(conn_->max_message_bytes()));
    }
    if (!conn_->Send(writer)) {
      FreeSlot(index);
      co_return Status(StatusCode::kUnavailable, "connection to " + target_ + " is closed");
    }
    slot.timer.expires_at(deadline);
    co_await slot.timer.async_wait(asio::as_tuple(asio::use_awaitable));
    Status status;
    if (slot.done) {
      status = std::move(slot.status);
    } else if ((co_await asio::this_coro::cancellation_state).cancelled() !=
               asio::cancellation_type::none) {
      // The caller cancelled (e.g. through a cancellation slot bound to this call).
      status = Status(StatusCode::kCancelled, "call to " + target_ + " cancelled by the caller");
      SendCancel(call_id);
    } else {
      status = Status(StatusCode::kDeadlineExceeded,
                      "no reply from " + target_ + " within " +
                          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             options.timeout)
                                             .count()) +
                          " ms");
      SendCancel(call_id);
    }
    FreeSlot(index);
    co_return status;
  }

  void OnMessage(std::span<const std::byte> message) override {
    last_heard_ = std::chrono::steady_clock::now();
    DecodedFrame f;
    std::string err = DecodeFrame(message, &f);
    if (!err.empty()) {
      spdlog::warn("channel {}: malformed frame from server: {}; closing", target_, err);
      FailAll("server sent a malformed frame: " + err);
      conn_->Close();
      return;
    }
    switch (f.header.type) {
      case FrameType::kResponse:
        OnResponse(f);
        break;
      case FrameType::kPing:
        internal::SendPong(*conn_, f.header.call_id);
        break;
      default:
        // PONG, GOAWAY and others are not used by this version's client; ignoring them is
        // what the protocol asks of a peer that does not act on a frame type.
        break;
    }
  }

  void OnClose(const transport::Error& reason) override {
    FailAll(reason.message);
    keepalive_timer_.cancel();
    conn_.reset();  // breaks the connection <-> handler cycle
  }

  void Close() {
    if (conn_) conn_->Close();
  }

  // For the Channel's destructor: nobody can be waiting on a call any more. Closes and lets go
  // of the connection now instead of in OnClose, which may never run if the loop stops first;
  // the connection <-> handler reference cycle would otherwise leak both (found by LSan).
  void Shutdown() {
    keepalive_timer_.cancel();
    FailAll("channel destroyed");
    if (conn_) {
      conn_->Close();
      conn_.reset();
    }
  }

 private:
  struct Slot {
    explicit Slot(const transport::Executor& ex) : timer(ex) {}
    asio::steady_timer timer;  // waits for the deadline; cancelled to wake the caller
    google::protobuf::MessageLite* reply = nullptr;
    Status status;
    uint32_t generation = 1;
    bool active = false;
    bool done = false;
  };

  uint32_t AllocSlot() {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.push_back(std::make_unique<Slot>(executor_));
    }
    slots_[index]->active = true;
    return index;
  }

  void FreeSlot(uint32_t index) {
    Slot& s = *slots_[index];
    s.active = false;
    s.reply = nullptr;
    s.status = Status();
    ++s.generation;
    free_.push_back(index);
  }

  void OnResponse(const DecodedFrame& f) {
    const uint32_t index = static_cast<uint32_t>(f.header.call_id);
    const uint32_t gen = static_cast<uint32_t>(f.header.call_id >> 32);
    if (index >= slots_.size()) return;
    Slot& s = *slots_[index];
    if (!s.active || s.done || s.generation != gen) return;  // late reply to a finished call
    const auto code = static_cast<StatusCode>(f.header.status);
    if (code == StatusCode::kOk) {
      if (s.reply->ParseFromArray(f.payload.data(), static_cast<int>(f.payload.size()))) {
        s.status = Status();
      } else {
        s.status = Status(StatusCode::kInternal,
                          "reply does not parse as " + s.reply->GetTypeName());
      }
    } else {
      s.status = Status(code, std::string(reinterpret_cast<const char*>(f.payload.data()),
                                          f.payload.size()));
    }
    s.done = true;
    s.timer.cancel();
  }

  void SendCancel(uint64_t call_id) {
    if (!conn_ || conn_->closed()) return;
    FrameHeader h;
    h.type = FrameType::kCancel;
    h.call_id = call_id;
    conn_->Send(internal::FrameWriter(h, std::string_view()));
  }

  void FailAll(const std::string& why) {
    if (closed_) return;
    closed_ = true;
    close_reason_ = why;
    for (auto& s : slots_) {
      if (s->active && !s->done) {
        s->status = Status(StatusCode::kUnavailable, "connection to " + target_ + " lost: " + why);
        s->done = true;
        s->timer.cancel();
      }
    }
  }

  // One timer per channel: wakes every interval; sends a PING when the server has been quiet for
  // an interval, and gives up on it when still nothing has arrived `timeout` after the PING.
  void ScheduleKeepalive(std::chrono::steady_clock::duration after) {
    keepalive_timer_.expires_after(after);
    std::weak_ptr<ChannelCore> weak = shared_from_this();
    keepalive_timer_.async_wait([weak](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed_ || !self->conn_) return;
      self->KeepaliveTick();
    });
  }

  void KeepaliveTick() {
    using Duration = std::chrono::steady_clock::duration;
    const auto now = std::chrono::steady_clock::now();
    // While a PING is unanswered, look often enough to notice the timeout soon after it passes.
    const Duration watch = std::min<Duration>(keepalive_interval_, keepalive_timeout_) / 4;
    if (ping_sent_ && last_heard_ >= *ping_sent_) ping_sent_.reset();  // something arrived
    if (ping_sent_) {
      if (now - *ping_sent_ < keepalive_timeout_) {
        ScheduleKeepalive(watch);
        return;
      }
      const std::string why = "no reply to a keepalive ping within " +
                              std::to_string(keepalive_timeout_.count()) + " ms";
      spdlog::warn("channel {}: {}; closing", target_, why);
      FailAll(why);
      conn_->Close();
      return;
    }
    const Duration quiet = now - last_heard_;
    if (quiet < keepalive_interval_) {
      // Sleep until the connection could first have been quiet for a whole interval.
      ScheduleKeepalive(keepalive_interval_ - quiet + std::chrono::milliseconds(1));
      return;
    }
    FrameHeader h;
    h.type = FrameType::kPing;
    h.call_id = ++pings_;
    conn_->Send(internal::FrameWriter(h, std::string_view()));
    ping_sent_ = now;
    ScheduleKeepalive(watch);
  }

  std::string target_;
  std::shared_ptr<transport::Connection> conn_;
  transport::Executor executor_;
  asio::steady_timer keepalive_timer_;
  std::chrono::milliseconds keepalive_interval_{0}, keepalive_timeout_{0};
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> ping_sent_;
  uint64_t pings_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<uint32_t> free_;
  bool closed_ = false;
  std::string close_reason_;
};

}  // namespace internal

Channel::Channel(std::string target, transport::Executor ex,
                 std::shared_ptr<internal::ChannelCore> core, std::shared_ptr<EventLoopThread> loop)
    : target_(std::move(target)), executor_(std::move(ex)), core_(std::move(core)),
      own_loop_(std::move(loop)) {}

Channel::~Channel() {
  if (own_loop_ && !own_loop_->in_loop_thread()) {
    // Our reference to the core (and its timers) must go on the loop, before the loop and its
    // io_context do: a timer outliving its io_context touches freed memory (found by ASan).
    std::promise<void> closed;
    asio::post(executor_, [&, core = std::move(core_)]() mutable {
      core->Shutdown();
      core.reset();
      closed.set_value();
    });
    closed.get_future().wait();
    own_loop_.reset();
    return;
  }
  asio::post(executor_, [core = core_] { core->Shutdown(); });
}

void Channel::Close() {
  asio::post(executor_, [core = core_] { core->Close(); });
}

void Channel::CheckNotInLoopThread() const {
  if (own_loop_ && own_loop_->in_loop_thread()) {
    throw std::logic_error("rdmarpc: blocking call on a channel from its own event-loop thread");
  }
}

asio::awaitable<Result<std::shared_ptr<Channel>>> Channel::Connect(std::string uri,
                                                                   ChannelOptions options) {
  auto ex = co_await asio::this_coro::executor;
  auto conn = co_await transport::Connect(uri, ex, options.transport);
  if (!conn.ok()) co_return Status(StatusCode::kUnavailable, conn.error().message);
  auto core = std::make_shared<internal::ChannelCore>(uri, conn.value());
  conn.value()->Start(core);
  core->StartKeepalive(options.keepalive_interval, options.keepalive_timeout);
  co_return std::shared_ptr<Channel>(new Channel(uri, ex, std::move(core), nullptr));
}

Result<std::shared_ptr<Channel>> Channel::ConnectBlocking(std::string uri, ChannelOptions options) {
  auto loop = std::make_shared<EventLoopThread>();
  auto r = asio::co_spawn(loop->executor(), Connect(uri, options), asio::use_future).get();
  if (!r.ok()) return r.status();
  r.value()->own_loop_ = std::move(loop);
  return r;
}

asio::awaitable<Status> Channel::Call(const MethodInfo& method,
                                      const google::protobuf::MessageLite& request,
                                      google::protobuf::MessageLite& reply,
                                      const CallOptions& options) {
  auto current = co_await asio::this_coro::executor;
  if (current == executor_) {
    co_return co_await core_->Call(method, request, reply, options);
  }
  // Hop to the channel's thread and back; the caller stays suspended meanwhile, so request and
  // reply are touched by one thread at a time.
  co_return co_await asio::co_spawn(executor_, core_->Call(method, request, reply, options),
                                    asio::use_awaitable);
}

}  // namespace rdmarpc

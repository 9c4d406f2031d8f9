// What a server call's observers (interceptors, the runtime's own metrics recording) are told
// when the reply cannot go out as the handler meant: the connection closed under the call, or
// the reply is over the message limit. The connection is a scripted CallSink, so that the
// closed-but-not-yet-delivered moment, a race on a real connection, is reached every time.
#include <google/protobuf/wrappers.pb.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "rpc/internal/call_stats.h"
#include "rpc/internal/dispatch.h"
#include "rpc/internal/frame.h"

using namespace rdmarpc;
using namespace rdmarpc::internal;

namespace {

// A connection whose state the test sets: closed or not, and its message limit. FinishCall
// answers as the server's connection does (rpc/server.cc) for those two facts.
class ScriptedSink final : public CallSink {
 public:
  bool closed = false;
  size_t limit = 1 << 20;
  int finished = 0;

  ReplyFate FinishCall(uint64_t, size_t, const Status& status,
                       const google::protobuf::MessageLite* reply, bool deliver) override {
    ++finished;
    if (closed) return ReplyFate::kUndelivered;
    if (!deliver || !status.ok() || reply == nullptr) return ReplyFate::kUnsized;
    return kFrameHeaderBytes + reply->ByteSizeLong() <= limit ? ReplyFate::kSent
                                                              : ReplyFate::kRefused;
  }
  Status CheckReply(size_t message_bytes) const override {
    if (kFrameHeaderBytes + message_bytes <= limit) return Status();
    return Status(StatusCode::kResourceExhausted, "reply over the limit");
  }
  bool CallerGone() const override { return closed; }
  void Run(CallJobPtr) override {}
  void Track(CancelHook*) override {}
  void Untrack(CancelHook*) override {}
  bool SendStreamMessage(uint64_t, const google::protobuf::MessageLite&, size_t*,
                         Status*) override {
    return false;
  }
  void StreamMessageTaken(uint64_t, StreamInbox&, size_t, size_t) override {}
  size_t ParsedAllowance() const override { return SIZE_MAX; }
  size_t StreamParsedAllowance(const StreamInbox&) const override { return SIZE_MAX; }
  void StreamExcessReleased(size_t) override {}
  bool OverBudget() override { return false; }
  const transport::Executor& executor() const override { return executor_; }

 private:
  transport::Executor executor_;
};

class Recorder final : public ServerInterceptor {
 public:
  std::vector<std::string> heard;
  uint64_t bytes_sent = 0;
  void OnFinish(const ServerContext& context, const Status& status,
                std::chrono::nanoseconds) override {
    heard.push_back(StatusCodeName(status.code()));
    bytes_sent = context.bytes_sent();
  }
};

struct Outcome {
  std::vector<std::string> heard;  // the interceptor's OnFinish codes
  uint64_t intercepted_bytes = 0;  // bytes_sent as the interceptor saw it
  MethodStats::Totals stats;
};

// One call finished OK with a reply of `reply_bytes` on `sink`, observed by the metrics recorder,
// and by an interceptor too when `with_interceptor`.
Outcome FinishOne(ScriptedSink& sink, const std::shared_ptr<ScriptedSink>& owner,
                  bool with_interceptor, size_t reply_bytes) {
  auto recorder = std::make_shared<Recorder>();
  ServerInterceptors interceptors{recorder};
  MethodStats stats("/test.Service/Method");
  {
    ServerCall call(owner, 1, 10, ServerContext("peer", "/test.Service/Method", {}, {}));
    call.Observe(with_interceptor ? &interceptors : nullptr, &stats,
                 std::chrono::steady_clock::now());
    google::protobuf::StringValue reply;
    reply.set_value(std::string(reply_bytes, 'x'));
    call.Finish(Status(), &reply);
  }
  REQUIRE(sink.finished == 1);
  return Outcome{recorder->heard, recorder->bytes_sent, stats.Sum()};
}

// The call was counted once, under `code` alone, with `bytes` sent, and the interceptor (if
// any) heard the same.
void CheckSeenAs(const Outcome& o, StatusCode code, uint64_t bytes, bool with_interceptor) {
  for (size_t c = 0; c < MethodStats::kCodes; ++c) {
    INFO("code " << c);
    CHECK(o.stats.handled[c] == (c == static_cast<size_t>(code) ? 1u : 0u));
  }
  CHECK(o.stats.bytes_sent == bytes);
  if (with_interceptor) {
    CHECK(o.heard == std::vector<std::string>{std::string(StatusCodeName(code))});
    CHECK(o.intercepted_bytes == bytes);
  }
}

}  // namespace

TEST_CASE("a call ending on a connection already closed is seen as CANCELLED, with no bytes sent",
          "[server][metrics]") {
  const bool with_interceptor = GENERATE(false, true);
  INFO((with_interceptor ? "an interceptor and metrics" : "metrics alone"));
  auto sink = std::make_shared<ScriptedSink>();
  sink->closed = true;
  CheckSeenAs(FinishOne(*sink, sink, with_interceptor, 100), StatusCode::kCancelled, 0,
              with_interceptor);
}

TEST_CASE("a reply over the message limit is seen as RESOURCE_EXHAUSTED, with no bytes sent",
          "[server][metrics]") {
  const bool with_interceptor = GENERATE(false, true);
  INFO((with_interceptor ? "an interceptor and metrics" : "metrics alone"));
  auto sink = std::make_shared<ScriptedSink>();
  sink->limit = 64;
  CheckSeenAs(FinishOne(*sink, sink, with_interceptor, 100), StatusCode::kResourceExhausted, 0,
              with_interceptor);
}

TEST_CASE("a reply that goes out is seen as OK, with its bytes", "[server][metrics]") {
  const bool with_interceptor = GENERATE(false, true);
  INFO((with_interceptor ? "an interceptor and metrics" : "metrics alone"));
  auto sink = std::make_shared<ScriptedSink>();
  google::protobuf::StringValue reply;
  reply.set_value(std::string(100, 'x'));
  CheckSeenAs(FinishOne(*sink, sink, with_interceptor, 100), StatusCode::kOk, reply.ByteSizeLong(),
              with_interceptor);
}

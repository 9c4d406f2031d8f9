// grpc_bench: the yardstick users would otherwise pick. The same echo as rdmarpc_bench (reply
// size chosen by the caller), on gRPC C++ (Debian's libgrpc++ 1.51) with its callback API, over
// TCP on loopback, measured the same way: `depth` calls in flight, each finished call starting
// the next, latency recorded per call after the warm-up.
//
//   grpc_bench --server [--port P]            (prints "listening on 127.0.0.1:P")
//   grpc_bench --target 127.0.0.1:P [--request-bytes N] [--response-bytes N] [--depth D]
//              [--duration S] [--warmup S] [--json]
//   grpc_bench --target 127.0.0.1:P --stream [--response-bytes N] [--duration S] [--warmup S]
//              [--json]                       (one server stream read as fast as it comes, as
//                                              rdmarpc_bench --stream: messages/s and MB/s)
//   grpc_bench --target 127.0.0.1:P --upload [--request-bytes N] [--duration S] [--warmup S]
//              [--json]                       (one client stream written as fast as it goes, as
//                                              rdmarpc_bench --upload)
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <thread>

#include "tools/bench/grpc_bench.grpc.pb.h"
#include "tools/bench/histogram.h"
#include "tools/common/flags.h"

using Clock = std::chrono::steady_clock;

namespace {

class Service final : public grpcbench::Bench::CallbackService {
  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* ctx,
                                 const grpcbench::CallRequest* req,
                                 grpcbench::CallReply* reply) override {
    // As rdmarpc_bench's server: echo the payload, or make one of the size asked for.
    if (req->response_bytes() == req->payload().size()) {
      reply->set_payload(req->payload());
    } else {
      reply->mutable_payload()->assign(req->response_bytes(), 'r');
    }
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // As rdmarpc_bench's Stream: the same reply written over and over, each write started when the
  // last is done (gRPC allows one write in flight per stream), until `count` or the cancel.
  grpc::ServerWriteReactor<grpcbench::CallReply>* Stream(
      grpc::CallbackServerContext*, const grpcbench::StreamRequest* req) override {
    class Writer final : public grpc::ServerWriteReactor<grpcbench::CallReply> {
     public:
      explicit Writer(const grpcbench::StreamRequest& req) : count_(req.count()) {
        reply_.mutable_payload()->assign(req.response_bytes(), 's');
        Next();
      }
      void OnWriteDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream ended by the client"));
          return;
        }
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (count_ != 0 && sent_ == count_) {
          Finish(grpc::Status::OK);
          return;
        }
        ++sent_;
        StartWrite(&reply_);
      }
      grpcbench::CallReply reply_;
      uint64_t count_, sent_ = 0;
    };
    return new Writer(*req);
  }

  // As rdmarpc_bench's Upload: every message read (into one reused request), each read started
  // when the last is done, until the client's WritesDone.
  grpc::ServerReadReactor<grpcbench::CallRequest>* Upload(grpc::CallbackServerContext*,
                                                          grpcbench::CallReply*) override {
    class Reader final : public grpc::ServerReadReactor<grpcbench::CallRequest> {
     public:
      Reader() { StartRead(&req_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);  // the client's WritesDone (or a cancel: then unseen)
          return;
        }
        StartRead(&req_);
      }
      void OnDone() override { delete this; }

     private:
      grpcbench::CallRequest req_;
    };
    return new Reader;
  }
};

// Prints a --stream or --upload run's messages/s and MB/s (`bytes` per message); the exit status.
int ReportStream(bool upload, long bytes, double secs, uint64_t messages, const std::string& error,
                 bool json) {
  const double per_s = secs > 0 ? messages / secs : 0;
  const double mbps = per_s * static_cast<double>(bytes) / 1e6;
  if (json) {
    std::printf(
        "{\"%s\":true,\"%s\":%ld,\"seconds\":%.3f,\"messages\":%lu,"
        "\"messages_per_s\":%.0f,\"mb_per_s\":%.1f,\"error\":\"%s\"}\n",
        upload ? "upload" : "stream", upload ? "request_bytes" : "response_bytes", bytes, secs,
        static_cast<unsigned long>(messages), per_s, mbps, error.c_str());
  } else {
    std::printf(
        "grpc_bench: %s of %ld-byte messages: %lu in %.3f s, %.0f messages/s, %.1f MB/s%s%s\n",
        upload ? "upload" : "stream", bytes, static_cast<unsigned long>(messages), secs, per_s,
        mbps, error.empty() ? "" : "; ", error.c_str());
  }
  return error.empty() && messages > 0 ? 0 : 1;
}

// --stream: reads one server stream with gRPC's synchronous reader (its fastest way to read one
// stream) for --warmup, then counts messages for --duration.
int RunStream(grpcbench::Bench::Stub& stub, long response_bytes, long duration, long warmup,
              bool json) {
  grpc::ClientContext ctx;
  grpcbench::StreamRequest req;
  req.set_response_bytes(static_cast<uint32_t>(response_bytes));
  auto reader = stub.Stream(&ctx, req);
  grpcbench::CallReply reply;
  std::string error;
  const auto warm_end = Clock::now() + std::chrono::seconds(warmup);
  while (Clock::now() < warm_end) {
    if (!reader->Read(&reply)) break;
  }
  uint64_t messages = 0;
  const auto start = Clock::now();
  const auto end = start + std::chrono::seconds(duration);
  while (Clock::now() < end) {
    if (!reader->Read(&reply)) {
      error = "stream ended: " + reader->Finish().error_message();
      break;
    }
    if (reply.payload().size() != static_cast<size_t>(response_bytes)) {
      error = "message of the wrong size";
      break;
    }
    ++messages;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  ctx.TryCancel();
  return ReportStream(/*upload=*/false, response_bytes, secs, messages, error, json);
}

// --upload: writes one client stream with gRPC's synchronous writer (a Write returns once the
// message is handed to the transport, flow control included) for --warmup, then counts messages
// for --duration; then WritesDone and the server's status.
int RunUpload(grpcbench::Bench::Stub& stub, long request_bytes, long duration, long warmup,
              bool json) {
  grpc::ClientContext ctx;
  grpcbench::CallReply reply;
  auto writer = stub.Upload(&ctx, &reply);
  grpcbench::CallRequest req;
  req.mutable_payload()->assign(static_cast<size_t>(request_bytes), 'u');
  std::string error;
  bool open = true;
  const auto warm_end = Clock::now() + std::chrono::seconds(warmup);
  // Buffered writes: gRPC may hold a message back to send it with the next ones (WritesDone
  // flushes), as rdmarpc's Write does; without the hint each Write waits for its own flush.
  const auto buffered = grpc::WriteOptions().set_buffer_hint();
  while (open && Clock::now() < warm_end) open = writer->Write(req, buffered);
  uint64_t messages = 0;
  const auto start = Clock::now();
  const auto end = start + std::chrono::seconds(duration);
  while (open && Clock::now() < end) {
    open = writer->Write(req, buffered);
    if (open) ++messages;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  writer->WritesDone();
  if (grpc::Status s = writer->Finish(); !s.ok()) error = "upload ended: " + s.error_message();
  return ReportStream(/*upload=*/true, request_bytes, secs, messages, error, json);
}

int RunServer(long port) {
  Service service;
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                           &bound);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::fprintf(stderr, "grpc_bench: cannot listen on 127.0.0.1:%ld\n", port);
    return 1;
  }
  std::printf("listening on 127.0.0.1:%d\n", bound);
  std::fflush(stdout);
  server->Wait();  // until killed
  return 0;
}

// One chain of calls: each completion records its latency and starts the next call.
struct Chain {
  grpcbench::Bench::Stub* stub;
  grpcbench::CallRequest req;
  grpcbench::CallReply reply;
  std::unique_ptr<grpc::ClientContext> ctx;
  Clock::time_point t0;
};

struct Run {
  std::atomic<bool> measuring{false}, stop{false};
  std::mutex mu;  // guards hist and the counters (callbacks run on gRPC's threads)
  rdmarpc::bench::Histogram hist;
  uint64_t counted = 0, failed = 0;
  long running = 0;
  std::condition_variable all_done;
  std::string error;
  long response_bytes = 0;
};

void Next(Run& run, Chain& c) {
  if (run.stop) {
    std::lock_guard<std::mutex> l(run.mu);
    if (--run.running == 0) run.all_done.notify_all();
    return;
  }
  c.ctx = std::make_unique<grpc::ClientContext>();
  c.ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  c.reply.Clear();
  c.t0 = Clock::now();
  c.stub->async()->Call(c.ctx.get(), &c.req, &c.reply, [&run, &c](grpc::Status s) {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - c.t0).count();
    {
      std::lock_guard<std::mutex> l(run.mu);
      if (!s.ok() || c.reply.payload().size() != static_cast<size_t>(run.response_bytes)) {
        ++run.failed;
        if (run.error.empty()) run.error = s.ok() ? "reply of the wrong size" : s.error_message();
      } else if (run.measuring) {
        run.hist.Record(static_cast<uint64_t>(ns));
        ++run.counted;
      }
    }
    Next(run, c);
  });
}

}  // namespace

int main(int argc, char** argv) {
  rdmarpc::cmdline::Flags flags(argc, argv,
                                {{"server", false},
                                 {"port", true},
                                 {"target", true},
                                 {"request-bytes", true},
                                 {"response-bytes", true},
                                 {"depth", true},
                                 {"duration", true},
                                 {"warmup", true},
                                 {"json", false},
                                 {"stream", false},
                                 {"upload", false},
                                 {"help", false}});
  if (flags.has("help")) {
    std::cout << "usage: grpc_bench --server [--port P]\n"
                 "       grpc_bench --target HOST:PORT [--request-bytes N] [--response-bytes N]\n"
                 "                  [--depth D] [--duration S] [--warmup S] [--json]\n"
                 "       grpc_bench --target HOST:PORT --stream [--response-bytes N]\n"
                 "                  [--duration S] [--warmup S] [--json]\n"
                 "       grpc_bench --target HOST:PORT --upload [--request-bytes N]\n"
                 "                  [--duration S] [--warmup S] [--json]\n";
    return 0;
  }
  const long port = flags.get_int("port", 0, 0, 65535);
  const long request_bytes = flags.get_int("request-bytes", 64, 0, 64 << 20);
  const long response_bytes = flags.get_int("response-bytes", request_bytes, 0, 64 << 20);
  const long depth = flags.get_int("depth", 1, 1, 4096);
  const long duration = flags.get_int("duration", 5, 1, 86400);
  const long warmup = flags.get_int("warmup", 1, 0, 3600);
  const std::string target = flags.get("target", "");
  std::string bad = flags.error();
  if (bad.empty() && !flags.has("server") && target.empty()) bad = "give --server or --target";
  if (!bad.empty()) {
    std::cerr << "grpc_bench: " << bad << "\n(see grpc_bench --help)\n";
    return 2;
  }
  if (flags.has("server")) return RunServer(port);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5))) {
    std::cerr << "grpc_bench: cannot connect to " << target << "\n";
    return 3;
  }
  auto stub = grpcbench::Bench::NewStub(channel);
  if (flags.has("stream")) {
    return RunStream(*stub, response_bytes, duration, warmup, flags.has("json"));
  }
  if (flags.has("upload")) {
    return RunUpload(*stub, request_bytes, duration, warmup, flags.has("json"));
  }
  Run run;
  run.response_bytes = response_bytes;
  std::vector<Chain> chains(static_cast<size_t>(depth));
  run.running = depth;
  for (auto& c : chains) {
    c.stub = stub.get();
    c.req.set_payload(std::string(static_cast<size_t>(request_bytes), 'q'));
    c.req.set_response_bytes(static_cast<uint32_t>(response_bytes));
  }
  for (auto& c : chains) Next(run, c);
  std::this_thread::sleep_for(std::chrono::seconds(warmup));
  {
    std::lock_guard<std::mutex> l(run.mu);
    run.hist = {};
    run.counted = 0;
    run.measuring = true;
  }
  std::this_thread::sleep_for(std::chrono::seconds(duration));
  run.measuring = false;
  run.stop = true;
  {
    std::unique_lock<std::mutex> l(run.mu);
    run.all_done.wait(l, [&] { return run.running == 0; });
  }
  const double secs = static_cast<double>(duration);
  auto us = [&](double q) { return run.hist.Quantile(q) / 1000.0; };
  if (flags.has("json")) {
    std::printf(
        "{\"request_bytes\":%ld,\"response_bytes\":%ld,\"depth\":%ld,\"calls\":%lu,"
        "\"failed\":%lu,\"calls_per_s\":%.0f,\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,"
        "\"p999_us\":%.1f,\"max_us\":%.1f}\n",
        request_bytes, response_bytes, depth, static_cast<unsigned long>(run.counted),
        static_cast<unsigned long>(run.failed), run.counted / secs, us(0.5), us(0.9), us(0.99),
        us(0.999), run.hist.max() / 1000.0);
  } else {
    std::printf(
        "grpc_bench: %ld B, depth %ld: %.0f calls/s, %lu failed; latency us: p50 %.1f p90 %.1f "
        "p99 %.1f p99.9 %.1f max %.1f%s%s\n",
        request_bytes, depth, run.counted / secs, static_cast<unsigned long>(run.failed), us(0.5),
        us(0.9), us(0.99), us(0.999), run.hist.max() / 1000.0, run.error.empty() ? "" : "; ",
        run.error.c_str());
  }
  return run.failed == 0 ? 0 : 1;
}

// rdmarpc_bench: a closed-loop load generator for rdmarpc, and the server it drives.
//
//   rdmarpc_bench --server --listen tcp://127.0.0.1:7490 [--threads N] [--busy-poll]
//   rdmarpc_bench --target tcp://127.0.0.1:7490 [--connections C] [--depth D]
//                 [--request-bytes N] [--response-bytes N] [--duration S | --calls N]
//                 [--warmup S] [--threads T] [--busy-poll] [--json]
//   rdmarpc_bench --target URI --idle-connections N     (memory per idle connection)
//   rdmarpc_bench --target URI --stream --response-bytes N  (server-stream throughput)
//
// Closed loop: each connection keeps `depth` calls outstanding; a call's latency runs from just
// before the stub is called to the reply being decoded. Calls finished during the warm-up are
// not counted.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "rpc/event_loop.h"
#include "rpc/logging.h"
#include "rpc/metrics.h"
#include "rpc/rdmarpc.h"
#include "tools/bench/bench.rdmarpc.pb.h"
#include "tools/bench/histogram.h"
#include "tools/common/flags.h"
#include "tools/common/polling_flags.h"
#include "tools/common/server_flags.h"

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using rdmarpc::bench::Histogram;

namespace {

constexpr char kUsage[] =
    "usage: rdmarpc_bench --server [--listen URI]... [--threads N] [--busy-poll]\n"
    "                     [--poll-spin-us US] [--metrics]\n"
    "       rdmarpc_bench --target URI [--connections C] [--depth D] [--request-bytes N]\n"
    "                     [--response-bytes N] [--duration S | --calls N] [--warmup S]\n"
    "                     [--threads T] [--busy-poll] [--poll-spin-us US] [--verify]\n"
    "                     [--connect-timeout-ms MS] [--timeout-ms MS] [--json] [--quiet]\n"
    "                     [--metrics] [--no-latency] [--inline-handler]\n"
    "       rdmarpc_bench --target URI --blocking [--request-bytes N] [--response-bytes N]\n"
    "                     [--duration S | --calls N] [--warmup S] [--busy-poll] [--json]\n"
    "       rdmarpc_bench --target URI --idle-connections N [--hold S]\n"
    "       rdmarpc_bench --target URI --stream [--response-bytes N] [--duration S] [--json]\n"
    "       rdmarpc_bench --target URI --upload [--request-bytes N] [--duration S] [--json]\n"
    "\n"
    "Server: serves rdmarpc.bench.Bench (tools/bench/bench.proto); prints 'listening on URI'.\n"
    "Client: closed loop, C connections x D calls outstanding each; reports calls/s, MB/s\n"
    "(request + response payload bytes) and latency p50/p90/p99/p99.9/max.\n"
    "\n"
    "  --listen URI         server address; repeatable (default tcp://127.0.0.1:7490)\n"
    "  --target URI         server to drive\n"
    "  --connections C      connections (default 1)\n"
    "  --depth D            calls outstanding per connection (default 1)\n"
    "  --request-bytes N    request payload (default 64)\n"
    "  --response-bytes N   response payload (default: same as the request)\n"
    "  --duration S         measure for S seconds (default 5) ...\n"
    "  --calls N            ... or until N calls after the warm-up\n"
    "  --warmup S           seconds run but not counted first (default 1)\n"
    "  --threads T          I/O threads (client: connections are spread over them; default 1)\n"
    "  --busy-poll          rdma: spin on completion queues instead of sleeping\n"
    "  --poll-spin-us US    rdma: keep polling this long after the last completion before\n"
    "                       sleeping (default 200, or RDMARPC_POLL_SPIN_US); 0 = events only\n"
    "  --idle-connections N open N connections, make one call on each, then report the\n"
    "                       client's and the server's resident memory before and after\n"
    "  --hold S             with --idle-connections: keep them open S seconds after the\n"
    "                       report (e.g. to measure an idle server's CPU)\n"
    "  --connect-window K   with --idle-connections: open up to K at a time (default 16)\n"
    "  --idle-settle S      with --idle-connections: after the calls, wait until both sides'\n"
    "                       pinned memory stops falling (idle connections give their send\n"
    "                       buffers back), at most S seconds (default 60), and report that;\n"
    "                       0: report right after the calls\n"
    "  --verify             make every request unique and check its reply is its own echo;\n"
    "                       report mismatches and client/server RSS at start and end\n"
    "  --no-latency         do not time each call (no clock reads, no histogram): for\n"
    "                       instruction counts of rdmarpc alone (tools/bench/lib.sh)\n"
    "  --inline-handler     call CallInline, the same echo served by an inline handler\n"
    "                       (option (rdmarpc.inline_handler), rpc/options.proto), not Call\n"
    "  --deferred           co_await the stub's completion-token form with asio::deferred (no\n"
    "                       coroutine frame per call) instead of the awaitable it returns\n"
    "  --timeout-ms MS      each call's timeout (default 30000; 0: calls without a deadline,\n"
    "                       which neither side reads the clock for)\n"
    "  --metrics            record every call in an rdmarpc::Metrics registry (server and\n"
    "                       client interceptors), to measure what metrics cost\n"
    "  --blocking           calls one at a time from the main thread through a BlockingStub\n"
    "                       (request and reply each cross between it and the channel's own\n"
    "                       I/O thread), on one connection\n"
    "  --stream             instead of calls: one server stream of --response-bytes messages,\n"
    "                       read as fast as they come (messages/s and MB/s)\n"
    "  --upload             instead of calls: one client stream of --request-bytes messages,\n"
    "                       written as fast as the server's window lets them go\n"
    "  --connect-timeout-ms MS  give up connecting after MS (default 5000; e.g. more under\n"
    "                       valgrind)\n"
    "  --auth-secret-file F both sides: the shared secret (as the sample servers and clients)\n"
    "  --log-level LEVEL    trace|debug|info|warn|error|off (default $RDMARPC_LOG_LEVEL or warn)\n"
    "Server only, as in the sample servers (echo_server --help): --max-connections,\n"
    "  --max-connections-per-peer (here 0, no limit, by default: a benchmark's clients\n"
    "  share one address, e.g. --idle-connections 10000), --max-concurrent-calls,\n"
    "  --max-buffered-bytes, --idle-timeout-ms, --keepalive-ms, --keepalive-timeout-ms,\n"
    "  --shutdown-grace-ms, --access-log, --metrics-listen HOST:PORT.\n"
    "  --json               one JSON object on stdout instead of text\n"
    "  --quiet              no progress lines\n"
    "Exit codes: 0 done, 1 calls failed or could not connect, 2 bad arguments.\n";

uint64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Memory this process has pinned (VmPin: what RDMA registrations hold in place), in bytes.
uint64_t PinnedBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmPin:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

class BenchService final : public rdmarpc::bench::Bench::Service {
 public:
  void Echo(const rdmarpc::bench::CallRequest& req, rdmarpc::bench::CallReply& reply) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (req.response_bytes() == req.payload().size()) {
      reply.set_payload(req.payload());
    } else {
      reply.mutable_payload()->assign(req.response_bytes(), 'r');
    }
  }
  asio::awaitable<rdmarpc::Status> Call(rdmarpc::ServerContext&,
                                        const rdmarpc::bench::CallRequest& req,
                                        rdmarpc::bench::CallReply& reply) override {
    Echo(req, reply);
    co_return rdmarpc::Status();
  }
  // The same echo, served inline (bench.proto marks it so).
  rdmarpc::Status CallInline(rdmarpc::ServerContext&, const rdmarpc::bench::CallRequest& req,
                             rdmarpc::bench::CallReply& reply) override {
    Echo(req, reply);
    return rdmarpc::Status();
  }
  asio::awaitable<rdmarpc::Status> Stats(rdmarpc::ServerContext&,
                                         const rdmarpc::bench::StatsRequest&,
                                         rdmarpc::bench::StatsReply& reply) override {
    reply.set_rss_bytes(RssBytes());
    reply.set_pinned_bytes(PinnedBytes());
    reply.set_calls(calls_.load(std::memory_order_relaxed));
    co_return rdmarpc::Status();
  }
  asio::awaitable<rdmarpc::Status> Stream(
      rdmarpc::ServerContext&, const rdmarpc::bench::StreamRequest& req,
      rdmarpc::ServerWriter<rdmarpc::bench::CallReply>& w) override {
    rdmarpc::bench::CallReply reply;
    reply.mutable_payload()->assign(req.response_bytes(), 's');
    for (uint64_t i = 0; req.count() == 0 || i < req.count(); ++i) {
      if (!co_await w.Write(reply)) break;
    }
    co_return rdmarpc::Status();
  }
  asio::awaitable<rdmarpc::Status> Upload(rdmarpc::ServerContext&,
                                          rdmarpc::ServerReader<rdmarpc::bench::CallRequest>& r,
                                          rdmarpc::bench::CallReply&) override {
    rdmarpc::bench::CallRequest m;  // one message, reused (Read's second form)
    while (co_await r.Read(m)) {
    }
    co_return rdmarpc::Status();
  }

 private:
  std::atomic<uint64_t> calls_{0};
};

int RunServer(rdmarpc::cmdline::Flags& flags, long threads) {
  BenchService service;
  // The sample servers' harness (tools/common/server_flags.h): the same flags and defaults,
  // quieter logging (the figures go to stdout).
  rdmarpc::cmdline::ServerSetup setup;
  setup.log_level_fallback = "warn";
  // Unlike a served server's, no limit per client address unless asked: a benchmark's clients
  // all come from one (--idle-connections opens up to tens of thousands).
  setup.options.max_connections_per_peer = 0;
  if (int bad = rdmarpc::cmdline::SetUpServer(flags, "rdmarpc_bench", threads,
                                              "tcp://127.0.0.1:7490", setup)) {
    return bad;
  }
  // Recorded, never served: --metrics measures what recording costs (--metrics-listen serves).
  if (flags.has("metrics")) {
    setup.options.interceptors.push_back(
        std::make_shared<rdmarpc::Metrics>()->server_interceptor());
  }
  rdmarpc::Server server(setup.options);
  if (!server.AddService(service).ok()) return 1;
  // Diagnostics for memory questions (docs/RELIABILITY.md, "Soak"): with
  // RDMARPC_BENCH_HEAP_LOG=1, print resident memory, the allocator's bytes in use and the calls
  // in flight every half second.
  std::atomic<bool> stop_log{false};
  std::thread heap_log;
  if (std::getenv("RDMARPC_BENCH_HEAP_LOG") != nullptr) {
    heap_log = std::thread([&] {
      while (!stop_log) {
        const struct mallinfo2 mi = mallinfo2();
        std::cerr << "heap: rss_kb " << RssBytes() / 1024 << " in_use_kb "
                  << (mi.uordblks + mi.hblkhd) / 1024 << " free_kb " << mi.fordblks / 1024
                  << " in_flight " << server.in_flight_calls() << std::endl;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    });
  }
  const int rc =
      rdmarpc::cmdline::ListenAndRun(server, setup.uris, flags, setup.metrics, "rdmarpc_bench");
  stop_log = true;
  if (heap_log.joinable()) heap_log.join();
  return rc;
}

struct ClientConfig {
  std::string target;
  long connections, depth, request_bytes, response_bytes, threads;
  double duration_s, warmup_s;
  long calls;  // 0 = run for duration_s
  bool json, quiet, verify;
  bool latency = true;                        // time each call (--no-latency: not)
  bool inline_handler = false;                // call CallInline (--inline-handler)
  bool deferred = false;                      // the completion-token form (--deferred)
  std::chrono::milliseconds timeout{30'000};  // each call's (--timeout-ms; 0: no deadline)
  rdmarpc::ChannelOptions options;
};

// One I/O thread's share of the load.
struct Worker {
  asio::io_context ioc{rdmarpc::kLoopConcurrencyHint};
  Histogram hist;
  uint64_t counted = 0, failed = 0, mismatched = 0;
  std::string error;
  std::vector<std::shared_ptr<rdmarpc::Channel>> channels;
  uint64_t next_loop_id = 0;
};

struct Shared {
  std::atomic<bool> measuring{false}, stop{false};
  std::atomic<uint64_t> counted{0};  // for --calls and the progress line
  std::atomic<int> connect_failures{0};
  std::atomic<int> connected{0};
  // The main thread sleeps on `wake` while calls run, and is woken when `stop` is set or a
  // connection fails: waking it every few milliseconds to look would be counted in the client's
  // instructions per call (callgrind counts the whole process), by more the slower a call.
  std::mutex wake_mutex;
  std::condition_variable wake;
  void Notify() {
    std::lock_guard<std::mutex> lock(wake_mutex);
    wake.notify_all();
  }
};

asio::awaitable<void> Loop(const ClientConfig& cfg, Shared& shared, Worker& w,
                           std::shared_ptr<rdmarpc::Channel> ch) {
  rdmarpc::bench::Bench::Stub stub(ch);
  rdmarpc::bench::CallRequest req;
  req.set_payload(std::string(static_cast<size_t>(cfg.request_bytes), 'q'));
  req.set_response_bytes(static_cast<uint32_t>(cfg.response_bytes));
  rdmarpc::bench::CallReply reply;
  rdmarpc::CallOptions opts;
  opts.timeout = cfg.timeout;
  const uint64_t loop_id = w.next_loop_id++;
  uint64_t seq = 0;
  while (!shared.stop.load(std::memory_order_relaxed)) {
    if (cfg.verify) {
      // Every request unique (this loop's id, a sequence number), so that a lost, duplicated
      // or crossed reply shows up as a mismatch.
      char* p = req.mutable_payload()->data();
      ++seq;
      std::memcpy(p, &loop_id, 8);
      std::memcpy(p + 8, &seq, 8);
    }
    // Two clock reads per call are the benchmark's, not rdmarpc's: --no-latency leaves them
    // out of instruction counts.
    const auto t0 = cfg.latency ? Clock::now() : Clock::time_point{};
    rdmarpc::Status s;  // (GCC 12: no co_await inside ?:)
    if (cfg.deferred) {
      if (cfg.inline_handler) {
        s = co_await stub.CallInline(req, reply, opts, asio::deferred);
      } else {
        s = co_await stub.Call(req, reply, opts, asio::deferred);
      }
    } else if (cfg.inline_handler) {
      s = co_await stub.CallInline(req, reply, opts);
    } else {
      s = co_await stub.Call(req, reply, opts);
    }
    const auto ns = cfg.latency
                        ? std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0)
                        : std::chrono::nanoseconds{0};
    if (!s.ok()) {
      ++w.failed;
      if (w.error.empty()) w.error = s.ToString();
      if (s.code() == rdmarpc::StatusCode::kUnavailable) co_return;
      continue;
    }
    if (reply.payload().size() != static_cast<size_t>(cfg.response_bytes)) {
      ++w.failed;
      if (w.error.empty()) w.error = "reply of the wrong size";
    } else if (cfg.verify && reply.payload() != req.payload()) {
      ++w.mismatched;
    }
    if (shared.measuring.load(std::memory_order_relaxed)) {
      if (cfg.latency) w.hist.Record(static_cast<uint64_t>(ns.count()));
      ++w.counted;
      const uint64_t n = shared.counted.fetch_add(1, std::memory_order_relaxed) + 1;
      if (cfg.calls > 0 && n == static_cast<uint64_t>(cfg.calls)) {
        shared.stop = true;
        shared.Notify();
      }
    }
  }
}

// Opens one connection and records it in `w` (or the failure in `w` and `shared`); null on failure.
asio::awaitable<std::shared_ptr<rdmarpc::Channel>> ConnectOne(const ClientConfig& cfg,
                                                              Shared& shared, Worker& w) {
  auto ch = co_await rdmarpc::Channel::Connect(cfg.target, cfg.options);
  if (!ch.ok()) {
    if (w.error.empty()) w.error = "connect: " + ch.status().ToString();
    ++shared.connect_failures;
    shared.Notify();
    co_return nullptr;
  }
  ++shared.connected;
  w.channels.push_back(*ch);
  co_return *ch;
}

// The throughput client's connections: one at a time, each starting its --depth call loops.
asio::awaitable<void> StartConnections(const ClientConfig& cfg, Shared& shared, Worker& w, long n) {
  auto ex = co_await asio::this_coro::executor;
  for (long c = 0; c < n; ++c) {
    auto ch = co_await ConnectOne(cfg, shared, w);
    if (!ch) continue;
    for (long d = 0; d < cfg.depth; ++d) {
      asio::co_spawn(ex, Loop(cfg, shared, w, ch), asio::detached);
    }
  }
}

// Opens n connections (into w.channels), up to `window` handshakes at a time: a handshake spends
// much of its time waiting (round trips, the other side's set-up), and one at a time 10,000
// rdma:// connections outlasted the VM benchmark's time limit in a slow boot. The openers
// capture this frame's locals by reference: it waits for the last of them before it ends.
asio::awaitable<void> OpenConnections(const ClientConfig& cfg, Shared& shared, Worker& w, long n,
                                      long window) {
  auto ex = co_await asio::this_coro::executor;
  long next = 0, running = 0;
  asio::steady_timer done(ex, asio::steady_timer::time_point::max());
  auto opener = [&]() -> asio::awaitable<void> {
    while (next < n) {
      ++next;
      co_await ConnectOne(cfg, shared, w);
    }
    // Sets the time rather than cancelling: also right if this ends before the wait begins.
    if (--running == 0) done.expires_at(asio::steady_timer::time_point::min());
  };
  for (long i = 0; i < std::min(window, n); ++i) {
    ++running;
    asio::co_spawn(ex, opener, asio::detached);
  }
  if (running > 0) co_await done.async_wait(asio::as_tuple(asio::use_awaitable));
}

// `s` as the inside of a JSON string: quotes, backslashes and control characters escaped (an
// error message may hold any of them; the scripts parse these lines as JSON).
std::string JsonText(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// What a --stream or --upload run measured.
struct StreamOut {
  uint64_t messages = 0;
  double seconds = 0;
  std::string error;
};

// Prints a --stream or --upload run's messages/s and MB/s (`upload`: of requests written).
int ReportStream(const ClientConfig& cfg, const StreamOut& o, bool upload) {
  const long bytes = upload ? cfg.request_bytes : cfg.response_bytes;
  const double per_s = o.seconds > 0 ? o.messages / o.seconds : 0;
  const double mbps = per_s * double(bytes) / 1e6;
  if (cfg.json) {
    std::cout << "{\"target\":\"" << JsonText(cfg.target) << "\","
              << (upload ? "\"upload\":true,\"request_bytes\":"
                         : "\"stream\":true,\"response_bytes\":")
              << bytes << ",\"seconds\":" << Fixed(o.seconds, 3) << ",\"messages\":" << o.messages
              << ",\"messages_per_s\":" << Fixed(per_s, 0) << ",\"mb_per_s\":" << Fixed(mbps, 1)
              << ",\"error\":\"" << JsonText(o.error) << "\"}" << std::endl;
  } else {
    std::printf("%s %s of %ld-byte messages: %llu in %.3f s, %.0f messages/s, %.1f MB/s%s%s\n",
                cfg.target.c_str(), upload ? "upload" : "stream", bytes,
                static_cast<unsigned long long>(o.messages), o.seconds, per_s, mbps,
                o.error.empty() ? "" : "; error: ", o.error.c_str());
  }
  return o.error.empty() && o.messages > 0 ? 0 : 1;
}

// Runs `body` (given the stub) on a loop of this thread once connected; its result or the
// connection's error.
template <class Body>
StreamOut RunStreamBody(const ClientConfig& cfg, Body body) {
  asio::io_context ioc{rdmarpc::kLoopConcurrencyHint};
  auto f = asio::co_spawn(
      ioc,
      [&]() -> asio::awaitable<StreamOut> {
        auto ch = co_await rdmarpc::Channel::Connect(cfg.target, cfg.options);
        if (!ch.ok()) {
          StreamOut o;
          o.error = ch.status().ToString();
          co_return o;
        }
        rdmarpc::bench::Bench::Stub stub(*ch);
        co_return co_await body(stub);
      },
      asio::use_future);
  rdmarpc::RunLoop(ioc);
  return f.get();
}

Clock::time_point SecondsFromNow(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// --stream: one server stream of --response-bytes messages read as fast as they come; messages/s
// and MB/s over --duration after --warmup.
int RunStream(const ClientConfig& cfg) {
  StreamOut o =
      RunStreamBody(cfg, [&](rdmarpc::bench::Bench::Stub& stub) -> asio::awaitable<StreamOut> {
        StreamOut out;
        rdmarpc::bench::StreamRequest req;
        req.set_response_bytes(static_cast<uint32_t>(cfg.response_bytes));
        auto call = co_await stub.Stream(req);
        const auto warm_end = SecondsFromNow(cfg.warmup_s);
        while (Clock::now() < warm_end) {
          if (!co_await call.Read()) break;
        }
        const auto start = Clock::now();
        const auto end = SecondsFromNow(cfg.duration_s);
        while (Clock::now() < end) {
          if (!co_await call.Read()) {
            out.error = (co_await call.Finish()).ToString();
            break;
          }
          ++out.messages;
        }
        out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        call.Cancel();
        co_return out;
      });
  return ReportStream(cfg, o, /*upload=*/false);
}

// --upload: one client stream of --request-bytes messages written as fast as the server's
// window lets them go; messages/s and MB/s over --duration after --warmup.
int RunUpload(const ClientConfig& cfg) {
  StreamOut o =
      RunStreamBody(cfg, [&](rdmarpc::bench::Bench::Stub& stub) -> asio::awaitable<StreamOut> {
        StreamOut out;
        rdmarpc::bench::CallRequest req;
        req.mutable_payload()->assign(cfg.request_bytes, 'u');
        auto call = co_await stub.Upload();
        const auto warm_end = SecondsFromNow(cfg.warmup_s);
        bool open = true;
        while (open && Clock::now() < warm_end) open = co_await call.Write(req);
        const auto start = Clock::now();
        const auto end = SecondsFromNow(cfg.duration_s);
        while (open && Clock::now() < end) {
          open = co_await call.Write(req);
          if (open) ++out.messages;
        }
        out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        auto done = co_await call.Finish();
        if (!done.ok()) out.error = done.status().ToString();
        co_return out;
      });
  return ReportStream(cfg, o, /*upload=*/true);
}

int RunIdle(const ClientConfig& cfg, long n, long hold_s, long connect_window, long settle_s) {
  Shared shared;
  Worker w;
  auto guard = asio::make_work_guard(w.ioc);
  std::thread loop([&] { rdmarpc::RunLoop(w.ioc); });
  auto on_loop = [&](auto work) {
    return asio::co_spawn(w.ioc, std::move(work), asio::use_future).get();
  };
  auto stats = [&](rdmarpc::bench::StatsReply& out) {
    return on_loop([&]() -> asio::awaitable<bool> {
      rdmarpc::bench::Bench::Stub stub(w.channels.front());
      co_return (co_await stub.Stats(rdmarpc::bench::StatsRequest(), out)).ok();
    });
  };
  auto finish = [&](int rc) {
    asio::post(w.ioc, [&] { w.channels.clear(); });
    guard.reset();
    loop.join();
    return rc;
  };
  // Baselines first, with one connection open: this process, and the server via Stats.
  on_loop(OpenConnections(cfg, shared, w, 1, 1));
  if (w.channels.empty()) {
    std::cerr << "rdmarpc_bench: " << w.error << "\n";
    return finish(1);
  }
  rdmarpc::bench::StatsReply before, after;
  if (!stats(before)) return finish(1);
  const uint64_t rss_before = RssBytes(), pinned_before = PinnedBytes();
  on_loop(OpenConnections(cfg, shared, w, n, connect_window));
  // One call on each, so that every connection is fully set up on both sides.
  const uint64_t failed = on_loop([&]() -> asio::awaitable<uint64_t> {
    uint64_t bad = 0;
    for (auto& ch : w.channels) {
      rdmarpc::bench::Bench::Stub stub(ch);
      rdmarpc::bench::CallRequest req;
      rdmarpc::CallOptions o;
      o.timeout = std::chrono::seconds(10);  // a server out of descriptors never answers
      if (!(co_await stub.Call(req, o)).ok()) ++bad;
    }
    co_return bad;
  });
  uint64_t rss_after = RssBytes(), pinned_after = PinnedBytes();
  if (!stats(after)) return finish(1);
  const uint64_t client_busy_pin = pinned_after, server_busy_pin = after.pinned_bytes();
  // Idle: a connection that sends nothing for a while gives its send buffer back (RDMA:
  // transport/rdma/tunables.h, kStagingSweepMs). Wait until neither side's pinned memory has
  // moved for 3 s. The Stats calls keep the first connection busy, as it was for `before`.
  // (TCP connections pin nothing and keep their buffers: no wait.)
  double settled_s = 0;
  if (settle_s > 0 && cfg.target.rfind("rdma://", 0) == 0) {
    const auto start = Clock::now(), end = start + std::chrono::seconds(settle_s);
    auto last_change = start;
    while (Clock::now() < end && Clock::now() - last_change < std::chrono::seconds(3)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      rdmarpc::bench::StatsReply now;
      if (!stats(now)) return finish(1);
      const uint64_t pinned_now = PinnedBytes();
      if (pinned_now != pinned_after || now.pinned_bytes() != after.pinned_bytes()) {
        last_change = Clock::now();
      }
      pinned_after = pinned_now;
      after = now;
    }
    rss_after = RssBytes();
    settled_s = std::chrono::duration<double>(last_change - start).count();
  }
  const long opened = static_cast<long>(w.channels.size()) - 1;
  const auto per_connection = [&](uint64_t now, uint64_t then) {
    return opened ? (double(now) - double(then)) / opened : 0.0;
  };
  const double client_per = per_connection(rss_after, rss_before);
  const double server_per = per_connection(after.rss_bytes(), before.rss_bytes());
  const double client_pin = per_connection(pinned_after, pinned_before);
  const double server_pin = per_connection(after.pinned_bytes(), before.pinned_bytes());
  const double client_busy = per_connection(client_busy_pin, pinned_before);
  const double server_busy = per_connection(server_busy_pin, before.pinned_bytes());
  if (cfg.json) {
    std::cout << "{\"target\":\"" << JsonText(cfg.target) << "\",\"idle_connections_asked\":" << n
              << ",\"opened\":" << opened << ",\"failed_calls\":" << failed
              << ",\"client_bytes_per_connection\":" << Fixed(client_per, 0)
              << ",\"server_bytes_per_connection\":" << Fixed(server_per, 0)
              << ",\"client_pinned_per_connection\":" << Fixed(client_pin, 0)
              << ",\"server_pinned_per_connection\":" << Fixed(server_pin, 0)
              << ",\"client_pinned_per_connection_after_call\":" << Fixed(client_busy, 0)
              << ",\"server_pinned_per_connection_after_call\":" << Fixed(server_busy, 0)
              << ",\"settled_after_s\":" << Fixed(settled_s, 1)
              << ",\"server_pinned_bytes\":" << after.pinned_bytes() << ",\"error\":\""
              << JsonText(w.error) << "\"}" << std::endl;
  } else {
    std::cout << "idle connections: " << opened << " of " << n << " opened"
              << (w.error.empty() ? "" : " (first error: " + w.error + ")") << "\n"
              << "client RSS per connection: " << Fixed(client_per / 1024, 1) << " KiB\n"
              << "server RSS per connection: " << Fixed(server_per / 1024, 1) << " KiB\n"
              << "client pinned per connection: " << Fixed(client_pin / 1024, 1) << " KiB\n"
              << "server pinned per connection: " << Fixed(server_pin / 1024, 1) << " KiB\n"
              << "right after the calls: client pinned " << Fixed(client_busy / 1024, 1)
              << " KiB, server pinned " << Fixed(server_busy / 1024, 1) << " KiB per connection"
              << (settled_s > 0 ? "; settled after " + Fixed(settled_s, 1) + " s" : "") << "\n";
  }
  std::this_thread::sleep_for(std::chrono::seconds(hold_s));
  return finish(opened == n && failed == 0 ? 0 : 1);
}

// The server's resident memory via its Stats method (0 if it cannot be asked).
uint64_t ServerRss(const ClientConfig& cfg) {
  auto ch = rdmarpc::Channel::ConnectBlocking(cfg.target, cfg.options);
  if (!ch.ok()) return 0;
  auto r = rdmarpc::bench::Bench::BlockingStub(*ch).Stats(rdmarpc::bench::StatsRequest());
  return r.ok() ? r->rss_bytes() : 0;
}

// The calls' result, as JSON (--json) or text; `verified` adds --verify's part (JSON fields, or
// a line) when cfg.verify.
template <class Verified>
void PrintCalls(const ClientConfig& cfg, const Histogram& h, uint64_t counted, uint64_t failed,
                double secs, const std::string& error, Verified verified) {
  const double rate = counted / secs;
  const double mbps = rate * double(cfg.request_bytes + cfg.response_bytes) / 1e6;
  auto us = [&](double q) { return Fixed(h.Quantile(q) / 1000.0, 1); };
  if (cfg.json) {
    std::cout << "{\"target\":\"" << JsonText(cfg.target)
              << "\",\"connections\":" << cfg.connections << ",\"depth\":" << cfg.depth
              << ",\"request_bytes\":" << cfg.request_bytes
              << ",\"response_bytes\":" << cfg.response_bytes << ",\"threads\":" << cfg.threads
              << ",\"seconds\":" << Fixed(secs, 3) << ",\"calls\":" << counted
              << ",\"failed\":" << failed << ",\"calls_per_s\":" << Fixed(rate, 0)
              << ",\"mb_per_s\":" << Fixed(mbps, 1) << ",\"p50_us\":" << us(0.5)
              << ",\"p90_us\":" << us(0.9) << ",\"p99_us\":" << us(0.99)
              << ",\"p999_us\":" << us(0.999) << ",\"max_us\":" << Fixed(h.max() / 1000.0, 1);
    if (cfg.verify) verified();
    std::cout << ",\"error\":\"" << JsonText(error) << "\"}" << std::endl;
  } else {
    std::printf(
        "%s: %ld conn x %ld deep, %ld B -> %ld B: %lu calls in %.2f s, %lu failed\n"
        "  %.0f calls/s, %.1f MB/s; latency us: p50 %s p90 %s p99 %s p99.9 %s max %s\n",
        cfg.target.c_str(), cfg.connections, cfg.depth, cfg.request_bytes, cfg.response_bytes,
        static_cast<unsigned long>(counted), secs, static_cast<unsigned long>(failed), rate, mbps,
        us(0.5).c_str(), us(0.9).c_str(), us(0.99).c_str(), us(0.999).c_str(),
        Fixed(h.max() / 1000.0, 1).c_str());
    if (cfg.verify) verified();
    if (!error.empty()) std::printf("  first error: %s\n", error.c_str());
  }
}

int RunClient(const ClientConfig& cfg) {
  Shared shared;
  const uint64_t server_rss_start = cfg.verify ? ServerRss(cfg) : 0;
  std::vector<std::unique_ptr<Worker>> workers;
  // Each loop keeps running, even with nothing to do for a moment, until its guard goes (a
  // guard, not a periodic timer: a timer's wake-ups would be counted per call).
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  for (long t = 0; t < cfg.threads; ++t) {
    workers.push_back(std::make_unique<Worker>());
    guards.push_back(asio::make_work_guard(workers.back()->ioc));
  }
  for (long t = 0; t < cfg.threads; ++t) {
    const long n = cfg.connections / cfg.threads + (t < cfg.connections % cfg.threads ? 1 : 0);
    asio::co_spawn(workers[t]->ioc, StartConnections(cfg, shared, *workers[t], n), asio::detached);
  }
  std::vector<std::thread> threads;
  for (auto& w : workers) threads.emplace_back([&w] { rdmarpc::RunLoop(w->ioc); });

  // Warm up, then measure for the duration (or until --calls), printing progress each second.
  const auto warm_until = Clock::now() + std::chrono::duration<double>(cfg.warmup_s);
  {
    std::unique_lock<std::mutex> lock(shared.wake_mutex);
    shared.wake.wait_until(lock, warm_until, [&] { return shared.connect_failures > 0; });
  }
  shared.measuring = true;
  const uint64_t client_rss_start = RssBytes();
  const auto start = Clock::now();
  const auto until = start + std::chrono::duration<double>(cfg.duration_s);
  auto next_progress = start + std::chrono::seconds(1);
  uint64_t last = 0;
  auto done = [&] { return shared.stop || shared.connect_failures > 0; };
  while (!done() && (cfg.calls > 0 || Clock::now() < until)) {
    {
      // Until the next progress line (--quiet: none), the end of the duration, or done.
      auto wake_at = cfg.quiet ? Clock::time_point::max() : next_progress;
      if (cfg.calls == 0)
        wake_at = std::min(wake_at, std::chrono::time_point_cast<Clock::duration>(until));
      std::unique_lock<std::mutex> lock(shared.wake_mutex);
      if (wake_at == Clock::time_point::max()) {
        shared.wake.wait(lock, done);
      } else {
        shared.wake.wait_until(lock, wake_at, done);
      }
    }
    if (!cfg.quiet && Clock::now() >= next_progress) {
      const uint64_t now_count = shared.counted.load();
      std::fprintf(stderr, "rdmarpc_bench: %.0f s: %lu calls/s\n",
                   std::chrono::duration<double>(Clock::now() - start).count(),
                   static_cast<unsigned long>(now_count - last));
      last = now_count;
      next_progress += std::chrono::seconds(1);
    }
  }
  shared.measuring = false;
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const uint64_t client_rss_end = RssBytes();
  shared.stop = true;
  for (auto& w : workers) {
    asio::post(w->ioc, [&w] { w->channels.clear(); });
  }
  guards.clear();
  for (auto& t : threads) t.join();

  const uint64_t server_rss_end = cfg.verify ? ServerRss(cfg) : 0;
  Histogram h;
  uint64_t counted = 0, failed = 0, mismatched = 0;
  std::string error;
  for (auto& w : workers) {
    h.Merge(w->hist);
    counted += w->counted;
    failed += w->failed;
    mismatched += w->mismatched;
    if (error.empty()) error = w->error;
  }
  PrintCalls(cfg, h, counted, failed, secs, error, [&] {
    if (cfg.json) {
      std::cout << ",\"mismatched\":" << mismatched << ",\"client_rss_start\":" << client_rss_start
                << ",\"client_rss_end\":" << client_rss_end
                << ",\"server_rss_start\":" << server_rss_start
                << ",\"server_rss_end\":" << server_rss_end;
    } else {
      std::printf(
          "  verified: %lu mismatched; RSS client %.1f -> %.1f MiB, server %.1f -> %.1f MiB\n",
          static_cast<unsigned long>(mismatched), client_rss_start / 1048576.0,
          client_rss_end / 1048576.0, server_rss_start / 1048576.0, server_rss_end / 1048576.0);
    }
  });
  return failed == 0 && mismatched == 0 && counted > 0 && shared.connect_failures == 0 ? 0 : 1;
}

// --blocking: one caller thread, one call at a time, through a BlockingStub.
int RunBlocking(const ClientConfig& cfg) {
  auto ch = rdmarpc::Channel::ConnectBlocking(cfg.target, cfg.options);
  if (!ch.ok()) {
    std::cerr << "rdmarpc_bench: " << ch.status().ToString() << "\n";
    return 1;
  }
  rdmarpc::bench::Bench::BlockingStub stub(*ch);
  rdmarpc::bench::CallRequest req;
  req.set_payload(std::string(static_cast<size_t>(cfg.request_bytes), 'q'));
  req.set_response_bytes(static_cast<uint32_t>(cfg.response_bytes));
  rdmarpc::CallOptions opts;
  opts.timeout = cfg.timeout;
  Histogram h;
  uint64_t counted = 0, failed = 0;
  std::string error;
  auto run = [&](Clock::time_point until, uint64_t calls, bool measure) {
    while (calls > 0 ? counted < calls : Clock::now() < until) {
      const auto t0 = Clock::now();
      auto r = stub.Call(req, opts);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0);
      if (!r.ok() || r->payload().size() != static_cast<size_t>(cfg.response_bytes)) {
        ++failed;
        if (error.empty()) error = r.ok() ? "reply of the wrong size" : r.status().ToString();
        if (!r.ok() && r.status().code() == rdmarpc::StatusCode::kUnavailable) return;
      } else if (measure) {
        h.Record(static_cast<uint64_t>(ns.count()));
        ++counted;
      }
    }
  };
  run(SecondsFromNow(cfg.warmup_s), 0, false);
  failed = 0;
  const auto start = Clock::now();
  run(SecondsFromNow(cfg.duration_s), static_cast<uint64_t>(cfg.calls), true);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  PrintCalls(cfg, h, counted, failed, secs, error, [] {});
  return failed == 0 && counted > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Both sides: one descriptor per connection (its CM event channel), thousands of connections.
  rdmarpc::cmdline::RaiseFileLimit();
  rdmarpc::cmdline::Flags flags(argc, argv,
                                rdmarpc::cmdline::WithServerHarnessFlags(
                                    {{"server", false},          {"target", true},
                                     {"connections", true},      {"depth", true},
                                     {"request-bytes", true},    {"response-bytes", true},
                                     {"duration", true},         {"calls", true},
                                     {"warmup", true},           {"connect-timeout-ms", true},
                                     {"idle-connections", true}, {"hold", true},
                                     {"connect-window", true},   {"json", false},
                                     {"idle-settle", true},      {"quiet", false},
                                     {"verify", false},          {"stream", false},
                                     {"upload", false},          {"metrics", false},
                                     {"no-latency", false},      {"timeout-ms", true},
                                     {"blocking", false},        {"inline-handler", false},
                                     {"deferred", false}}));
  if (flags.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  ClientConfig cfg;
  cfg.threads = flags.get_int("threads", 1, 1, 256);
  cfg.target = flags.get("target", "");
  cfg.connections = flags.get_int("connections", 1, 1, 100000);
  cfg.depth = flags.get_int("depth", 1, 1, 100000);
  cfg.request_bytes = flags.get_int("request-bytes", 64, 0, 64 << 20);
  cfg.response_bytes = flags.get_int("response-bytes", cfg.request_bytes, 0, 64 << 20);
  cfg.duration_s = static_cast<double>(flags.get_int("duration", 5, 1, 86400));
  cfg.warmup_s = static_cast<double>(flags.get_int("warmup", 1, 0, 3600));
  cfg.calls = flags.get_int("calls", 0, 0, 1000000000000L);
  cfg.json = flags.has("json");
  cfg.quiet = flags.has("quiet") || cfg.json;
  cfg.verify = flags.has("verify");
  cfg.latency = !flags.has("no-latency");
  cfg.inline_handler = flags.has("inline-handler");
  cfg.deferred = flags.has("deferred");
  cfg.timeout = std::chrono::milliseconds(flags.get_int("timeout-ms", 30'000, 0, 86'400'000));
  if (flags.has("metrics")) {
    cfg.options.interceptors.push_back(std::make_shared<rdmarpc::Metrics>()->client_interceptor());
  }
  rdmarpc::cmdline::ApplyPollingFlags(flags, cfg.options.transport);
  cfg.options.transport.auth_secret = flags.auth_secret();
  cfg.options.transport.connect_timeout_ms = static_cast<int>(
      flags.get_int("connect-timeout-ms", cfg.options.transport.connect_timeout_ms, 1, 3'600'000));
  const long idle = flags.get_int("idle-connections", 0, 0, 1000000);
  const long hold_s = flags.get_int("hold", 0, 0, 86400);
  const long connect_window = flags.get_int("connect-window", 16, 1, 100000);
  const long idle_settle = flags.get_int("idle-settle", 60, 0, 3600);
  std::string bad = flags.error();
  if (bad.empty() && !flags.has("server") && cfg.target.empty()) bad = "give --server or --target";
  if (bad.empty() && cfg.verify &&
      (cfg.request_bytes < 16 || cfg.response_bytes != cfg.request_bytes)) {
    bad = "--verify needs --request-bytes of at least 16 and an equal --response-bytes";
  }
  if (bad.empty() && !rdmarpc::InitLogging(flags.get("log-level", ""), "warn")) {
    bad = "unknown log level";
  }
  if (!bad.empty()) {
    std::cerr << "rdmarpc_bench: " << bad << "\n\n" << kUsage;
    return 2;
  }
  if (flags.has("server")) return RunServer(flags, cfg.threads);
  if (idle > 0) return RunIdle(cfg, idle, hold_s, connect_window, idle_settle);
  if (flags.has("stream")) return RunStream(cfg);
  if (flags.has("upload")) return RunUpload(cfg);
  if (flags.has("blocking")) return RunBlocking(cfg);
  return RunClient(cfg);
}

// echo_client: calls demo.Echo/Say and prints what it sent and what came back; with --chat, sends
// the messages on one demo.Echo/Chat bidirectional stream instead.
//
//   echo_client --target tcp://127.0.0.1:7471 --message hello --count 3
//   echo_client --target tcp://127.0.0.1:7471 --chat --count 1000 --quiet
//
// Exit codes: 0 every call succeeded with the right reply, 1 a call failed or a reply did not
// match, 2 bad arguments, 3 could not connect.
#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "proto/echo.rdmarpc.pb.h"
#include "rpc/rdmarpc.h"
#include "tools/common/flags.h"
#include "tools/common/polling_flags.h"

namespace {

constexpr char kUsage[] =
    "usage: echo_client [--target URI] [--message TEXT] [--count N] [--concurrency N]\n"
    "                   [--payload-bytes N] [--timeout-ms N] [--busy-poll] [--poll-spin-us US]\n"
    "                   [--quiet] [--chat]\n"
    "                   [--auth-secret-file F] [--keepalive-ms N] [--keepalive-timeout-ms N]\n"
    "                   [--stop-on-error] [--log-level LEVEL]\n"
    "\n"
    "Calls demo.Echo/Say on a running echo_server and checks every reply.\n"
    "\n"
    "  --target URI         server address (default tcp://127.0.0.1:7471)\n"
    "  --message TEXT       message to send (default 'hello')\n"
    "  --count N            calls to make (default 1)\n"
    "  --concurrency N      calls in flight at once on the one connection (default 1)\n"
    "  --payload-bytes N    extra payload bytes per request (default 0)\n"
    "  --timeout-ms N       per-call deadline (default 5000; 0 = none)\n"
    "  --connect-retry-ms N keep retrying the connection this long (default 0)\n"
    "  --busy-poll          rdma: spin on the completion queue (lowest latency, one core busy;\n"
    "                       also RDMARPC_BUSY_POLL=1)\n"
    "  --poll-spin-us US    rdma: after traffic, keep polling this long before sleeping\n"
    "                       (default 200, or RDMARPC_POLL_SPIN_US; 0 = sleep at once)\n"
    "  --chat               send the messages on one bidirectional stream (demo.Echo/Chat):\n"
    "                       written as fast as the stream's window allows, each echo read\n"
    "                       and checked, in order; --timeout-ms covers the whole stream\n"
    "  --quiet              print only the summary\n"
    "  --stop-on-error      make no more calls after the first failure\n"
    "  --keepalive-ms N     ping the server after N ms of silence (default 0 = off) ...\n"
    "  --keepalive-timeout-ms N  ... and give it up, failing calls in flight, when nothing\n"
    "                       arrives within N ms of the ping (default 5000)\n"
    "  --auth-secret-file F present the secret in file F (for a server that requires one)\n"
    "  --log-level LEVEL    trace|debug|info|warn|error|off\n"
    "  --help               this text\n"
    "\n"
    "Exit codes: 0 all calls OK, 1 a call failed or a reply differed, 2 bad arguments,\n"
    "3 could not connect.\n";

struct Config {
  std::string target, message;
  long count, concurrency, payload_bytes, timeout_ms, connect_retry_ms;
  bool quiet, stop_on_error, chat;
  rdmarpc::ChannelOptions options;
};

struct Outcome {
  int exit_code = 0;
  long ok = 0, failed = 0;
  std::vector<double> latencies_us;
};

std::string MessageText(const Config& cfg, long i) {
  return cfg.count == 1 ? cfg.message : cfg.message + " #" + std::to_string(i + 1);
}

boost::asio::awaitable<void> Worker(demo::Echo::Stub& stub, const Config& cfg, long& next,
                                    Outcome& out) {
  demo::SayRequest req;
  req.set_payload(std::string(cfg.payload_bytes, 'x'));
  while (next < cfg.count && !(cfg.stop_on_error && out.failed > 0)) {
    const long i = next++;
    req.set_message(MessageText(cfg, i));
    auto t0 = std::chrono::steady_clock::now();
    auto r = co_await stub.Say(req, {.timeout = std::chrono::milliseconds(cfg.timeout_ms)});
    auto t1 = std::chrono::steady_clock::now();
    out.latencies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (!r.ok()) {
      ++out.failed;
      out.exit_code = 1;
      std::cout << "call " << i + 1 << " failed: " << r.status().ToString() << std::endl;
      continue;
    }
    if (r->message() != req.message() || r->payload() != req.payload()) {
      ++out.failed;
      out.exit_code = 1;
      std::cout << "call " << i + 1 << ": reply does not match the request" << std::endl;
      continue;
    }
    ++out.ok;
    if (!cfg.quiet) {
      std::cout << "sent \"" << req.message() << "\" -> got \"" << r->message() << "\" from "
                << rdmarpc::EscapeForDisplay(r->served_by()) << " in "
                << static_cast<long>(out.latencies_us.back()) << " us" << std::endl;
    }
  }
}

// --chat: one stream; a writer coroutine sends every message while this one reads the echoes.
// Latency per message is from its Write to its echo.
boost::asio::awaitable<void> Chat(demo::Echo::Stub& stub, const Config& cfg, Outcome& out) {
  using Call = rdmarpc::ClientReaderWriter<demo::SayRequest, demo::SayReply>;
  rdmarpc::CallOptions options;
  options.timeout = std::chrono::milliseconds(cfg.timeout_ms);
  auto call = std::make_shared<Call>(co_await stub.Chat(options));
  auto sent_at = std::make_shared<std::vector<std::chrono::steady_clock::time_point>>();
  sent_at->reserve(static_cast<size_t>(cfg.count));
  boost::asio::co_spawn(
      co_await boost::asio::this_coro::executor,
      [](std::shared_ptr<Call> call, auto sent_at, Config cfg) -> boost::asio::awaitable<void> {
        demo::SayRequest req;
        req.set_payload(std::string(cfg.payload_bytes, 'x'));
        for (long i = 0; i < cfg.count; ++i) {
          req.set_message(MessageText(cfg, i));
          sent_at->push_back(std::chrono::steady_clock::now());
          if (!co_await call->Write(req)) break;  // the stream is over; Finish says why
        }
        co_await call->WritesDone();
      }(call, sent_at, cfg),
      boost::asio::detached);
  const std::string payload(cfg.payload_bytes, 'x');
  long i = 0;
  while (auto reply = co_await call->Read()) {
    const auto now = std::chrono::steady_clock::now();
    out.latencies_us.push_back(
        std::chrono::duration<double, std::micro>(now - (*sent_at)[i]).count());
    if (reply->message() != MessageText(cfg, i) || reply->payload() != payload) {
      ++out.failed;
      out.exit_code = 1;
      std::cout << "message " << i + 1 << ": echo does not match what was sent" << std::endl;
    } else {
      ++out.ok;
      if (!cfg.quiet) {
        std::cout << "sent \"" << MessageText(cfg, i) << "\" -> got \"" << reply->message()
                  << "\" from " << rdmarpc::EscapeForDisplay(reply->served_by()) << " on the stream"
                  << std::endl;
      }
    }
    ++i;
  }
  rdmarpc::Status status = co_await call->Finish();
  if (!status.ok() || i != cfg.count) {
    out.failed += cfg.count - out.ok - out.failed;
    out.exit_code = 1;
    std::cout << "stream ended after " << i << " of " << cfg.count
              << " echoes: " << status.ToString() << std::endl;
  }
}

boost::asio::awaitable<void> Main(const Config& cfg, Outcome& out) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg.connect_retry_ms);
  auto channel = co_await rdmarpc::Channel::Connect(cfg.target, cfg.options);
  while (!channel.ok() && std::chrono::steady_clock::now() < deadline) {
    boost::asio::steady_timer t(co_await boost::asio::this_coro::executor,
                                std::chrono::milliseconds(100));
    co_await t.async_wait(boost::asio::use_awaitable);
    channel = co_await rdmarpc::Channel::Connect(cfg.target, cfg.options);
  }
  if (!channel.ok()) {
    std::cerr << "echo_client: cannot connect to " << cfg.target << ": "
              << rdmarpc::EscapeForDisplay(channel.status().message()) << std::endl;
    out.exit_code = 3;
    co_return;
  }
  demo::Echo::Stub stub(*channel);
  if (cfg.chat) {
    co_await Chat(stub, cfg, out);
    co_return;
  }
  long next = 0;
  // `concurrency` workers share one connection; each keeps one call in flight.
  auto ex = co_await boost::asio::this_coro::executor;
  long running = cfg.concurrency;
  boost::asio::steady_timer all_done(ex, std::chrono::steady_clock::time_point::max());
  for (long w = 0; w < cfg.concurrency; ++w) {
    boost::asio::co_spawn(ex, Worker(stub, cfg, next, out), [&](std::exception_ptr) {
      if (--running == 0) all_done.cancel();
    });
  }
  co_await all_done.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
}

}  // namespace

int main(int argc, char** argv) {
  rdmarpc::cmdline::Flags flags(argc, argv,
                                rdmarpc::cmdline::WithPollingFlags({{"target", true},
                                                                    {"message", true},
                                                                    {"count", true},
                                                                    {"concurrency", true},
                                                                    {"payload-bytes", true},
                                                                    {"timeout-ms", true},
                                                                    {"connect-retry-ms", true},
                                                                    {"quiet", false},
                                                                    {"chat", false},
                                                                    {"log-level", true},
                                                                    {"auth-secret-file", true},
                                                                    {"keepalive-ms", true},
                                                                    {"keepalive-timeout-ms", true},
                                                                    {"stop-on-error", false},
                                                                    {"help", false}}));
  if (flags.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  Config cfg;
  cfg.target = flags.get("target", "tcp://127.0.0.1:7471");
  cfg.message = flags.get("message", "hello");
  cfg.count = flags.get_int("count", 1, 1, 1000000000);
  cfg.concurrency = flags.get_int("concurrency", 1, 1, 100000);
  cfg.payload_bytes = flags.get_int("payload-bytes", 0, 0, 64 << 20);
  cfg.timeout_ms = flags.get_int("timeout-ms", 5000, 0, 86400000);
  cfg.connect_retry_ms = flags.get_int("connect-retry-ms", 0, 0, 600000);
  cfg.quiet = flags.has("quiet");
  cfg.stop_on_error = flags.has("stop-on-error");
  cfg.chat = flags.has("chat");
  cfg.options.keepalive_interval =
      std::chrono::milliseconds(flags.get_int("keepalive-ms", 0, 0, 86400000));
  cfg.options.keepalive_timeout =
      std::chrono::milliseconds(flags.get_int("keepalive-timeout-ms", 5000, 1, 86400000));
  rdmarpc::cmdline::ApplyPollingFlags(flags, cfg.options.transport);
  cfg.options.transport.auth_secret = flags.auth_secret();
  if (!flags.error().empty()) {
    std::cerr << "echo_client: " << flags.error() << "\n(see echo_client --help)\n";
    return 2;
  }
  if (!rdmarpc::InitLogging(flags.get("log-level", ""), "warn")) {
    std::cerr << "echo_client: " << rdmarpc::LogLevelError(flags.get("log-level", ""))
              << "\n(see echo_client --help)\n";
    return 2;
  }
  // One thread serves the channel: run with rdmarpc's own event loop (as ioc.run() would, with
  // less CPU per call; the kv sample runs its io_context with ioc.run(), which works too).
  boost::asio::io_context ioc(rdmarpc::kLoopConcurrencyHint);
  Outcome out;
  auto t0 = std::chrono::steady_clock::now();
  boost::asio::co_spawn(ioc, Main(cfg, out), boost::asio::detached);
  rdmarpc::RunLoop(ioc);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (out.exit_code == 3) return 3;
  auto& lat = out.latencies_us;
  std::sort(lat.begin(), lat.end());
  double p50 = lat.empty() ? 0 : lat[lat.size() / 2];
  double p99 = lat.empty() ? 0 : lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  std::printf(
      "echo_client: %ld ok, %ld failed in %.3f s (%.0f %s/s); latency p50 %.1f us, p99 %.1f "
      "us\n",
      out.ok, out.failed, secs, out.ok / secs, cfg.chat ? "messages" : "calls", p50, p99);
  return out.exit_code;
}

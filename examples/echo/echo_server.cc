// echo_server: serves demo.Echo. Runs until SIGINT/SIGTERM, then drains in-flight calls.
//
//   echo_server --listen tcp://127.0.0.1:7471 [--listen rdma://0.0.0.0:7471] [--threads 2]
//
// Exit codes: 0 clean shutdown, 1 could not listen, 2 bad arguments.
#include <cstdio>
#include <iostream>

#include "proto/echo.rdmarpc.pb.h"
#include "rpc/health.h"
#include "rpc/rdmarpc.h"
#include "rpc/reflection.h"
#include "tools/common/flags.h"
#include "tools/common/polling_flags.h"
#include "tools/common/server_flags.h"

namespace {

constexpr char kUsage[] =
    "usage: echo_server [--listen URI]... [--threads N] [--busy-poll] [--poll-spin-us US]\n"
    "                   [--auth-secret-file F] [--log-level LEVEL] [limits, below]\n"
    "\n"
    "Serves demo.Echo (proto/echo.proto) until SIGINT or SIGTERM, then drains in-flight calls.\n"
    "\n"
    "  --listen URI       address to serve on; repeatable (default tcp://127.0.0.1:7471).\n"
    "                     tcp://HOST:PORT or rdma://HOST:PORT; port 0 picks a free port.\n"
    "  --threads N        I/O threads (default 1)\n"
    "  --busy-poll        rdma: spin on the completion queues (lowest latency; keeps one core\n"
    "                     per I/O thread busy; also RDMARPC_BUSY_POLL=1)\n"
    "  --poll-spin-us US  rdma: after traffic, keep polling this long before sleeping on the\n"
    "                     completion channel (default 200, or RDMARPC_POLL_SPIN_US; 0 = sleep\n"
    "                     at once: least CPU, a wake-up per message)\n"
    "  --auth-secret-file F  refuse clients that do not present the secret in file F\n"
    "  --log-level LEVEL  trace|debug|info|warn|error|off (default $RDMARPC_LOG_LEVEL or info)\n"
    "  --help, -h         this text\n"
    "\n"
    "%LIMITS%"
    "\n"
    "Prints 'listening on URI' for each address once it accepts connections.\n"
    "Exit codes: 0 clean shutdown, 1 could not listen, 2 bad arguments.\n";

std::string Usage() {
  std::string u = kUsage;
  u.replace(u.find("%LIMITS%"), 8, rdmarpc::cmdline::kServerFlagsUsage);
  return u;
}

class EchoService final : public demo::Echo::Service {
 public:
  boost::asio::awaitable<rdmarpc::Status> Say(rdmarpc::ServerContext&,
                                              const demo::SayRequest& request,
                                              demo::SayReply& reply) override {
    reply.set_message(request.message());
    reply.set_payload(request.payload());
    reply.set_served_by(served_by_);
    co_return rdmarpc::Status();
  }
  boost::asio::awaitable<rdmarpc::Status> Chat(
      rdmarpc::ServerContext& context,
      rdmarpc::ServerReaderWriter<demo::SayRequest, demo::SayReply>& stream) override {
    demo::SayReply reply;
    reply.set_served_by(served_by_);
    while (auto request = co_await stream.Read()) {
      reply.set_message(std::move(*request->mutable_message()));
      reply.set_payload(std::move(*request->mutable_payload()));
      // False: the caller is gone or cancelled; the Status below goes nowhere.
      if (!co_await stream.Write(reply)) break;
    }
    if (context.cancelled()) co_return rdmarpc::Status(rdmarpc::StatusCode::kCancelled, "");
    co_return rdmarpc::Status();
  }
  std::string served_by_;
};

}  // namespace

int main(int argc, char** argv) {
  rdmarpc::cmdline::Flags flags(argc, argv,
                                rdmarpc::cmdline::WithServerFlags(
                                    rdmarpc::cmdline::WithPollingFlags({{"listen", true},
                                                                        {"threads", true},
                                                                        {"log-level", true},
                                                                        {"auth-secret-file", true},
                                                                        {"help", false}})));
  if (flags.has("help")) {
    std::cout << Usage();
    return 0;
  }
  const long threads = flags.get_int("threads", 1, 1, 256);
  const std::string secret = flags.auth_secret();
  rdmarpc::ServerOptions options{.io_threads = static_cast<int>(threads), .handle_signals = true};
  const auto metrics = rdmarpc::cmdline::ApplyServerFlags(flags, options);
  rdmarpc::cmdline::ApplyPollingFlags(flags, options.transport);
  if (!flags.error().empty()) {
    std::cerr << "echo_server: " << flags.error() << "\n(see echo_server --help)\n";
    return 2;
  }
  if (!rdmarpc::InitLogging(flags.get("log-level", ""))) {
    std::cerr << "echo_server: " << rdmarpc::LogLevelError(flags.get("log-level", ""))
              << "\n(see echo_server --help)\n";
    return 2;
  }
  std::vector<std::string> uris = flags.all("listen");
  if (uris.empty()) uris.push_back("tcp://127.0.0.1:7471");

  EchoService service;
  rdmarpc::cmdline::RaiseFileLimit();
  options.transport.auth_secret = secret;
  // The built-in health service (`rdmarpc health TARGET [demo.Echo]`), NOT_SERVING from SIGTERM.
  // Declared before the server, which must not outlive it.
  rdmarpc::HealthService health;
  // And reflection: `rdmarpc list`, `describe` and `call` work without the .proto files.
  rdmarpc::ReflectionService reflection;
  rdmarpc::Server server(options);
  if (auto s = server.AddService(service);
      !s.ok() || !(s = health.Attach(server)).ok() || !(s = reflection.Attach(server)).ok()) {
    std::cerr << "echo_server: " << s.ToString() << "\n";
    return 1;
  }
  health.SetServing("demo.Echo", true);
  const int code = rdmarpc::cmdline::ListenAndRun(server, uris, flags, metrics, "echo_server",
                                                  [&](const std::string& bound) {
                                                    if (service.served_by_.empty())
                                                      service.served_by_ = bound;
                                                  });
  if (code != 0) return code;
  std::cout << "echo_server: shut down cleanly" << std::endl;
  return 0;
}

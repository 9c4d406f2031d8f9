// echo_server: serves demo.Echo. Runs until SIGINT/SIGTERM, then drains in-flight calls.
//
//   echo_server --listen tcp://127.0.0.1:7471 [--listen rdma://0.0.0.0:7471] [--threads 2]
//
// Exit codes: 0 clean shutdown, 1 could not listen, 2 bad arguments.
#include <cstdio>
#include <iostream>

#include "proto/echo.rdmarpc.pb.h"
#include "rpc/rdmarpc.h"
#include "tools/common/flags.h"
#include "tools/common/server_flags.h"

namespace {

constexpr char kUsage[] =
    "usage: echo_server [--listen URI]... [--threads N] [--busy-poll] [--poll-spin-us US]\n"
    "                   [--auth-secret-file F] [--log-level LEVEL] [limits, below]\n"
    "\n"
    "Serves demo.Echo (proto/echo.proto) until SIGINT or SIGTERM, then drains in-flight calls.\n"
    "Default address tcp://127.0.0.1:7471, one I/O thread.\n"
    "\n"
    "%COMMON%"
    "\n"
    "%LIMITS%"
    "\n"
    "Prints 'listening on URI' for each address once it accepts connections.\n"
    "Exit codes: 0 clean shutdown, 1 could not listen, 2 bad arguments.\n";

std::string Usage() {
  std::string u = kUsage;
  u.replace(u.find("%COMMON%"), 8, rdmarpc::cmdline::kServerHarnessUsage);
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
  namespace cmdline = rdmarpc::cmdline;
  cmdline::Flags flags(argc, argv, cmdline::WithServerHarnessFlags({}));
  if (flags.has("help")) {
    std::cout << Usage();
    return 0;
  }
  cmdline::ServerSetup setup;
  if (int code = cmdline::SetUpServer(flags, "echo_server", 1, "tcp://127.0.0.1:7471", setup)) {
    return code;
  }
  EchoService service;
  cmdline::BuiltinServices builtins;  // before the server, which must not outlive it
  rdmarpc::Server server(setup.options);
  if (!builtins.AddTo(server, service, "demo.Echo", "echo_server")) return 1;
  const int code = cmdline::ListenAndRun(server, setup.uris, flags, setup.metrics, "echo_server",
                                         [&](const std::string& bound) {
                                           if (service.served_by_.empty())
                                             service.served_by_ = bound;
                                         });
  if (code != 0) return code;
  std::cout << "echo_server: shut down cleanly" << std::endl;
  return 0;
}

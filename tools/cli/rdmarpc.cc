// rdmarpc: poke a running rdmarpc server from the command line.
//
//   rdmarpc health TARGET [SERVICE]     is the server (or SERVICE) serving? (exit 0 if so)
//
// TARGET is tcp://HOST:PORT or rdma://HOST:PORT. The server must have attached the built-in
// health service (rdmarpc::HealthService, rpc/health.h); the sample servers do.
#include "rpc/rdmarpc.h"

#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "rpc/health.rdmarpc.pb.h"
#include "rpc/logging.h"
#include "rpc/secret_file.h"

namespace po = boost::program_options;

namespace {

constexpr char kUsage[] =
    "usage: rdmarpc health TARGET [SERVICE] [options]\n"
    "       rdmarpc --help\n"
    "\n"
    "Commands:\n"
    "  health TARGET [SERVICE]  ask TARGET's health service whether the server (or SERVICE,\n"
    "                           e.g. demo.Echo) is serving; prints SERVING or NOT_SERVING\n"
    "\n"
    "TARGET: tcp://HOST:PORT or rdma://HOST:PORT.\n"
    "Exit codes: 0 serving, 1 not serving (or the call failed: its status is printed),\n"
    "2 bad arguments, 3 could not connect, 4 the server has no such service (NOT_FOUND)\n"
    "or no health service (UNIMPLEMENTED).\n";

int Health(const std::string& target, const std::string& service,
           const rdmarpc::ChannelOptions& options, long timeout_ms) {
  auto channel = rdmarpc::Channel::ConnectBlocking(target, options);
  if (!channel.ok()) {
    std::cerr << "rdmarpc: cannot connect to " << target << ": " << channel.status().message()
              << "\n";
    return 3;
  }
  rdmarpc::health::v1::Health::BlockingStub stub(*channel);
  rdmarpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  rdmarpc::CallOptions call;
  call.timeout = std::chrono::milliseconds(timeout_ms);
  auto r = stub.Check(req, call);
  if (!r.ok()) {
    std::cerr << "rdmarpc: " << r.status().ToString() << "\n";
    const auto code = r.status().code();
    return code == rdmarpc::StatusCode::kNotFound || code == rdmarpc::StatusCode::kUnimplemented
               ? 4
               : 1;
  }
  const bool serving = r->status() == rdmarpc::health::v1::HealthCheckResponse::SERVING;
  std::cout << rdmarpc::health::v1::HealthCheckResponse::ServingStatus_Name(r->status()) << "\n";
  return serving ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description named("options");
  named.add_options()("help,h", "print usage")("timeout-ms", po::value<long>()->default_value(5000),
                                               "per-call deadline in ms")(
      "auth-secret-file", po::value<std::string>(), "present the secret in this file")(
      "log-level", po::value<std::string>()->default_value(""),
      "trace|debug|info|warn|error|off (default $RDMARPC_LOG_LEVEL or warn)");
  po::options_description all;
  all.add(named).add_options()("args", po::value<std::vector<std::string>>(), "");
  po::positional_options_description pos;
  pos.add("args", -1);
  po::variables_map vm;
  std::vector<std::string> args;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
    if (vm.count("args")) args = vm["args"].as<std::vector<std::string>>();
  } catch (const po::error& e) {
    std::cerr << "rdmarpc: " << e.what() << "\n(see rdmarpc --help)\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << named;
    return 0;
  }
  std::string bad;
  if (args.empty())
    bad = "no command given";
  else if (args[0] != "health")
    bad = "unknown command '" + args[0] + "'";
  else if (args.size() < 2 || args.size() > 3)
    bad = "health takes TARGET and at most one SERVICE";
  const long timeout_ms = vm["timeout-ms"].as<long>();
  if (bad.empty() && (timeout_ms < 0 || timeout_ms > 86400000)) {
    bad = "--timeout-ms must be between 0 and 86400000";
  }
  rdmarpc::ChannelOptions options;
  options.reconnect = false;  // one question, one connection
  if (bad.empty() && vm.count("auth-secret-file")) {
    const std::string path = vm["auth-secret-file"].as<std::string>();
    options.transport.auth_secret =
        rdmarpc::ReadSecretFile(path, "--auth-secret-file " + path, &bad);
  }
  if (bad.empty() && !rdmarpc::InitLogging(vm["log-level"].as<std::string>(), "warn")) {
    bad = rdmarpc::LogLevelError(vm["log-level"].as<std::string>());
  }
  if (!bad.empty()) {
    std::cerr << "rdmarpc: " << bad << "\n(see rdmarpc --help)\n";
    return 2;
  }
  return Health(args[1], args.size() > 2 ? args[2] : "", options, timeout_ms);
}

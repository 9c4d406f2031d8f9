// rdmarpc: poke a running rdmarpc server from the command line.
//
//   rdmarpc health TARGET [SERVICE]            is the server (or SERVICE) serving? (exit 0 if so)
//   rdmarpc list TARGET                        the services it hosts
//   rdmarpc describe TARGET SYMBOL             a service, method or message, as .proto text
//   rdmarpc call TARGET SERVICE/METHOD [JSON]  one call; the request as JSON (or on stdin), the
//                                              reply printed as JSON; streams as JSON Lines
//
// TARGET is tcp://HOST:PORT or rdma://HOST:PORT. `health` needs the server's built-in health
// service (rpc/health.h), the others its reflection service (rpc/reflection.h); the sample
// servers attach both.
#include "rpc/rdmarpc.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/util/json_util.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rpc/health.rdmarpc.pb.h"
#include "rpc/logging.h"
#include "rpc/method_id.h"
#include "rpc/reflection.rdmarpc.pb.h"
#include "rpc/secret_file.h"

namespace po = boost::program_options;

namespace {

constexpr char kUsage[] =
    "usage: rdmarpc health TARGET [SERVICE] [options]\n"
    "       rdmarpc list TARGET [options]\n"
    "       rdmarpc describe TARGET SYMBOL [options]\n"
    "       rdmarpc call TARGET SERVICE/METHOD [JSON] [options]\n"
    "       rdmarpc --help\n"
    "\n"
    "Commands:\n"
    "  health TARGET [SERVICE]  ask TARGET's health service whether the server (or SERVICE,\n"
    "                           e.g. demo.Echo) is serving; prints SERVING or NOT_SERVING\n"
    "  list TARGET              the services TARGET hosts, one per line (reflection)\n"
    "  describe TARGET SYMBOL   a service (demo.Echo), method (demo.Echo.Say) or message\n"
    "                           (demo.SayRequest) as .proto text (reflection)\n"
    "  call TARGET SERVICE/METHOD [JSON]\n"
    "                           one call (demo.Echo/Say); the request in protobuf's JSON\n"
    "                           mapping, from JSON or, without it (or with -), from stdin;\n"
    "                           prints the reply as JSON (reflection). Streams: a client\n"
    "                           stream's requests are stdin's lines, one JSON object each\n"
    "                           (or the one JSON argument); a server stream's messages are\n"
    "                           printed one JSON object per line as they come\n"
    "\n"
    "TARGET: tcp://HOST:PORT or rdma://HOST:PORT.\n"
    "Exit codes: 0 OK (health: serving), 1 not serving or the call failed (its status is\n"
    "printed), 2 bad arguments (a request that is not valid JSON for the method included),\n"
    "3 could not connect, 4 the server has no such service, method or symbol, or lacks the\n"
    "health or reflection service.\n";

// Connects once, for one command (no reconnect).
rdmarpc::Result<std::shared_ptr<rdmarpc::Channel>> Connect(const std::string& target,
                                                           const rdmarpc::ChannelOptions& options) {
  auto channel = rdmarpc::Channel::ConnectBlocking(target, options);
  if (!channel.ok()) {
    std::cerr << "rdmarpc: cannot connect to " << target << ": "
              << rdmarpc::EscapeForDisplay(channel.status().message()) << "\n";
  }
  return channel;
}

// The exit code for a failed call: 4 when the server lacks what was asked for.
int FailedCall(const rdmarpc::Status& s) {
  std::cerr << "rdmarpc: " << s.ToString() << "\n";
  return s.code() == rdmarpc::StatusCode::kNotFound ||
                 s.code() == rdmarpc::StatusCode::kUnimplemented
             ? 4
             : 1;
}

// Writes `heading` as one line, then `text` line by line, each through EscapeForDisplay: what
// `describe` prints comes from the server (file names, for one, may be any string it likes).
void PrintLines(std::string_view heading, std::string_view text) {
  std::cout << rdmarpc::EscapeForDisplay(heading) << "\n";
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::cout << rdmarpc::EscapeForDisplay(text.substr(0, end)) << "\n";
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

// The server's definitions, fetched through its reflection service into a pool of our own.
class RemoteSchema {
 public:
  RemoteSchema(std::shared_ptr<rdmarpc::Channel> channel, rdmarpc::CallOptions call)
      : stub_(std::move(channel)), call_(std::move(call)) {}

  // Loads the file defining `symbol` (and its imports); OK or why not.
  rdmarpc::Status Load(const std::string& symbol) {
    rdmarpc::reflection::v1::FileContainingSymbolRequest req;
    req.set_symbol(symbol);
    auto r = stub_.FileContainingSymbol(req, call_);
    if (!r.ok()) return r.status();
    for (const std::string& bytes : r->file_descriptor_protos()) {
      google::protobuf::FileDescriptorProto file;
      if (!file.ParseFromString(bytes)) {
        return rdmarpc::Status(rdmarpc::StatusCode::kInternal,
                               "the server sent a file descriptor that does not parse");
      }
      if (pool_.FindFileByName(file.name()) != nullptr) continue;
      if (pool_.BuildFile(file) == nullptr) {
        return rdmarpc::Status(rdmarpc::StatusCode::kInternal,
                               "the server's definition of " + file.name() + " does not build");
      }
    }
    return rdmarpc::Status();
  }
  const google::protobuf::DescriptorPool& pool() const { return pool_; }
  rdmarpc::reflection::v1::Reflection::BlockingStub& stub() { return stub_; }

 private:
  google::protobuf::DescriptorPool pool_;
  rdmarpc::reflection::v1::Reflection::BlockingStub stub_;
  rdmarpc::CallOptions call_;
};

int List(const std::string& target, const rdmarpc::ChannelOptions& options,
         const rdmarpc::CallOptions& call) {
  auto channel = Connect(target, options);
  if (!channel.ok()) return 3;
  rdmarpc::reflection::v1::Reflection::BlockingStub stub(*channel);
  auto r = stub.ListServices(rdmarpc::reflection::v1::ListServicesRequest(), call);
  if (!r.ok()) return FailedCall(r.status());
  for (const std::string& s : r->services()) std::cout << rdmarpc::EscapeForDisplay(s) << "\n";
  return 0;
}

int Describe(const std::string& target, const std::string& symbol,
             const rdmarpc::ChannelOptions& options, const rdmarpc::CallOptions& call) {
  auto channel = Connect(target, options);
  if (!channel.ok()) return 3;
  RemoteSchema schema(*channel, call);
  if (rdmarpc::Status s = schema.Load(symbol); !s.ok()) return FailedCall(s);
  const auto& pool = schema.pool();
  if (auto* d = pool.FindServiceByName(symbol)) {
    PrintLines("// " + d->file()->name(), d->DebugString());
  } else if (auto* m = pool.FindMethodByName(symbol)) {
    PrintLines("// " + m->service()->full_name() + " in " + m->file()->name(), m->DebugString());
  } else if (auto* t = pool.FindMessageTypeByName(symbol)) {
    PrintLines("// " + t->file()->name(), t->DebugString());
  } else if (auto* e = pool.FindEnumTypeByName(symbol)) {
    PrintLines("// " + e->file()->name(), e->DebugString());
  } else {
    std::cerr << "rdmarpc: " << symbol << " is not a service, method, message or enum\n";
    return 4;
  }
  return 0;
}

int Call(const std::string& target, std::string method_name, std::string json,
         bool json_is_argument, const rdmarpc::ChannelOptions& options,
         const rdmarpc::CallOptions& call) {
  // "pkg.Service/Method" (as on the wire) or "pkg.Service.Method" (the protobuf symbol).
  std::string symbol = method_name;
  if (auto slash = symbol.rfind('/'); slash != std::string::npos) symbol[slash] = '.';
  if (!symbol.empty() && symbol[0] == '.') symbol.erase(0, 1);
  auto channel = Connect(target, options);
  if (!channel.ok()) return 3;
  RemoteSchema schema(*channel, call);
  if (rdmarpc::Status s = schema.Load(symbol); !s.ok()) return FailedCall(s);
  const google::protobuf::MethodDescriptor* m = schema.pool().FindMethodByName(symbol);
  if (m == nullptr) {
    std::cerr << "rdmarpc: " << method_name << " is not a method of the server\n";
    return 4;
  }
  google::protobuf::DynamicMessageFactory factory(&schema.pool());
  const google::protobuf::Message* request_type = factory.GetPrototype(m->input_type());
  const google::protobuf::Message* reply_type = factory.GetPrototype(m->output_type());
  // The requests: one JSON object; for a client stream, one per line of stdin (JSON Lines).
  std::vector<std::string> texts;
  if (m->client_streaming() && !json_is_argument) {
    std::istringstream lines(json);
    for (std::string line; std::getline(lines, line);) {
      if (line.find_first_not_of(" \t\r") != std::string::npos) texts.push_back(line);
    }
  } else {
    texts.push_back(json);
  }
  std::vector<std::unique_ptr<google::protobuf::Message>> requests;
  for (const std::string& text : texts) {
    requests.emplace_back(request_type->New());
    if (auto st = google::protobuf::util::JsonStringToMessage(text, requests.back().get());
        !st.ok()) {
      std::cerr << "rdmarpc: request " << requests.size() << " is not a "
                << m->input_type()->full_name() << " in JSON: " << st.ToString() << "\n";
      return 2;
    }
  }
  // Unary replies and a client stream's reply are printed indented; stream messages one per line.
  auto print = [](const google::protobuf::Message& message, bool indent) {
    std::string out;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = indent;
    options.preserve_proto_field_names = true;
    if (auto st = google::protobuf::util::MessageToJsonString(message, &out, options); !st.ok()) {
      std::cerr << "rdmarpc: a reply cannot be printed as JSON: "
                << rdmarpc::EscapeForDisplay(st.ToString()) << "\n";
      return false;
    }
    std::cout << out << (indent ? "" : "\n") << std::flush;
    return true;
  };
  const std::string wire = "/" + m->service()->full_name() + "/" + m->name();
  const auto kind = static_cast<rdmarpc::MethodKind>((m->client_streaming() ? 1 : 0) |
                                                     (m->server_streaming() ? 2 : 0));
  const rdmarpc::MethodInfo info{wire, rdmarpc::MethodId(wire), kind};
  auto& ch = *channel;
  std::unique_ptr<google::protobuf::Message> reply(reply_type->New());
  if (kind == rdmarpc::MethodKind::kUnary) {
    rdmarpc::Status s = ch->Run(ch->Call(info, *requests[0], *reply, call));
    if (!s.ok()) return FailedCall(s);
    return print(*reply, true) ? 0 : 1;
  }
  rdmarpc::GenericClientStream stream(m->client_streaming()
                                          ? ch->Run(ch->OpenStream(info, call))
                                          : ch->Run(ch->OpenStream(info, *requests[0], call)));
  // The server's messages are read (and printed) while the requests are written: a peer that
  // answers as it reads would otherwise fill both windows and wait for ever.
  bool printed_all = true;
  std::thread reader;
  if (m->server_streaming()) {
    reader = std::thread([&] {
      std::unique_ptr<google::protobuf::Message> message(reply_type->New());
      while (ch->Run(stream.Read(*message))) {
        printed_all = print(*message, false) && printed_all;
        message->Clear();
      }
    });
  }
  if (m->client_streaming()) {
    for (const auto& r : requests) {
      if (!ch->Run(stream.Write(*r))) break;  // the call is over: Finish says why
    }
    ch->Run(stream.WritesDone());
  }
  if (reader.joinable()) reader.join();
  rdmarpc::Status s =
      ch->Run(stream.Finish(kind == rdmarpc::MethodKind::kClientStreaming ? reply.get() : nullptr));
  if (!s.ok()) return FailedCall(s);
  if (kind == rdmarpc::MethodKind::kClientStreaming && !print(*reply, true)) return 1;
  return printed_all ? 0 : 1;
}

int Health(const std::string& target, const std::string& service,
           const rdmarpc::ChannelOptions& options, const rdmarpc::CallOptions& call) {
  auto channel = Connect(target, options);
  if (!channel.ok()) return 3;
  rdmarpc::health::v1::Health::BlockingStub stub(*channel);
  rdmarpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  auto r = stub.Check(req, call);
  if (!r.ok()) return FailedCall(r.status());
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
      "metadata", po::value<std::vector<std::string>>(),
      "KEY=VALUE sent with the call (call; repeatable)")(
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
  const std::string command = args.empty() ? "" : args[0];
  if (args.empty())
    bad = "no command given";
  else if (command != "health" && command != "list" && command != "describe" && command != "call")
    bad = "unknown command '" + command + "'";
  else if (command == "health" && (args.size() < 2 || args.size() > 3))
    bad = "health takes TARGET and at most one SERVICE";
  else if (command == "list" && args.size() != 2)
    bad = "list takes TARGET";
  else if (command == "describe" && args.size() != 3)
    bad = "describe takes TARGET and SYMBOL";
  else if (command == "call" && (args.size() < 3 || args.size() > 4))
    bad = "call takes TARGET, SERVICE/METHOD and at most one JSON request";
  rdmarpc::CallOptions call;
  if (bad.empty() && vm.count("metadata")) {
    for (const std::string& kv : vm["metadata"].as<std::vector<std::string>>()) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        bad = "--metadata wants KEY=VALUE, got '" + kv + "'";
        break;
      }
      call.metadata.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    }
  }
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
  call.timeout = std::chrono::milliseconds(timeout_ms);
  if (command == "list") return List(args[1], options, call);
  if (command == "describe") return Describe(args[1], args[2], options, call);
  if (command == "call") {
    std::string json;
    if (args.size() == 4 && args[3] != "-") {
      json = args[3];
    } else {
      json.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    }
    return Call(args[1], args[2], json, args.size() == 4 && args[3] != "-", options, call);
  }
  return Health(args[1], args.size() > 2 ? args[2] : "", options, call);
}

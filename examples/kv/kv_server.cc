// kv_server: serves kv.KV (proto/kv.proto) from an in-memory map or a RocksDB database.
//
//   kv_server --listen tcp://0.0.0.0:7480 [--listen rdma://0.0.0.0:7480] [--threads 4]
//             [--engine memory|rocksdb] [--data-dir DIR] [--sync] [--log-level info]
//
// SIGTERM/SIGINT: stop accepting, finish in-flight calls, flush the engine, exit 0.
// Exit codes: 0 clean shutdown, 1 could not start (listen, open the database), 2 bad arguments.
#include <iostream>

#include "examples/kv/engine.h"
#include "examples/kv/kv_service.h"
#include "rpc/health.h"
#include "rpc/logging.h"
#include "rpc/rdmarpc.h"
#include "rpc/reflection.h"
#include "tools/common/flags.h"
#include "tools/common/server_flags.h"

namespace {

constexpr char kUsage[] =
    "usage: kv_server [--listen URI]... [--threads N] [--engine memory|rocksdb]\n"
    "                 [--data-dir DIR] [--sync] [--auth-secret-file F] [--log-level LEVEL]\n"
    "                 [limits, below]\n"
    "\n"
    "Serves kv.KV (proto/kv.proto) until SIGINT or SIGTERM, then finishes in-flight calls,\n"
    "flushes the engine and exits.\n"
    "\n"
    "  --listen URI     address to serve on; repeatable (default tcp://127.0.0.1:7480).\n"
    "                   tcp://HOST:PORT or rdma://HOST:PORT; port 0 picks a free one.\n"
    "  --threads N      I/O threads (default 2).\n"
    "  --engine NAME    memory (default; data lives as long as the process) or rocksdb.\n"
    "  --data-dir DIR   RocksDB database folder (created if missing); implies --engine rocksdb.\n"
    "  --sync           rocksdb: fsync every write before acknowledging it (survives power\n"
    "                   loss). Without it, acknowledged writes survive the process being\n"
    "                   killed (SIGKILL included) but not a machine crash.\n"
    "  --auth-secret-file F  refuse clients that do not present the secret in file F.\n"
    "  --log-level L    trace, debug, info (default), warn, error, off.\n"
    "  --help, -h       this text.\n"
    "\n"
    "Prints 'listening on URI' for each address once it accepts connections.\n"
    "Exit codes: 0 clean shutdown, 1 could not start, 2 bad arguments.\n";

}  // namespace

int main(int argc, char** argv) {
  rdmarpc::cmdline::Flags flags(argc, argv,
                                rdmarpc::cmdline::WithServerFlags({{"listen", true},
                                                                   {"threads", true},
                                                                   {"engine", true},
                                                                   {"data-dir", true},
                                                                   {"sync", false},
                                                                   {"log-level", true},
                                                                   {"auth-secret-file", true},
                                                                   {"help", false}}));
  if (flags.has("help")) {
    std::string usage = kUsage;
    std::cout << usage << "\n" << rdmarpc::cmdline::kServerFlagsUsage;
    return 0;
  }
  const long threads = flags.get_int("threads", 2, 1, 256);
  rdmarpc::ServerOptions options{.io_threads = static_cast<int>(threads), .handle_signals = true};
  const auto metrics = rdmarpc::cmdline::ApplyServerFlags(flags, options);
  const std::string secret = flags.auth_secret();
  const std::string data_dir = flags.get("data-dir", "");
  const std::string engine_name = flags.get("engine", data_dir.empty() ? "memory" : "rocksdb");
  std::string bad = flags.error();
  if (bad.empty() && engine_name != "memory" && engine_name != "rocksdb") {
    bad = "unknown engine '" + engine_name + "' (memory or rocksdb)";
  }
  if (bad.empty() && engine_name == "rocksdb" && data_dir.empty()) {
    bad = "--engine rocksdb needs --data-dir";
  }
  if (bad.empty() && engine_name == "memory" && !data_dir.empty()) {
    bad = "--data-dir is for --engine rocksdb";
  }
  if (bad.empty() && engine_name == "memory" && flags.has("sync")) {
    bad = "--sync is for --engine rocksdb (the memory engine keeps nothing on disk)";
  }
  if (!bad.empty()) {
    std::cerr << "kv_server: " << bad << "\n(see kv_server --help)\n";
    return 2;
  }
  if (!rdmarpc::InitLogging(flags.get("log-level", ""))) {
    std::cerr << "kv_server: " << rdmarpc::LogLevelError(flags.get("log-level", ""))
              << "\n(see kv_server --help)\n";
    return 2;
  }

  std::unique_ptr<kv::Engine> engine;
  if (engine_name == "rocksdb") {
    auto e = kv::OpenRocksDbEngine(data_dir, flags.has("sync"));
    if (!e.ok()) {
      std::cerr << "kv_server: cannot open " << data_dir << ": " << e.status().message() << "\n";
      return 1;
    }
    engine = std::move(*e);
  } else {
    engine = kv::NewMemoryEngine();
  }

  kv::KvService service(*engine, data_dir);
  std::vector<std::string> uris = flags.all("listen");
  if (uris.empty()) uris.push_back("tcp://127.0.0.1:7480");
  {
    rdmarpc::cmdline::RaiseFileLimit();
    options.transport.auth_secret = secret;
    // The built-in health service (`rdmarpc health TARGET [kv.KV]`), NOT_SERVING from SIGTERM.
    // Declared before the server, which must not outlive it.
    rdmarpc::HealthService health;
    // And reflection: `rdmarpc list`, `describe` and `call` work without the .proto files.
    rdmarpc::ReflectionService reflection;
    rdmarpc::Server server(options);
    if (auto s = server.AddService(service);
        !s.ok() || !(s = health.Attach(server)).ok() || !(s = reflection.Attach(server)).ok()) {
      std::cerr << "kv_server: " << s.ToString() << "\n";
      return 1;
    }
    health.SetServing("kv.KV", true);
    // Until SIGINT/SIGTERM, then drains in-flight calls.
    if (int code = rdmarpc::cmdline::ListenAndRun(server, uris, flags, metrics, "kv_server");
        code != 0) {
      return code;
    }
  }
  if (auto s = engine->Flush(); !s.ok()) {
    std::cerr << "kv_server: flushing the engine failed: " << s.message() << "\n";
    return 1;
  }
  engine.reset();
  std::cout << "kv_server: shut down cleanly" << std::endl;
  return 0;
}

// kv_server: serves kv.KV (proto/kv.proto) from an in-memory map or a RocksDB database.
//
//   kv_server --listen tcp://0.0.0.0:7480 [--listen rdma://0.0.0.0:7480] [--threads 4]
//             [--engine memory|rocksdb] [--data-dir DIR] [--sync] [--max-store-bytes N]
//             [--log-level info]
//             [--busy-poll] [--poll-spin-us US] [limits: see --help]
//
// SIGTERM/SIGINT: stop accepting, finish in-flight calls, flush the engine, exit 0.
// Exit codes: 0 clean shutdown, 1 could not start (listen, open the database), 2 bad arguments.
#include <iostream>

#include "examples/kv/engine.h"
#include "examples/kv/kv_service.h"
#include "rpc/rdmarpc.h"
#include "tools/common/flags.h"
#include "tools/common/server_flags.h"

namespace {

constexpr char kUsage[] =
    "usage: kv_server [--listen URI]... [--threads N] [--engine memory|rocksdb]\n"
    "                 [--data-dir DIR] [--sync] [--max-store-bytes N] [--auth-secret-file F]\n"
    "                 [--log-level LEVEL]\n"
    "                 [--busy-poll] [--poll-spin-us US] [limits, below]\n"
    "\n"
    "Serves kv.KV (proto/kv.proto) until SIGINT or SIGTERM, then finishes in-flight calls,\n"
    "flushes the engine and exits. Default address tcp://127.0.0.1:7480, two I/O threads.\n"
    "\n"
    "  --engine NAME      memory (default; data lives as long as the process) or rocksdb.\n"
    "  --data-dir DIR     RocksDB database folder (created if missing); implies --engine\n"
    "                     rocksdb.\n"
    "  --sync             rocksdb: fsync every write before acknowledging it (survives power\n"
    "                     loss). Without it, acknowledged writes survive the process being\n"
    "                     killed (SIGKILL included) but not a machine crash.\n"
    "  --max-store-bytes N  keys and values held at most, either engine (each entry counted\n"
    "                     with 128 bytes of bookkeeping); a put past it fails with\n"
    "                     RESOURCE_EXHAUSTED (1073741824; 0 = no bound)\n"
    "%COMMON%"
    "\n"
    "%LIMITS%"
    "\n"
    "Prints 'listening on URI' for each address once it accepts connections.\n"
    "Exit codes: 0 clean shutdown, 1 could not start, 2 bad arguments.\n";

std::string Usage() {
  std::string u = kUsage;
  u.replace(u.find("%COMMON%"), 8, rdmarpc::cmdline::kServerHarnessUsage);
  u.replace(u.find("%LIMITS%"), 8, rdmarpc::cmdline::kServerFlagsUsage);
  return u;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cmdline = rdmarpc::cmdline;
  cmdline::Flags flags(
      argc, argv,
      cmdline::WithServerHarnessFlags(
          {{"engine", true}, {"data-dir", true}, {"sync", false}, {"max-store-bytes", true}}));
  if (flags.has("help")) {
    std::cout << Usage();
    return 0;
  }
  const std::string data_dir = flags.get("data-dir", "");
  const std::string engine_name = flags.get("engine", data_dir.empty() ? "memory" : "rocksdb");
  const uint64_t max_store_bytes =
      static_cast<uint64_t>(flags.get_int("max-store-bytes", 1L << 30, 0, 1L << 50));
  const auto check = [&]() -> std::string {
    if (engine_name != "memory" && engine_name != "rocksdb") {
      return "unknown engine '" + engine_name + "' (memory or rocksdb)";
    }
    if (engine_name == "rocksdb" && data_dir.empty()) return "--engine rocksdb needs --data-dir";
    if (engine_name == "memory" && !data_dir.empty()) return "--data-dir is for --engine rocksdb";
    if (engine_name == "memory" && flags.has("sync")) {
      return "--sync is for --engine rocksdb (the memory engine keeps nothing on disk)";
    }
    return "";
  };
  cmdline::ServerSetup setup;
  if (int code =
          cmdline::SetUpServer(flags, "kv_server", 2, "tcp://127.0.0.1:7480", setup, check)) {
    return code;
  }

  std::unique_ptr<kv::Engine> engine;
  if (engine_name == "rocksdb") {
    auto e = kv::OpenRocksDbEngine(data_dir, flags.has("sync"), max_store_bytes);
    if (!e.ok()) {
      std::cerr << "kv_server: cannot open " << data_dir << ": " << e.status().message() << "\n";
      return 1;
    }
    engine = std::move(*e);
  } else {
    engine = kv::NewMemoryEngine(max_store_bytes);
  }

  kv::KvService service(*engine, data_dir);
  {
    cmdline::BuiltinServices builtins;  // before the server, which must not outlive it
    rdmarpc::Server server(setup.options);
    if (!builtins.AddTo(server, service, "kv.KV", "kv_server")) return 1;
    // Until SIGINT/SIGTERM, then drains in-flight calls.
    if (int code = cmdline::ListenAndRun(server, setup.uris, flags, setup.metrics, "kv_server");
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

// The sample servers' shared harness: the flags every one takes (address, threads, log level,
// secret file, RDMA polling, limits, operations) and what they set; the built-in services; the
// listen-and-run loop. One place, so that echo_server and kv_server (and their usage texts)
// agree, and a new server is its service plus a few lines.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rpc/health.h"
#include "rpc/logging.h"
#include "rpc/metrics.h"
#include "rpc/metrics_http.h"
#include "rpc/reflection.h"
#include "rpc/server.h"
#include "tools/common/flags.h"
#include "tools/common/polling_flags.h"

namespace rdmarpc::cmdline {

// Merge into the map given to Flags.
inline std::map<std::string, bool> WithServerFlags(std::map<std::string, bool> known) {
  for (const char* name : {"max-connections", "max-connections-per-peer", "max-handshakes",
                           "max-concurrent-calls", "max-buffered-bytes", "max-buffered-bytes-total",
                           "stalled-message-timeout-ms", "idle-timeout-ms", "keepalive-ms",
                           "keepalive-timeout-ms", "shutdown-grace-ms", "metrics-listen"}) {
    known[name] = true;
  }
  known["access-log"] = false;
  return known;
}

inline constexpr char kServerFlagsUsage[] =
    "Limits (what one client can hold; defaults in parentheses):\n"
    "  --max-connections N       clients served at once; one more is turned away with\n"
    "                            RESOURCE_EXHAUSTED (0 = as many as descriptors allow)\n"
    "  --max-connections-per-peer N\n"
    "                            the same for the clients of one IP address (256; 0 = no\n"
    "                            limit: clients behind one NAT or proxy share an address)\n"
    "  --max-handshakes N        connections being set up at once (each holds a descriptor,\n"
    "                            and over rdma a pinned ring, until established); past it the\n"
    "                            oldest gives up, past twice it new ones are turned away\n"
    "                            (128; 0 = no bound)\n"
    "  --max-concurrent-calls N  calls one connection runs at once; clients queue beyond (1024)\n"
    "  --max-buffered-bytes N    requests held plus replies a client has not read; over it the\n"
    "                            server stops reading from that client (16777216)\n"
    "  --max-buffered-bytes-total N  the same for all clients together; over it, clients\n"
    "                            holding more than their share are not read (1073741824)\n"
    "  --stalled-message-timeout-ms N  while clients wait for room for large messages, close\n"
    "                            one whose large message stops arriving this long (10000;\n"
    "                            0 = never)\n"
    "  --idle-timeout-ms N       close a connection without calls for this long; clients\n"
    "                            reconnect when needed (300000; 0 = never)\n"
    "  --keepalive-ms N          ping a client silent this long (0 = off) ...\n"
    "  --keepalive-timeout-ms N  ... and close it when nothing arrives within N ms (5000)\n"
    "Operations:\n"
    "  --access-log              log one line per call: peer, method, status, duration\n"
    "                            (level info: rdmarpc::AccessLogInterceptor)\n"
    "  --metrics-listen HOST:PORT  serve Prometheus metrics at http://HOST:PORT/metrics\n"
    "                            (per method, server and transport; docs/METRICS.md). No\n"
    "                            authentication: use a loopback or management address\n"
    "Shutdown (SIGTERM/SIGINT):\n"
    "  --shutdown-grace-ms N     health turns NOT_SERVING at once; keep serving N ms more\n"
    "                            before GOAWAY and drain, so load balancers move away (0)\n";

// Sets the limits the flags name; a bad value sets flags.error(). With --metrics-listen, puts a
// Metrics registry's interceptor first in o.interceptors (so it also times the others) and
// returns the registry for ListenAndRun; null otherwise.
inline std::shared_ptr<Metrics> ApplyServerFlags(Flags& flags, ServerOptions& o) {
  o.max_connections =
      static_cast<uint32_t>(flags.get_int("max-connections", o.max_connections, 0, 10000000));
  o.max_connections_per_peer = static_cast<uint32_t>(
      flags.get_int("max-connections-per-peer", o.max_connections_per_peer, 0, 10000000));
  o.transport.max_handshakes =
      static_cast<int>(flags.get_int("max-handshakes", o.transport.max_handshakes, 0, 1000000));
  o.max_concurrent_calls_per_connection = static_cast<uint32_t>(
      flags.get_int("max-concurrent-calls", o.max_concurrent_calls_per_connection, 0, 10000000));
  o.max_buffered_bytes_per_connection = static_cast<size_t>(flags.get_int(
      "max-buffered-bytes", static_cast<long>(o.max_buffered_bytes_per_connection), 0, 1L << 40));
  o.max_buffered_bytes = static_cast<size_t>(flags.get_int(
      "max-buffered-bytes-total", static_cast<long>(o.max_buffered_bytes), 0, 1L << 44));
  o.stalled_message_timeout = std::chrono::milliseconds(
      flags.get_int("stalled-message-timeout-ms", o.stalled_message_timeout.count(), 0, 86400000L));
  o.idle_timeout = std::chrono::milliseconds(
      flags.get_int("idle-timeout-ms", o.idle_timeout.count(), 0, 86400000L * 365));
  o.keepalive_interval = std::chrono::milliseconds(
      flags.get_int("keepalive-ms", o.keepalive_interval.count(), 0, 86400000L));
  o.keepalive_timeout = std::chrono::milliseconds(
      flags.get_int("keepalive-timeout-ms", o.keepalive_timeout.count(), 1, 86400000L));
  o.shutdown_grace = std::chrono::milliseconds(
      flags.get_int("shutdown-grace-ms", o.shutdown_grace.count(), 0, 3600000L));
  if (flags.has("access-log")) o.interceptors.push_back(std::make_shared<AccessLogInterceptor>());
  if (!flags.has("metrics-listen")) return nullptr;
  auto metrics = std::make_shared<Metrics>();
  o.interceptors.insert(o.interceptors.begin(), metrics->server_interceptor());
  return metrics;
}

inline long RaiseFileLimit();

// Everything the common flags decided, for the program to build its server from.
struct ServerSetup {
  // In: the log level when neither --log-level nor $RDMARPC_LOG_LEVEL names one.
  std::string log_level_fallback = "info";
  // Out:
  ServerOptions options;             // threads, limits, polling, secret, interceptors
  std::shared_ptr<Metrics> metrics;  // with --metrics-listen; null otherwise
  std::vector<std::string> uris;     // --listen, or the program's default address
};

// Merge into the map given to Flags: the program's own flags plus every flag SetUpServer reads
// (--listen, --threads, --log-level, --auth-secret-file, --help, the polling flags and the
// limits above).
inline std::map<std::string, bool> WithServerHarnessFlags(std::map<std::string, bool> own) {
  for (const char* name : {"listen", "threads", "log-level", "auth-secret-file"}) own[name] = true;
  own["help"] = false;
  return WithServerFlags(WithPollingFlags(std::move(own)));
}

inline constexpr char kServerHarnessUsage[] =
    "  --listen URI       address to serve on; repeatable. tcp://HOST:PORT or\n"
    "                     rdma://HOST:PORT; port 0 picks a free one.\n"
    "  --threads N        I/O threads\n"
    "  --busy-poll        rdma: spin on the completion queues (lowest latency; keeps one core\n"
    "                     per I/O thread busy; also RDMARPC_BUSY_POLL=1)\n"
    "  --poll-spin-us US  rdma: after traffic, keep polling this long before sleeping on the\n"
    "                     completion channel (default 200, or RDMARPC_POLL_SPIN_US; 0 = sleep\n"
    "                     at once: least CPU, a wake-up per message)\n"
    "  --auth-secret-file F  refuse clients that do not present the secret in file F\n"
    "  --log-level LEVEL  trace|debug|info|warn|error|off (default $RDMARPC_LOG_LEVEL or info)\n"
    "  --help, -h         this text\n";

// Reads the common flags into `setup` (`default_threads` and `default_listen` when absent),
// runs the program's own `check` (returns "" or what is wrong), starts logging at --log-level
// and raises the open-file limit. Returns 0 to go on; otherwise prints
// "PROGRAM: what is wrong\n(see PROGRAM --help)" and returns 2, the samples' exit code for bad
// arguments. Signals: the server it configures handles SIGINT/SIGTERM (graceful shutdown).
inline int SetUpServer(Flags& flags, const char* program, long default_threads,
                       std::string default_listen, ServerSetup& setup,
                       const std::function<std::string()>& check = {}) {
  ServerOptions& o = setup.options;
  o.io_threads = static_cast<int>(flags.get_int("threads", default_threads, 1, 256));
  o.handle_signals = true;
  o.transport.auth_secret = flags.auth_secret();
  setup.metrics = ApplyServerFlags(flags, o);
  ApplyPollingFlags(flags, o.transport);
  setup.uris = flags.all("listen");
  if (setup.uris.empty()) setup.uris.push_back(std::move(default_listen));
  std::string bad = flags.error();
  if (bad.empty() && check) bad = check();
  if (bad.empty() && !InitLogging(flags.get("log-level", ""), setup.log_level_fallback)) {
    bad = LogLevelError(flags.get("log-level", ""));
  }
  if (!bad.empty()) {
    std::cerr << program << ": " << bad << "\n(see " << program << " --help)\n";
    return 2;
  }
  RaiseFileLimit();
  return 0;
}

// The built-in services every sample server offers beside its own: health (`rdmarpc health
// TARGET [SERVICE]`; NOT_SERVING from SIGTERM on) and reflection (`rdmarpc list`, `describe`
// and `call` without the .proto files). Declare it before the Server: the server must not
// outlive them.
struct BuiltinServices {
  HealthService health;
  ReflectionService reflection;

  // Adds `service` and the built-ins to `server` and marks `name` (e.g. "demo.Echo") SERVING.
  // False, with the reason on stderr prefixed by `program`, if the server refuses one.
  bool AddTo(Server& server, Service& service, const char* name, const char* program) {
    Status s = server.AddService(service);
    if (s.ok()) s = health.Attach(server);
    if (s.ok()) s = reflection.Attach(server);
    if (!s.ok()) {
      std::cerr << program << ": " << s.ToString() << "\n";
      return false;
    }
    health.SetServing(name, true);
    return true;
  }
};

// Listens on every URI in order, printing "listening on URI" for each (and calling on_bound
// with it). False, with the reason on stderr prefixed by `program`, when one cannot be served.
inline bool ListenAll(Server& server, const std::vector<std::string>& uris, const char* program,
                      const std::function<void(const std::string&)>& on_bound = {}) {
  for (const auto& uri : uris) {
    auto bound = server.Listen(uri);
    if (!bound.ok()) {
      std::cerr << program << ": cannot listen on " << uri << ": " << bound.status().message()
                << "\n";
      return false;
    }
    if (on_bound) on_bound(*bound);
    std::cout << "listening on " << *bound << std::endl;
  }
  return true;
}

// The sample servers' main loop: ListenAll, then serves `metrics` on --metrics-listen
// (printing "metrics on http://ADDR/metrics"), then runs `server` until SIGINT/SIGTERM and its
// drain. Returns the exit code: 0 after a clean shutdown, 1 (with the reason on stderr,
// prefixed by `program`) when an address cannot be served.
inline int ListenAndRun(Server& server, const std::vector<std::string>& uris, const Flags& flags,
                        const std::shared_ptr<Metrics>& metrics, const char* program,
                        const std::function<void(const std::string&)>& on_bound = {}) {
  if (!ListenAll(server, uris, program, on_bound)) return 1;
  // Declared after the server's set-up and destroyed before the server: it reads its gauges.
  std::unique_ptr<MetricsEndpoint> endpoint;
  if (metrics) {
    metrics->Watch(server);
    auto started = MetricsEndpoint::Start(metrics, flags.get("metrics-listen", ""));
    if (!started.ok()) {
      std::cerr << program << ": " << started.status().message() << "\n";
      return 1;
    }
    endpoint = std::move(*started);
    std::cout << "metrics on http://" << endpoint->address() << "/metrics" << std::endl;
  }
  server.Run();
  return 0;
}

// Raises this process's open-file limit to the hard limit, as servers do (Go's runtime does it
// for every program): the soft default of 1024 is too few for a server with many clients.
// Returns the limit now in force.
inline long RaiseFileLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  return static_cast<long>(rl.rlim_cur);
}

}  // namespace rdmarpc::cmdline

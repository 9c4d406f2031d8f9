// The flags every sample server takes for its limits, and what they set in ServerOptions. One
// place, so that echo_server and kv_server (and their usage texts) agree.
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rpc/metrics.h"
#include "rpc/metrics_http.h"
#include "rpc/server.h"
#include "tools/common/flags.h"

namespace rdmarpc::cmdline {

// Merge into the map given to Flags.
inline std::map<std::string, bool> WithServerFlags(std::map<std::string, bool> known) {
  for (const char* name :
       {"max-connections", "max-concurrent-calls", "max-buffered-bytes", "idle-timeout-ms",
        "keepalive-ms", "keepalive-timeout-ms", "shutdown-grace-ms", "metrics-listen"}) {
    known[name] = true;
  }
  known["access-log"] = false;
  return known;
}

inline constexpr char kServerFlagsUsage[] =
    "Limits (what one client can hold; defaults in parentheses):\n"
    "  --max-connections N       clients served at once; one more is turned away with\n"
    "                            RESOURCE_EXHAUSTED (0 = as many as descriptors allow)\n"
    "  --max-concurrent-calls N  calls one connection runs at once; clients queue beyond (1024)\n"
    "  --max-buffered-bytes N    requests held plus replies a client has not read; over it the\n"
    "                            server stops reading from that client (16777216)\n"
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
  o.max_concurrent_calls_per_connection = static_cast<uint32_t>(
      flags.get_int("max-concurrent-calls", o.max_concurrent_calls_per_connection, 0, 10000000));
  o.max_buffered_bytes_per_connection = static_cast<size_t>(flags.get_int(
      "max-buffered-bytes", static_cast<long>(o.max_buffered_bytes_per_connection), 0, 1L << 40));
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

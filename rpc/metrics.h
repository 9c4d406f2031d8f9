// Metrics in the Prometheus text format: per-method call counts, status codes, latency
// histograms, calls in flight and message bytes (recorded by interceptors, or by the runtime
// itself for an interceptor of this registry that comes first in its list), a server's
// connection and backpressure gauges, and the transports' counters (transport/stats.h).
// rpc/metrics_http.h serves Render() on an HTTP endpoint for Prometheus to scrape.
//
//   auto metrics = std::make_shared<rdmarpc::Metrics>();
//   options.interceptors.push_back(metrics->server_interceptor());   // before Server(options)
//   rdmarpc::Server server(options);
//   metrics->Watch(server);
//
// Threading: every method is safe from any thread. Recording a call takes no lock and no locked
// instruction (each thread adds to counters of its own, summed by Render; a method's counters
// are found in a table that only grows, under a mutex, the first time each method is seen).
// Render() takes the mutex; it is for scrapes.
//
// Names (see docs/METRICS.md for every series): rdmarpc_server_* and rdmarpc_client_* per
// method, labelled method="/pkg.Service/Method" (and code="OK" etc. for handled calls);
// rdmarpc_transport_* and rdmarpc_rdma_* for the process's transports.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "rpc/interceptor.h"
#include "rpc/internal/call_stats.h"
#include "rpc/status.h"

namespace rdmarpc {

class Server;

class Metrics : public std::enable_shared_from_this<Metrics> {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // An interceptor recording every call of a server into this registry (rdmarpc_server_*). Add
  // it to ServerOptions::interceptors, ideally first: then it also counts the calls the others
  // reject, and the server records into it directly, without the interceptor calls, which
  // saves about a third of its cost per call (internal::ServerStatsRecorder). It holds a
  // reference to the registry. Calls turned away before the interceptors run (unknown
  // method, connection limit, draining) are not counted per method.
  std::shared_ptr<ServerInterceptor> server_interceptor();
  // The same for a channel's calls (rdmarpc_client_*; no byte counts on the client side): add
  // it to ChannelOptions::interceptors, ideally first (for the same reasons; the channel
  // records unary calls directly, streams through the interceptor calls).
  std::shared_ptr<ClientInterceptor> client_interceptor();

  // Adds `server`'s gauges (rdmarpc_server_connections, rdmarpc_server_calls_in_flight,
  // rdmarpc_server_throttle_events_total) to Render(). `server` must outlive this registry's
  // last Render(): stop the endpoint serving it first. At most one server.
  void Watch(const Server& server);

  // Adds a series of the application's own: `name` (a valid Prometheus metric name), its help
  // text, and a function returning its current value, called on Render()'s thread. Gauge when
  // `counter` is false.
  void AddGauge(std::string name, std::string help, std::function<double()> value,
                bool counter = false);

  // Every series, in the Prometheus text exposition format (version 0.0.4). Any thread.
  std::string Render() const;

  internal::MethodTable& server_methods() { return server_; }
  internal::MethodTable& client_methods() { return client_; }

 private:
  struct Custom {
    std::string name, help;
    std::function<double()> value;
    bool counter;
  };

  internal::MethodTable server_, client_;
  mutable std::mutex mu_;
  const Server* server_watched_ = nullptr;
  std::vector<Custom> custom_;
};

// Escapes a label value for the text format: backslash, double quote and newline.
std::string EscapeLabelValue(std::string_view value);

}  // namespace rdmarpc

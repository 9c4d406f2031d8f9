// An HTTP endpoint serving a Metrics registry for Prometheus to scrape: GET /metrics (or /)
// answers Metrics::Render() as text/plain; version=0.0.4. Anything else: 404 or 405.
//
// Runs on a thread of its own (Boost.Beast on its own io_context), so scrapes never run on the
// I/O threads that serve calls. Bounded against a hostile client (MetricsEndpointOptions): at
// most max_connections at once (one more closes the oldest that has never had an answer, else
// the oldest: idle connections cannot keep a scraper out), request headers of at most 8 KiB, no
// request body, and a request must arrive whole within idle_timeout of the connection's start or
// of its last answer (a client trickling a byte at a time is closed too). It has no
// authentication: bind it to a loopback or management address.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rpc/metrics.h"
#include "rpc/status.h"

namespace rdmarpc {

// MetricsEndpoint's bounds (outside the class: a default argument of the class's own nested
// type cannot use its member initializers).
struct MetricsEndpointOptions {
  // Connections at once (at least 1). A scraper needs one; the rest are for more scrapers.
  int max_connections = 16;
  // How long a connection may take to send a request (headers complete) before it is closed.
  std::chrono::milliseconds idle_timeout{30'000};
};

class MetricsEndpoint {
 public:
  using Options = MetricsEndpointOptions;

  // Listens on `address` ("127.0.0.1:9464", "[::1]:0"; port 0 picks a free one) and starts
  // serving. Fails with INVALID_ARGUMENT for an address that does not parse or options out of
  // range (max_connections < 1, idle_timeout <= 0) and UNAVAILABLE when it cannot bind.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(std::shared_ptr<const Metrics> metrics,
                                                        const std::string& address,
                                                        Options options = {});
  // Stops serving and joins the thread.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // The bound address, "HOST:PORT" (the port chosen when 0 was asked for).
  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }

 private:
  struct Impl;
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string address_;
  uint16_t port_ = 0;
};

}  // namespace rdmarpc

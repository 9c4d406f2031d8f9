// An HTTP endpoint serving a Metrics registry for Prometheus to scrape: GET /metrics (or /)
// answers Metrics::Render() as text/plain; version=0.0.4. Anything else: 404 or 405.
//
// Runs on a thread of its own (Boost.Beast on its own io_context), so scrapes never run on the
// I/O threads that serve calls. Bounded against a hostile client: at most kMaxConnections at
// once (one more closes the oldest that has never had an answer, else the oldest: idle
// connections cannot keep a scraper out), request headers of at most 8 KiB, no request body,
// and a connection that sends nothing for kIdleTimeout is closed. It has no authentication:
// bind it to a loopback or management address.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rpc/metrics.h"
#include "rpc/status.h"

namespace rdmarpc {

class MetricsEndpoint {
 public:
  static constexpr int kMaxConnections = 16;
  static constexpr std::chrono::seconds kIdleTimeout{30};

  // Listens on `address` ("127.0.0.1:9464", "[::1]:0"; port 0 picks a free one) and starts
  // serving. Fails with INVALID_ARGUMENT for an address that does not parse and UNAVAILABLE
  // when it cannot bind.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(std::shared_ptr<const Metrics> metrics,
                                                        const std::string& address);
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

// Endpoint URIs: "tcp://host:port" and "rdma://host:port" (IPv6 hosts in brackets), and
// "inproc://name:port" (the in-process transport, transport/inproc/: a name, not a host).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "transport/expected.h"

namespace rdmarpc::transport {

enum class Scheme { kTcp, kRdma, kInproc };

struct Endpoint {
  Scheme scheme = Scheme::kTcp;
  std::string host;  // without brackets
  uint16_t port = 0;

  // Canonical form, e.g. "tcp://127.0.0.1:7471" or "rdma://[::1]:7471".
  std::string ToUri() const;
};

// Parses a URI; the error names what is wrong with it. Port 0 is allowed (pick any).
Expected<Endpoint> ParseUri(std::string_view uri);

std::string_view SchemeName(Scheme s);

}  // namespace rdmarpc::transport

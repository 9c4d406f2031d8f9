#include "transport/uri.h"

#include <charconv>

namespace rdmarpc::transport {

std::string_view SchemeName(Scheme s) {
  switch (s) {
    case Scheme::kTcp:
      return "tcp";
    case Scheme::kRdma:
      return "rdma";
    case Scheme::kInproc:
      return "inproc";
  }
  return "?";
}

std::string Endpoint::ToUri() const {
  std::string out(SchemeName(scheme));
  out += "://";
  if (host.find(':') != std::string::npos) {
    out += "[" + host + "]";
  } else {
    out += host;
  }
  out += ":" + std::to_string(port);
  return out;
}

Expected<Endpoint> ParseUri(std::string_view uri) {
  auto bad = [&](std::string_view why) {
    return Error{"bad URI '" + std::string(uri) + "': " + std::string(why) +
                 " (expected tcp://host:port, rdma://host:port or inproc://name:port)"};
  };
  Endpoint ep;
  size_t sep = uri.find("://");
  if (sep == std::string_view::npos) return bad("missing scheme");
  std::string_view scheme = uri.substr(0, sep);
  if (scheme == "tcp") {
    ep.scheme = Scheme::kTcp;
  } else if (scheme == "rdma") {
    ep.scheme = Scheme::kRdma;
  } else if (scheme == "inproc") {
    ep.scheme = Scheme::kInproc;
  } else {
    return bad("unknown scheme '" + std::string(scheme) + "'");
  }
  std::string_view rest = uri.substr(sep + 3);
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated '['");
    ep.host = std::string(rest.substr(1, close - 1));
    rest = rest.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("missing port");
    port_text = rest.substr(1);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("missing port");
    ep.host = std::string(rest.substr(0, colon));
    if (ep.host.find(':') != std::string::npos) return bad("IPv6 hosts need brackets");
    port_text = rest.substr(colon + 1);
  }
  if (ep.host.empty()) return bad("missing host");
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port_text.empty() ||
      port > 65535) {
    return bad("port must be a number from 0 to 65535");
  }
  ep.port = static_cast<uint16_t>(port);
  return ep;
}

}  // namespace rdmarpc::transport

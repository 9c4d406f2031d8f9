#include "rpc/metrics_http.h"

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <iterator>
#include <list>
#include <thread>

namespace rdmarpc {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

struct MetricsEndpoint::Impl {
  // One connection, as the acceptor sees it: closed to make room for a new one (see Accept).
  struct Live {
    beast::tcp_stream* stream = nullptr;  // set once its session starts
    bool served = false;                  // it has had an answer: a scraper, not a squatter
    bool evicted = false;                 // closed for a newer one (before it started, even)
  };
  // Declared before io: the sessions' frames, destroyed with io, still erase themselves.
  std::shared_ptr<const Metrics> metrics;
  MetricsEndpointOptions options;
  std::list<Live> live;  // in the order they came; only on io's thread
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;

  asio::awaitable<void> Accept() {
    for (;;) {
      auto [ec, socket] = co_await acceptor.async_accept(asio::as_tuple(asio::use_awaitable));
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
      if (ec) continue;  // e.g. out of descriptors for a moment
      if (live.size() >= size_t(options.max_connections)) MakeRoom();
      live.emplace_back();
      asio::co_spawn(io, Session(beast::tcp_stream(std::move(socket)), std::prev(live.end())),
                     asio::detached);
    }
  }

  // At the bound, the oldest connection that has never had an answer is closed for the new one,
  // or else the oldest of all. Refusing the newest instead let a client that holds
  // max_connections idle connections (renewed every idle_timeout) keep every scrape out; now it
  // must outpace a scrape's few milliseconds, and a scraper's kept-alive connection goes last.
  void MakeRoom() {
    auto victim = live.end();
    for (auto it = live.begin(); it != live.end(); ++it) {
      if (it->evicted) continue;
      if (!it->served) {
        victim = it;
        break;
      }
      if (victim == live.end()) victim = it;
    }
    if (victim == live.end()) return;
    victim->evicted = true;
    if (victim->stream) victim->stream->close();  // its read ends; the session erases it
  }

  asio::awaitable<void> Session(beast::tcp_stream stream, std::list<Live>::iterator self) {
    struct Erase {
      std::list<Live>& live;
      std::list<Live>::iterator self;
      ~Erase() { live.erase(self); }
    } erase{live, self};
    if (self->evicted) co_return;
    self->stream = &stream;
    beast::flat_buffer buffer(16 * 1024);  // bounded: a request larger than this is an error
    for (;;) {
      stream.expires_after(options.idle_timeout);
      http::request_parser<http::empty_body> parser;
      parser.header_limit(8 * 1024);
      parser.body_limit(0);
      auto [ec, n] =
          co_await http::async_read(stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
      if (ec) break;  // closed, timed out, or not HTTP we accept: drop the connection
      const auto& req = parser.get();
      http::response<http::string_body> res;
      res.version(req.version());
      res.keep_alive(req.keep_alive());
      res.set(http::field::server, "rdmarpc");
      std::string_view target(req.target().data(), req.target().size());
      target = target.substr(0, target.find('?'));
      if (req.method() != http::verb::get && req.method() != http::verb::head) {
        res.result(http::status::method_not_allowed);
        res.set(http::field::allow, "GET, HEAD");
        res.set(http::field::content_type, "text/plain; charset=utf-8");
        res.body() = "only GET and HEAD\n";
      } else if (target != "/metrics" && target != "/") {
        res.result(http::status::not_found);
        res.set(http::field::content_type, "text/plain; charset=utf-8");
        res.body() = "not found: metrics are at /metrics\n";
      } else {
        res.result(http::status::ok);
        res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
        res.body() = metrics->Render();
      }
      res.prepare_payload();
      if (req.method() == http::verb::head) res.body().clear();  // keeps Content-Length
      auto [wec, wn] = co_await http::async_write(stream, res, asio::as_tuple(asio::use_awaitable));
      if (wec || !res.keep_alive()) break;
      self->served = true;
    }
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream.socket().close(ignored);
  }
};

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    std::shared_ptr<const Metrics> metrics, const std::string& address, Options options) {
  if (options.max_connections < 1 || options.idle_timeout.count() <= 0) {
    return Status(StatusCode::kInvalidArgument,
                  "metrics endpoint options out of range: max_connections " +
                      std::to_string(options.max_connections) + " (at least 1), idle_timeout " +
                      std::to_string(options.idle_timeout.count()) + " ms (more than 0)");
  }
  // HOST:PORT, HOST may be [v6].
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return Status(StatusCode::kInvalidArgument,
                  "metrics address '" + address + "' is not HOST:PORT (e.g. 127.0.0.1:9464)");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = address.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(host, ec);
  if (*end != '\0' || port < 0 || port > 65535 || ec) {
    return Status(StatusCode::kInvalidArgument,
                  "metrics address '" + address +
                      "' is not HOST:PORT with a numeric IP address and a port from 0 to 65535");
  }
  auto impl = std::make_unique<Impl>();
  impl->metrics = std::move(metrics);
  impl->options = options;
  const tcp::endpoint ep(ip, static_cast<uint16_t>(port));
  if (impl->acceptor.open(ep.protocol(), ec); !ec) {
    impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    impl->acceptor.bind(ep, ec);
    if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    return Status(StatusCode::kUnavailable,
                  "cannot serve metrics on " + address + ": " + ec.message());
  }
  const tcp::endpoint bound = impl->acceptor.local_endpoint();
  asio::co_spawn(impl->io, impl->Accept(), asio::detached);
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint(std::move(impl)));
  e->port_ = bound.port();
  e->address_ = (bound.address().is_v6() ? "[" + bound.address().to_string() + "]"
                                         : bound.address().to_string()) +
                ":" + std::to_string(e->port_);
  return e;
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsEndpoint::~MetricsEndpoint() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace rdmarpc

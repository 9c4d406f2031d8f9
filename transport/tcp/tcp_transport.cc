#include "transport/tcp/tcp_transport.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/defer.hpp>
#include <cstring>

#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>

#include "transport/handler_slot.h"
#include "transport/handshake.h"
#include "transport/tcp/reassembler.h"

namespace rdmarpc::transport::tcp {
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr size_t kInitialReadBufferBytes = 64 * 1024;
// Buffers that grew for a large message shrink back once idle, so idle connections stay small.
constexpr size_t kShrinkAboveBytes = 1 << 20;

void StoreLe32(std::byte* p, uint32_t v) {
  v = htole32(v);
  std::memcpy(p, &v, 4);
}

std::string EndpointUri(const tcp::endpoint& ep) {
  Endpoint e{Scheme::kTcp, ep.address().to_string(), ep.port()};
  return e.ToUri();
}

// Reads exactly buffer_size(buf) bytes, or fails with timed_out after `timeout_ms`.
asio::awaitable<std::tuple<boost::system::error_code, size_t>> ReadWithin(
    tcp::socket& sock, asio::mutable_buffer buf, int timeout_ms) {
  using namespace asio::experimental::awaitable_operators;
  asio::steady_timer timer(sock.get_executor(), std::chrono::milliseconds(timeout_ms));
  auto r = co_await (asio::async_read(sock, buf, asio::as_tuple(asio::use_awaitable)) ||
                     timer.async_wait(asio::as_tuple(asio::use_awaitable)));
  if (r.index() == 1) co_return std::make_tuple(make_error_code(asio::error::timed_out), size_t{0});
  co_return std::get<0>(r);
}

class TcpConnection final : public Connection, public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(tcp::socket socket, const Options& options)
      : socket_(std::move(socket)),
        executor_(socket_.get_executor()),
        options_(options),
        reader_(kInitialReadBufferBytes, options.max_message_bytes) {
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("tcp://?") : EndpointUri(remote);
  }

  const Executor& executor() const override { return executor_; }
  bool closed() const override { return handler_.closed(); }
  size_t max_message_bytes() const override { return options_.max_message_bytes; }
  std::string peer() const override { return peer_; }

  void Start(std::shared_ptr<ConnectionHandler> handler) override {
    handler_.Set(std::move(handler));
    if (handler_.closed()) {
      asio::post(executor_, [self = shared_from_this()] { self->handler_.DeliverClose(); });
      return;
    }
    ReadMore();
  }

  bool Send(const MessageWriter& message) override {
    if (handler_.closed()) return false;
    const size_t n = message.size();
    if (n > options_.max_message_bytes) return false;
    const size_t at = pending_.size();
    pending_.resize(at + kLengthPrefixBytes + n);
    StoreLe32(pending_.data() + at, static_cast<uint32_t>(n));
    message.WriteTo(pending_.data() + at + kLengthPrefixBytes);
    if (!writing_ && !flush_scheduled_) {
      // Defer the write to the end of this event-loop turn so that every message queued in the
      // same turn leaves in one syscall.
      flush_scheduled_ = true;
      asio::defer(executor_, [self = shared_from_this()] {
        self->flush_scheduled_ = false;
        self->Flush();
      });
    }
    return true;
  }

  void Close() override { CloseWith("closed locally"); }

 private:
  void CloseWith(std::string reason) {
    if (!handler_.MarkClosed(std::move(reason))) return;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    asio::post(executor_, [self = shared_from_this()] { self->handler_.DeliverClose(); });
  }

  void Flush() {
    if (handler_.closed() || writing_ || pending_.empty()) return;
    writing_ = true;
    std::swap(pending_, inflight_);
    asio::async_write(socket_, asio::buffer(inflight_),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        self->OnWritten(ec);
                      });
  }

  void OnWritten(boost::system::error_code ec) {
    writing_ = false;
    if (ec) {
      CloseWith("write failed: " + ec.message());
      return;
    }
    inflight_.clear();
    if (inflight_.capacity() > kShrinkAboveBytes) inflight_.shrink_to_fit();
    Flush();
  }

  void ReadMore() {
    if (handler_.closed()) return;
    auto room = reader_.Writable();
    socket_.async_read_some(asio::buffer(room.data(), room.size()),
                            [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                              self->OnRead(ec, n);
                            });
  }

  void OnRead(boost::system::error_code ec, size_t n) {
    if (handler_.closed()) return;
    if (ec) {
      CloseWith(ec == asio::error::eof ? "peer closed the connection"
                                       : "read failed: " + ec.message());
      return;
    }
    reader_.Commit(n);
    // Deliver every complete message in the buffer, in place.
    std::span<const std::byte> message;
    uint32_t too_large = 0;
    for (;;) {
      const auto r = reader_.Next(&message, &too_large);
      if (r == StreamReassembler::Result::kNeedMore) break;
      if (r == StreamReassembler::Result::kTooLarge) {
        spdlog::warn("tcp {}: message of {} bytes exceeds the limit of {}; closing", peer_,
                     too_large, options_.max_message_bytes);
        CloseWith("peer sent a message of " + std::to_string(too_large) +
                  " bytes, over the limit of " + std::to_string(options_.max_message_bytes));
        return;
      }
      handler_.get()->OnMessage(message);
      if (handler_.closed()) return;
    }
    reader_.Settle(kShrinkAboveBytes);
    ReadMore();
  }

  tcp::socket socket_;
  Executor executor_;
  Options options_;
  std::string peer_;
  HandlerSlot handler_;
  StreamReassembler reader_;
  std::vector<std::byte> pending_, inflight_;
  bool writing_ = false, flush_scheduled_ = false;
};

class TcpListener final : public Listener {
 public:
  struct State {
    State(Executor ex) : acceptor(ex) {}
    tcp::acceptor acceptor;
    std::vector<Executor> executors;
    AcceptHandler on_accept;
    Options options;
    Authenticator auth{""};
    size_t next = 0;
    std::atomic<bool> closed{false};
  };

  explicit TcpListener(std::shared_ptr<State> s, std::string uri)
      : state_(std::move(s)), uri_(std::move(uri)) {}
  ~TcpListener() override { Close(); }

  static void AcceptNext(std::shared_ptr<State> s) {
    if (s->closed) return;
    Executor target = s->executors[s->next++ % s->executors.size()];
    s->acceptor.async_accept(target, [s](boost::system::error_code ec, tcp::socket sock) {
      if (s->closed) return;
      if (ec) {
        spdlog::warn("tcp accept failed: {}", ec.message());
        // Back off briefly on errors such as EMFILE rather than spinning.
        auto timer = std::make_shared<asio::steady_timer>(s->acceptor.get_executor(),
                                                          std::chrono::milliseconds(50));
        timer->async_wait([s, timer](boost::system::error_code) { AcceptNext(s); });
        return;
      }
      Executor ex = sock.get_executor();  // the connection's own I/O thread
      asio::co_spawn(ex, Handshake(s, std::move(sock)), asio::detached);
      AcceptNext(s);
    });
  }

  // The server's half of the handshake, on the connection's own thread: read the client's
  // HELLO (bounded by the connect timeout, so a silent peer cannot hold a socket), check it,
  // answer, and only then hand the connection to the server.
  static asio::awaitable<void> Handshake(std::shared_ptr<State> s, tcp::socket sock) {
    boost::system::error_code ec;
    const auto remote = sock.remote_endpoint(ec);
    const std::string peer = ec ? std::string("tcp://?") : EndpointUri(remote);
    uint8_t buf[kHelloBytes];
    auto [rec, n] = co_await ReadWithin(sock, asio::buffer(buf), s->options.connect_timeout_ms);
    if (rec) {
      spdlog::warn("tcp: no handshake from {}: {}", peer, rec.message());
      co_return;
    }
    Hello hello;
    Refusal refusal = Refusal::kNone;
    if (std::string err = DecodeHello(buf, n, &hello); !err.empty()) {
      spdlog::warn("tcp: refusing connection from {}: {}", peer, err);
      refusal = RefusalForBadHello(buf, n);
    } else if (refusal = s->auth.Check(hello); refusal != Refusal::kNone) {
      spdlog::warn("tcp: refusing connection from {}: {}", peer, RefusalText(refusal));
    }
    uint8_t answer[kAnswerBytes];
    EncodeAnswer(refusal, answer);
    auto [wec, wn] = co_await asio::async_write(sock, asio::buffer(answer),
                                                asio::as_tuple(asio::use_awaitable));
    if (wec || refusal != Refusal::kNone || s->closed) co_return;  // the socket closes here
    s->on_accept(std::make_shared<TcpConnection>(std::move(sock), s->options));
  }

  void Close() override {
    if (state_->closed.exchange(true)) return;
    asio::post(state_->acceptor.get_executor(), [s = state_] {
      boost::system::error_code ec;
      s->acceptor.close(ec);
    });
  }

  std::string uri() const override { return uri_; }

 private:
  std::shared_ptr<State> state_;
  std::string uri_;
};

}  // namespace

Expected<std::unique_ptr<Listener>> Listen(const Endpoint& endpoint,
                                           const std::vector<Executor>& executors,
                                           AcceptHandler on_accept, const Options& options) {
  if (executors.empty()) return Error{"tcp listen: no executors"};
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(endpoint.host == "localhost" ? "127.0.0.1" : endpoint.host,
                                     ec);
  if (ec) return Error{"tcp listen on " + endpoint.ToUri() + ": bad address: " + ec.message()};
  auto state = std::make_shared<TcpListener::State>(executors[0]);
  state->executors = executors;
  state->on_accept = std::move(on_accept);
  state->options = options;
  state->auth = Authenticator(options.auth_secret);
  tcp::endpoint ep(addr, endpoint.port);
  auto& a = state->acceptor;
  if (a.open(ep.protocol(), ec); ec) return Error{"tcp listen: socket: " + ec.message()};
  a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (a.bind(ep, ec); ec) return Error{"tcp listen on " + endpoint.ToUri() + ": " + ec.message()};
  if (a.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return Error{"tcp listen on " + endpoint.ToUri() + ": " + ec.message()};
  }
  auto local = a.local_endpoint(ec);
  std::string uri = EndpointUri(local);
  TcpListener::AcceptNext(state);
  return std::unique_ptr<Listener>(new TcpListener(state, uri));
}

asio::awaitable<Expected<std::shared_ptr<Connection>>> Connect(const Endpoint& endpoint,
                                                               Executor executor,
                                                               const Options& options) {
  tcp::resolver resolver(executor);
  auto [rec, results] = co_await resolver.async_resolve(
      endpoint.host, std::to_string(endpoint.port), asio::as_tuple(asio::use_awaitable));
  if (rec) {
    co_return Error{"cannot resolve " + endpoint.ToUri() + ": " + rec.message()};
  }
  tcp::socket socket(executor);
  asio::steady_timer timer(executor, std::chrono::milliseconds(options.connect_timeout_ms));
  using namespace asio::experimental::awaitable_operators;
  auto outcome = co_await (
      asio::async_connect(socket, results, asio::as_tuple(asio::use_awaitable)) ||
      timer.async_wait(asio::as_tuple(asio::use_awaitable)));
  if (outcome.index() == 1) {
    co_return Error{"connect to " + endpoint.ToUri() + " timed out after " +
                    std::to_string(options.connect_timeout_ms) + " ms"};
  }
  auto [cec, ep] = std::get<0>(outcome);
  if (cec) co_return Error{"connect to " + endpoint.ToUri() + " failed: " + cec.message()};
  // The client's half of the handshake: HELLO (with the secret's digest), then the answer.
  Hello hello;
  Authenticator(options.auth_secret).Sign(&hello);
  uint8_t buf[kHelloBytes];
  EncodeHello(hello, buf);
  auto [wec, wn] = co_await asio::async_write(socket, asio::buffer(buf),
                                              asio::as_tuple(asio::use_awaitable));
  if (wec) co_return Error{"connect to " + endpoint.ToUri() + " failed: " + wec.message()};
  uint8_t answer[kAnswerBytes];
  auto [rec2, rn] = co_await ReadWithin(socket, asio::buffer(answer), options.connect_timeout_ms);
  if (rec2) {
    co_return Error{"connect to " + endpoint.ToUri() + ": no handshake answer (" +
                    rec2.message() + "); is it an rdmarpc server?"};
  }
  Refusal refusal;
  if (std::string err = DecodeAnswer(answer, rn, &refusal); !err.empty()) {
    co_return Error{"connect to " + endpoint.ToUri() + ": " + err};
  }
  if (refusal != Refusal::kNone) {
    co_return Error{"connect to " + endpoint.ToUri() + " refused by the server: " +
                    RefusalText(refusal)};
  }
  co_return std::shared_ptr<Connection>(std::make_shared<TcpConnection>(std::move(socket), options));
}

}  // namespace rdmarpc::transport::tcp

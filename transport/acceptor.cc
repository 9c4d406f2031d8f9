#include "transport/acceptor.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <utility>

namespace rdmarpc::transport {

AcceptorCore::AcceptorCore(std::vector<Executor> executors, AcceptHandler on_accept,
                           const Options& options)
    : executors_(std::move(executors)),
      on_accept_(std::move(on_accept)),
      options_(options),
      auth_(options.auth_secret) {}

Answer AcceptorCore::Screen(const uint8_t* bytes, size_t len, const Expected<Hello>& hello,
                            bool retry, std::string* why) const {
  Answer answer;
  if (!hello.ok()) {
    *why = hello.error().message;
    answer.code = RefusalForBadHello(bytes, len);
    return answer;
  }
  answer.code = auth_.Check(hello.value(), &answer.challenge);
  // A HELLO that answers our challenge must carry the proof it asked for.
  if (answer.code == Refusal::kChallenge && retry) answer.code = Refusal::kBadSecret;
  if (answer.code != Refusal::kNone && answer.code != Refusal::kChallenge) {
    *why = RefusalText(answer.code);
  }
  return answer;
}

Expected<boost::asio::ip::address> ListenAddress(const Endpoint& endpoint) {
  boost::system::error_code ec;
  auto addr =
      boost::asio::ip::make_address(endpoint.host == "localhost" ? "127.0.0.1" : endpoint.host, ec);
  if (!ec) return addr;
  boost::asio::io_context lookup;
  boost::asio::ip::tcp::resolver resolver(lookup);
  auto results = resolver.resolve(endpoint.host, std::to_string(endpoint.port), ec);
  if (ec || results.empty()) {
    return Error{"cannot resolve " + endpoint.host + (ec ? ": " + ec.message() : std::string())};
  }
  return results.begin()->endpoint().address();
}

}  // namespace rdmarpc::transport

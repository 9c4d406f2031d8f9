#include "transport/acceptor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <utility>

#include "transport/stats.h"

namespace rdmarpc::transport {

AcceptorCore::AcceptorCore(std::vector<Executor> executors, AcceptHandler on_accept,
                           const Options& options)
    : executors_(std::move(executors)),
      on_accept_(std::move(on_accept)),
      options_(options),
      auth_(options.auth_secret) {}

bool AcceptorCore::MakeRoom(std::string_view scheme, const std::string& peer) {
  const int max = options_.max_handshakes;
  if (max <= 0) return true;
  const int now = set_ups_now_.load();
  if (now >= 2 * max) {
    Count(Stat::kRefusedHandshakes);
    if (refused_busy_++ % 1000 == 0) {
      spdlog::warn("{}: {} connections in set-up: refusing {} as busy ({} so far)", scheme, now,
                   peer, refused_busy_);
    }
    return false;
  }
  if (now < max) return true;
  while (!set_ups_.empty()) {
    std::shared_ptr<SetUp> oldest = std::move(set_ups_.front());
    set_ups_.pop_front();
    if (oldest->done.load()) continue;
    Count(Stat::kHandshakesGivenUp);
    if (evicted_++ % 1000 == 0) {
      spdlog::warn(
          "{}: {} connections in set-up, the most allowed: giving up on the oldest for a new "
          "one from {} ({} so far)",
          scheme, now, peer, evicted_);
    }
    boost::asio::post(oldest->ex, [oldest] {
      if (!oldest->done.load()) oldest->give_up.emit(boost::asio::cancellation_type::terminal);
    });
    break;
  }
  return true;
}

std::shared_ptr<AcceptorCore::SetUp> AcceptorCore::BeginSetUp(const Executor& ex) {
  set_ups_now_.fetch_add(1);
  auto set_up = std::make_shared<SetUp>(ex);
  if (options_.max_handshakes <= 0) return set_up;  // no bound: none is ever given up
  if (set_ups_.size() > 4 * size_t(std::max(options_.max_handshakes, 16))) {
    std::erase_if(set_ups_, [](const auto& u) { return u->done.load(); });
  }
  set_ups_.push_back(set_up);
  return set_up;
}

Answer AcceptorCore::Screen(const uint8_t* bytes, size_t len, const Expected<Hello>& hello,
                            bool retry, std::string_view peer, std::string* why) const {
  Answer answer;
  if (!hello.ok()) {
    *why = hello.error().message;
    answer.code = RefusalForBadHello(bytes, len);
    return answer;
  }
  answer.code = auth_.Check(hello.value(), &answer.challenge);
  // A HELLO that answers our challenge must carry the proof it asked for.
  if (answer.code == Refusal::kChallenge && retry) answer.code = Refusal::kBadSecret;
  if (answer.code != Refusal::kNone) {
    if (answer.code != Refusal::kChallenge) *why = RefusalText(answer.code);
    return answer;
  }
  // Full only once the client has proved itself: an unauthenticated one learns nothing more.
  // Logged once per 1,000 (`why` empty otherwise): a flood must not flood the log as well.
  if (!options_.full) return answer;
  if (const BusyReason full = options_.full(peer); full != BusyReason::kUnstated) {
    answer.code = Refusal::kBusy;
    answer.busy = full;
    Count(Stat::kRefusedLimit);
    if (const uint64_t n = refused_full_.fetch_add(1) + 1; n % 1000 == 1) {
      *why = std::string("busy: ") + BusyText(full) + " (" + std::to_string(n) + " refused so far)";
    }
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

// What a listener of either transport (tcp/, rdma/) shares: where the connections it accepts go
// (the server's I/O threads, in turn), who may connect (the HELLO's verdict), whether it has
// closed, and the address it binds. The transports keep only what is theirs: sockets and the
// descriptor reserve for TCP, CM ids and events for RDMA.
#pragma once

#include <atomic>
#include <boost/asio/ip/address.hpp>
#include <cstddef>
#include <string>
#include <vector>

#include "transport/expected.h"
#include "transport/handshake.h"
#include "transport/transport.h"
#include "transport/uri.h"

namespace rdmarpc::transport {

class AcceptorCore {
 public:
  // `executors`: the server's I/O threads (not empty).
  AcceptorCore(std::vector<Executor> executors, AcceptHandler on_accept, const Options& options);
  AcceptorCore(const AcceptorCore&) = delete;
  AcceptorCore& operator=(const AcceptorCore&) = delete;

  // The I/O thread of the next accepted connection (round-robin). The listener's thread only.
  const Executor& NextExecutor() { return executors_[next_++ % executors_.size()]; }

  // The verdict on a client's HELLO: `bytes` as received, `hello` them decoded (or why they do
  // not decode). kNone: go on; kChallenge: answer with answer.challenge and expect the HELLO
  // again with a proof; anything else is a refusal, and `*why` says why for the log. `retry`:
  // this HELLO answers our challenge (TCP's second round), so it must carry the proof. Any
  // thread (handshakes run on the I/O threads).
  Answer Screen(const uint8_t* bytes, size_t len, const Expected<Hello>& hello, bool retry,
                std::string* why) const;

  const Authenticator& auth() const { return auth_; }
  const Options& options() const { return options_; }
  // Hands an accepted, handshaken connection to the server. Any thread.
  void Deliver(std::shared_ptr<Connection> c) const { on_accept_(std::move(c)); }

  // Set by the listener's Close; read by handshakes in flight, which then drop their
  // connection instead of delivering it.
  std::atomic<bool> closed{false};

 private:
  const std::vector<Executor> executors_;
  const AcceptHandler on_accept_;
  const Options options_;
  const Authenticator auth_;
  size_t next_ = 0;
};

// The address a listener binds for `endpoint`: "localhost" is 127.0.0.1, an address is itself,
// and a host name is looked up here, blocking (listening is set-up, off the I/O threads).
Expected<boost::asio::ip::address> ListenAddress(const Endpoint& endpoint);

}  // namespace rdmarpc::transport

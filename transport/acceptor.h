// What a listener of either transport (tcp/, rdma/) shares: where the connections it accepts go
// (the server's I/O threads, in turn), who may connect (the HELLO's verdict), the bound on
// connections in set-up (Options::max_handshakes), whether it has closed, and the address it
// binds. The transports keep only what is theirs: sockets and the descriptor reserve for TCP,
// CM ids and events for RDMA.
#pragma once

#include <atomic>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/ip/address.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
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
  // thread (handshakes run on the I/O threads). Options::full turns a client that passed away
  // as busy (`peer`: its address, for Options::full); `*why` is then set only once per 1,000
  // such refusals (empty: nothing to log).
  Answer Screen(const uint8_t* bytes, size_t len, const Expected<Hello>& hello, bool retry,
                std::string_view peer, std::string* why) const;

  const Authenticator& auth() const { return auth_; }
  const Options& options() const { return options_; }
  // Hands an accepted, handshaken connection to the server. Any thread.
  void Deliver(std::shared_ptr<Connection> c) const { on_accept_(std::move(c)); }

  // Set by the listener's Close; read by handshakes in flight, which then drop their
  // connection instead of delivering it.
  std::atomic<bool> closed{false};

  // --- Connections in set-up (accepted, handshake not finished): Options::max_handshakes ---
  // Each one holds a descriptor (and over RDMA a queue pair and a pinned ring) until its client
  // completes the set-up, goes away, or the set-up times out. A client that opens connections
  // and never completes them must not hold more than the bound, nor keep real clients out.

  // One connection in set-up, as the listener sees it: it can ask the set-up to give up.
  struct SetUp {
    explicit SetUp(Executor e) : ex(std::move(e)) {}
    Executor ex;                               // the thread the set-up runs on
    boost::asio::cancellation_signal give_up;  // emitted on ex's thread only
    std::atomic<bool> done{false};             // the set-up ended (either way)
  };

  // Before a new set-up, on the listener's thread: at the bound the oldest set-up gives up for
  // the new one (a client that completes its set-up does so within milliseconds, so the oldest
  // is the likeliest never to, and a flood of connections left half-open must outpace every
  // real client's set-up to keep one out; refusing the newest instead would let a few
  // connections per connect timeout keep every new client out). Evictions take effect on the
  // set-up's own thread, so a flood faster than they do is refused at twice the bound: false,
  // refuse `peer` as busy. `scheme` ("tcp", "rdma") and `peer` are for the log, which says
  // it once per 1,000 (a flood must not flood the log as well).
  bool MakeRoom(std::string_view scheme, const std::string& peer);
  // Counts a set-up that MakeRoom let in, to run on `ex`: spawn it with its give_up slot bound
  // (boost::asio::bind_cancellation_slot), make the give-up end its waits, and have it hold a
  // SetUpEnd for its whole life. The listener's thread only.
  std::shared_ptr<SetUp> BeginSetUp(const Executor& ex);
  // Set-ups begun and not yet ended. Any thread.
  int set_ups_now() const { return set_ups_now_.load(); }
  // Ends a set-up (established, refused, failed or given up) when it goes out of scope; on the
  // set-up's own thread.
  class SetUpEnd {
   public:
    SetUpEnd(AcceptorCore& core, std::shared_ptr<SetUp> u) : core_(core), u_(std::move(u)) {}
    SetUpEnd(const SetUpEnd&) = delete;
    SetUpEnd& operator=(const SetUpEnd&) = delete;
    ~SetUpEnd() {
      u_->done.store(true);
      core_.set_ups_now_.fetch_sub(1);
    }

   private:
    AcceptorCore& core_;
    std::shared_ptr<SetUp> u_;
  };

 private:
  // Counted up on the listener's thread (BeginSetUp), down on the set-up's (SetUpEnd).
  std::atomic<int> set_ups_now_{0};
  // The set-ups in the order they began (done ones are dropped as the front reaches them, or
  // all at once when the queue grows long). The listener's thread only.
  std::deque<std::shared_ptr<SetUp>> set_ups_;
  uint64_t evicted_ = 0, refused_busy_ = 0;        // the listener's thread only
  mutable std::atomic<uint64_t> refused_full_{0};  // Screen's, on any thread

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

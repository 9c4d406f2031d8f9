// Internal: keeps a connection's completions in ring order across the moment it is started.
//
// The peer may write as soon as it sees ESTABLISHED, before this side has seen it and been
// started, so completions can be polled for a connection nobody handles yet. They are held and
// replayed, from a posted handler, once Start runs. Completions polled after Start but before
// that replay must queue behind the held ones: processed at once, they would consume records
// out of ring order (a protocol error that closed the connection; issue 11, item 11).
// Pure logic, single-threaded (the connection's I/O thread); unit-tested in rdma_ring_test.
#pragma once

#include <utility>
#include <vector>

namespace rdmarpc::transport::rdma {

template <class T>
class StartGate {
 public:
  // True: process `item` now. False: it was held, behind the items already held.
  bool Pass(const T& item) {
    if (!started_ || !held_.empty()) {
      held_.push_back(item);
      return false;
    }
    return true;
  }

  // The connection is started. True when items are held: schedule a replay (TakeHeld).
  bool Start() {
    started_ = true;
    return !held_.empty();
  }

  // Everything held, in arrival order (including what came while the replay was pending);
  // afterwards Pass lets items through again.
  std::vector<T> TakeHeld() { return std::exchange(held_, {}); }

  size_t held() const { return held_.size(); }

 private:
  bool started_ = false;
  std::vector<T> held_;
};

}  // namespace rdmarpc::transport::rdma

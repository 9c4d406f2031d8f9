// HandlerSlot: a connection's upper-layer handler together with the once-only close notice every
// transport owes it (ConnectionHandler::OnClose). Shared by the TCP and RDMA connections so that
// both keep the same contract. Use only on the connection's own thread.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "transport/transport.h"

namespace rdmarpc::transport {

class HandlerSlot {
 public:
  void Set(std::shared_ptr<ConnectionHandler> handler) { handler_ = std::move(handler); }
  // Null before Start and after the close notice was delivered.
  ConnectionHandler* get() const { return handler_.get(); }

  bool closed() const { return closed_; }
  // Records that the connection closed and why; false if it already was.
  bool MarkClosed(std::string reason) {
    if (closed_) return false;
    closed_ = true;
    reason_ = std::move(reason);
    return true;
  }

  // Once closed and a handler is set: calls OnClose exactly once, then drops the handler (which
  // breaks the handler <-> connection reference cycle). Otherwise does nothing. Post it; never
  // call it from inside Send or Close.
  void DeliverClose() {
    if (!closed_ || !handler_) return;
    auto h = std::move(handler_);
    h->OnClose(Error{reason_});
  }

 private:
  std::shared_ptr<ConnectionHandler> handler_;
  bool closed_ = false;
  std::string reason_;
};

}  // namespace rdmarpc::transport

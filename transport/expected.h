// Expected<T>: a value or a transport Error, for the transport layer's fallible operations.
// The RPC layer turns an Error into a Status; transports know nothing of Status.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace rdmarpc::transport {

// Why a transport operation failed, in words a user can act on. `busy`: the peer refused for
// lack of room (connections, descriptors), which the RPC layer reports as RESOURCE_EXHAUSTED
// rather than UNAVAILABLE.
struct Error {
  std::string message;
  bool busy = false;
};

template <class T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Expected(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design
  bool ok() const { return v_.index() == 0; }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace rdmarpc::transport

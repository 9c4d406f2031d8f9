// Expected<T>: a value or a transport Error, for the transport layer's fallible operations;
// Expected<void>: success or an Error. The transport's one error convention (no "" meaning
// success, no bare bool for a failure that has a reason). The RPC layer turns an Error into a
// Status; transports know nothing of Status.
#pragma once

#include <optional>
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

template <>
class Expected<void> {
 public:
  Expected() = default;                                // success
  Expected(Error error) : error_(std::move(error)) {}  // NOLINT: implicit by design
  bool ok() const { return !error_.has_value(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

}  // namespace rdmarpc::transport

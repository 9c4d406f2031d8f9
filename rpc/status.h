// Status and Result<T>: how every call reports success or failure.
// Codes are gRPC's well-known set, because users already know what each one means.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace rdmarpc {

enum class StatusCode : uint32_t {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// `text` made safe to write to a terminal or a log line: control characters become escapes
// (\n, \r, \t, \x1b for ESC and the rest of C0 and DEL; \u0085 for C1 controls, and the line
// separators and bidirectional overrides, U+2028-202E and U+2066-2069, that reorder what a
// reader sees), as do bytes that are not UTF-8 (\xNN). Printable UTF-8 is kept as it is.
// For text a peer chose (a server's error message, a GOAWAY reason, a service name): printed
// raw, it could forge log lines or drive the reader's terminal (escape sequences that move the
// cursor, retitle the window or write the clipboard).
std::string EscapeForDisplay(std::string_view text);

// "OK", "DEADLINE_EXCEEDED", ...; "CODE_<n>" for values outside the set.
std::string StatusCodeName(StatusCode code);

// A value type. Without a message (every OK status) it is a code and a null pointer: copies and
// moves cost a few instructions, which matters because each call moves its Status several
// times (a std::string member made every move an out-of-line call).
class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code),
        message_(message.empty() ? nullptr : std::make_unique<std::string>(std::move(message))) {}
  Status(const Status& o) : code_(o.code_), message_(CopyMessage(o)) {}
  Status& operator=(const Status& o) {
    if (this != &o) {
      code_ = o.code_;
      message_ = CopyMessage(o);
    }
    return *this;
  }
  // A moved-from Status keeps its code and loses its message.
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_ ? *message_ : kEmptyMessage; }
  // "OK" or "UNAVAILABLE: connection closed", for people and logs: the message is passed
  // through EscapeForDisplay (it may come from the peer). message() is the text as sent.
  std::string ToString() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message() == b.message();
  }

 private:
  // Constant-initialized (std::string's default constructor is constexpr): message() reads it
  // without the guard check a function-local static costs on every call.
  static inline const std::string kEmptyMessage{};
  static std::unique_ptr<std::string> CopyMessage(const Status& o) {
    return o.message_ ? std::make_unique<std::string>(*o.message_) : nullptr;
  }

  StatusCode code_ = StatusCode::kOk;
  std::unique_ptr<std::string> message_;  // null when empty
};

// The reply of a call, or the Status that says why there is none.
template <class T>
class Result {
 public:
  // Not OK until assigned; exists because futures and containers need it.
  Result() : status_(StatusCode::kUnknown, "no result") {}
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // `status` must not be OK: an OK Result carries a value.
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok())
      status_ = Status(StatusCode::kInternal, "Result built from OK without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace rdmarpc

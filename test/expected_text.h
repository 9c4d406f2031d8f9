// ErrorOf: the message a transport Expected failed with, or "" when it succeeded; for the tests'
// string matchers (Catch::Contains) over the transport's errors.
#pragma once

#include <string>

#include "transport/expected.h"

namespace rdmarpc::testing {

template <class T>
std::string ErrorOf(const transport::Expected<T>& e) {
  return e.ok() ? "" : e.error().message;
}

}  // namespace rdmarpc::testing

// The method id on the wire: FNV-1a (32 bit) of "/package.Service/Method". One definition for
// the runtime (Server::AddService, which rejects two methods with the same id) and for the protoc
// plugin (which computes ids at code-generation time), so the two can never disagree.
#pragma once

#include <cstdint>
#include <string_view>

namespace rdmarpc {

constexpr uint32_t MethodId(std::string_view full_name) {
  uint32_t h = 2166136261u;
  for (char c : full_name) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return h;
}

}  // namespace rdmarpc

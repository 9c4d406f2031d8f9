// What both engines share: the statuses of a failed compare-and-set and of a full store.
#include "examples/kv/engine.h"

#include <string>

namespace kv {

rdmarpc::Status VersionMismatch(std::optional<uint64_t> expected, uint64_t current) {
  return rdmarpc::Status(rdmarpc::StatusCode::kAborted, "version mismatch: expected " +
                                                            std::to_string(expected.value_or(0)) +
                                                            ", current " + std::to_string(current) +
                                                            (current == 0 ? " (absent)" : ""));
}

rdmarpc::Status StoreFull(std::string_view engine, uint64_t held, uint64_t max_bytes,
                          uint64_t more) {
  return rdmarpc::Status(rdmarpc::StatusCode::kResourceExhausted,
                         "store full: the " + std::string(engine) + " engine holds " +
                             std::to_string(held) + " of its " + std::to_string(max_bytes) +
                             " bytes (kv_server --max-store-bytes), and this put needs " +
                             std::to_string(more) + " more");
}

}  // namespace kv

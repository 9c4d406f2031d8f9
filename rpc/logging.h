// Logging goes through spdlog's default logger. Levels: trace, debug, info, warn, error, off.
#pragma once

#include <string_view>

namespace rdmarpc {

// Sets the log level from `level` if not empty, else from $RDMARPC_LOG_LEVEL, else `fallback`.
// Returns false (and keeps the level) for an unknown level name.
bool InitLogging(std::string_view level = {}, std::string_view fallback = "info");

}  // namespace rdmarpc

// Logging goes through spdlog's default logger. Levels: trace, debug, info, warn, error, off.
#pragma once

#include <string>
#include <string_view>

namespace rdmarpc {

// Sets the log level from `level` if not empty, else from $RDMARPC_LOG_LEVEL, else `fallback`.
// Returns false (and keeps the level) for an unknown level name.
bool InitLogging(std::string_view level = {}, std::string_view fallback = "info");

// Why InitLogging(level) refused: the level's name (from `level`, or $RDMARPC_LOG_LEVEL's when
// `level` is empty) and the valid ones, on one line, for a command-line error.
std::string LogLevelError(std::string_view level);

}  // namespace rdmarpc

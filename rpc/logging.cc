#include "rpc/logging.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

namespace rdmarpc {

bool InitLogging(std::string_view level, std::string_view fallback) {
  std::string name(level);
  if (name.empty()) {
    const char* env = std::getenv("RDMARPC_LOG_LEVEL");
    name = env && *env ? env : std::string(fallback);
  }
  auto lvl = spdlog::level::from_str(name);
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (lvl == spdlog::level::off && name != "off") return false;
  spdlog::set_level(lvl);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  return true;
}

std::string LogLevelError(std::string_view level) {
  const char* env = std::getenv("RDMARPC_LOG_LEVEL");
  const bool from_env = level.empty() && env != nullptr;
  return "unknown log level '" + (from_env ? std::string(env) : std::string(level)) + "'" +
         (from_env ? " in $RDMARPC_LOG_LEVEL" : "") +
         " (valid: trace, debug, info, warn, error, off)";
}

}  // namespace rdmarpc

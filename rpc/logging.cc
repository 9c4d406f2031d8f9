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

}  // namespace rdmarpc

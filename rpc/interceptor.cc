#include "rpc/interceptor.h"

#include <spdlog/spdlog.h>

namespace rdmarpc {

void AccessLogInterceptor::OnFinish(const ServerContext& context, const Status& status,
                                    std::chrono::nanoseconds elapsed) {
  spdlog::info("access {} {} {} {:.3f} ms", context.peer(), context.method(),
               StatusCodeName(status.code()), static_cast<double>(elapsed.count()) / 1e6);
}

}  // namespace rdmarpc

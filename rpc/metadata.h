// Metadata: the key/value pairs a call carries beside its message (routing keys, trace ids,
// credentials). Small by design: the frame codec caps a call's metadata at 64 KiB.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace rdmarpc {

using Metadata = std::vector<std::pair<std::string, std::string>>;

}  // namespace rdmarpc

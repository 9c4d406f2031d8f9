// Metadata: the key/value pairs a call carries beside its message (routing keys, trace ids,
// credentials). Small by design: at most 64 KiB encoded (6 bytes per entry plus key and value)
// and 1,024 entries; a call over either fails with RESOURCE_EXHAUSTED before anything is sent.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace rdmarpc {

using Metadata = std::vector<std::pair<std::string, std::string>>;

}  // namespace rdmarpc

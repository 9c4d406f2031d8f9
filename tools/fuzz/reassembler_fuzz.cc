// Fuzz target: the TCP stream reassembler (transport/tcp/reassembler.h). The input is a byte
// stream cut into reads of fuzzer-chosen sizes; the messages handed out must be exactly those a
// whole-stream reference parse finds, in order, whatever the cuts, and a too-large length prefix
// must stop the stream. The buffer must never grow past one whole message (or its initial size),
// whatever the peer announces or however the reads fall.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transport/tcp/reassembler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using rdmarpc::transport::tcp::StreamReassembler;
  if (size < 2) return 0;
  // First byte: the read-size pattern seed; second: the message limit (small, to hit kTooLarge).
  const uint8_t seed = data[0];
  const size_t max_message = 1 + data[1] * 4;
  const uint8_t* stream = data + 2;
  const size_t n = size - 2;

  // Reference: parse the whole stream at once.
  std::vector<std::string> want;
  bool want_too_large = false;
  for (size_t at = 0; at + 4 <= n;) {
    uint32_t len;
    std::memcpy(&len, stream + at, 4);
    if (len > max_message) {
      want_too_large = true;
      break;
    }
    if (n - at - 4 < len) break;
    want.emplace_back(reinterpret_cast<const char*>(stream + at + 4), len);
    at += 4 + len;
  }

  StreamReassembler r(16, max_message);
  std::vector<std::string> got;
  bool got_too_large = false;
  size_t at = 0;
  uint32_t x = seed | 1u;
  while (at < n && !got_too_large) {
    x = x * 1103515245u + 12345u;
    auto room = r.Writable();
    if (room.empty()) std::abort();
    if (r.capacity() > std::max<size_t>(16, 4 + max_message)) std::abort();
    const size_t chunk = std::min({room.size(), n - at, size_t{1} + (x >> 16) % 64});
    std::memcpy(room.data(), stream + at, chunk);
    r.Commit(chunk);
    at += chunk;
    std::span<const std::byte> m;
    for (;;) {
      auto res = r.Next(&m);
      if (res == StreamReassembler::Result::kNeedMore) break;
      if (res == StreamReassembler::Result::kTooLarge) {
        got_too_large = true;
        break;
      }
      got.emplace_back(reinterpret_cast<const char*>(m.data()), m.size());
    }
    if (!got_too_large) r.Settle(64);
  }
  if (got != want || got_too_large != want_too_large) std::abort();
  return 0;
}

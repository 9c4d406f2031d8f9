// Fuzz target: the RPC frame decoder (rpc/internal/frame.h) on arbitrary bytes, as a server or
// client sees them from a peer. Beyond "no crash": whatever decodes must encode back to the same
// bytes.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "rpc/internal/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmarpc;
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  DecodedFrame f;
  if (!DecodeFrame(in, &f).empty()) return 0;
  // The header round-trips exactly (flags and reserved values included).
  std::byte header[kFrameHeaderBytes];
  EncodeFrameHeader(f.header, header);
  if (std::memcmp(header, data, kFrameHeaderBytes) != 0) std::abort();
  if (f.metadata.size() + f.payload.size() + kFrameHeaderBytes != size) std::abort();
  Metadata md;
  const size_t counted = CountMetadataEntries(f.metadata);
  if (counted > kMaxMetadataEntries + 1) std::abort();
  if (DecodeMetadata(f.metadata, &md).empty()) {
    // The count a server refuses by agrees with the decode, up to where it stops.
    if (counted != std::min(md.size(), kMaxMetadataEntries + 1)) std::abort();
    // Decoded metadata re-encodes to the very bytes it came from.
    if (MetadataEncodedSize(md) != f.metadata.size()) std::abort();
    std::vector<std::byte> again(f.metadata.size());
    EncodeMetadata(md, again.data());
    if (!again.empty() && std::memcmp(again.data(), f.metadata.data(), again.size()) != 0) {
      std::abort();
    }
  }
  Settings s;
  (void)DecodeSettings(f.payload, &s);
  (void)FrameTypeName(f.header.type);
  return 0;
}

// Internal: parses a message's payload where the transport left it, without protobuf's copy of
// its last 16 bytes.
//
// Why: protobuf's flat-array parser (ParseFromArray) may read up to 16 bytes past the point it
// is parsing, so it parses a buffer up to 16 bytes before its end and then copies those last
// bytes into a padded buffer of its own to finish there (EpsCopyInputStream::DoneFallback and
// NextBuffer: ~110 instructions per message, a fifth of parsing a small request). Every message
// a transport hands up is followed by kMessageSlopBytes readable bytes (transport/transport.h),
// so the parser is given those too, with a limit at the payload's end: it parses to the end in
// place, as it parses a nested message inside a larger buffer. What lies in those bytes is never
// part of the result: a message must end exactly at the limit, and one whose last field would
// run past it (malformed) fails as it does with ParseFromArray.
//
// The parse context is protobuf's internal API (what generated code uses), so this is compiled
// only for the protobuf it was written against (3.21, Debian 12's); any other falls back to
// ParseFromArray.
#pragma once

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/message_lite.h>
#include <google/protobuf/stubs/common.h>

#include <climits>
#include <cstddef>
#include <span>

#include "transport/transport.h"

#if GOOGLE_PROTOBUF_VERSION >= 3021000 && GOOGLE_PROTOBUF_VERSION < 3022000
#include <google/protobuf/parse_context.h>
#define RDMARPC_PARSE_IN_PLACE 1
#endif

namespace rdmarpc::internal {

// Replaces `message`'s contents with `payload` parsed (as ParseFromArray does: cleared first,
// required fields checked). `payload` must be followed by transport::kMessageSlopBytes readable
// bytes: a payload that ends where a transport message ends is.
inline bool ParsePayload(google::protobuf::MessageLite& message,
                         std::span<const std::byte> payload) {
  // Protobuf parses at most 2 GiB; the same refusal ParseFromArray gives a larger size.
  if (payload.size() > static_cast<size_t>(INT_MAX) - transport::kMessageSlopBytes) return false;
  const int size = static_cast<int>(payload.size());
#ifdef RDMARPC_PARSE_IN_PLACE
  // How far protobuf reads ahead: the bytes after the payload it is given.
  constexpr int kAhead = google::protobuf::internal::EpsCopyInputStream::kSlopBytes;
  static_assert(transport::kMessageSlopBytes >= kAhead, "the transport leaves too few bytes");
  message.Clear();
  const char* ptr = nullptr;
  const auto* data = reinterpret_cast<const char*>(payload.data());
  google::protobuf::internal::ParseContext ctx(
      google::protobuf::io::CodedInputStream::GetDefaultRecursionLimit(), /*aliasing=*/false, &ptr,
      google::protobuf::stringpiece_internal::StringPiece(data, size + kAhead));
  // The limit at the payload's end; its return value restores an outer limit, and there is none.
  (void)ctx.PushLimit(ptr, size);
  ptr = message._InternalParse(ptr, &ctx);
  return ptr != nullptr && ctx.EndedAtLimit() && message.IsInitialized();
#else
  return message.ParseFromArray(payload.data(), size);
#endif
}

}  // namespace rdmarpc::internal

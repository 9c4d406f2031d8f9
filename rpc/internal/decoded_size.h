// Internal: how much memory a message will take once parsed, read from its wire bytes before it
// is parsed.
//
// Why: protobuf's in-memory form can be many times its wire size. Every field the receiver does
// not know is kept as an entry of its own (and a length-delimited one as a heap string besides),
// and each element of a repeated string or message field is an object of its own: an empty
// unknown field takes two bytes on the wire and ~53 parsed (protobuf's SpaceUsedLong), and two
// 16 MiB requests of them took a server from 12 to 556 MiB. The server's memory budgets count
// what a call holds; counting only wire bytes let a request hold some 17-26 times what was
// counted. This walks the wire format with the message's descriptor (no allocation, no copy) and
// adds up what the parser will allocate.
//
// The figure is an estimate from above, per occurrence (64-bit libstdc++ and protobuf 3.21's
// layouts, rounded up, vectors counted at twice their elements for growth); it is meant to bound
// amplification, not to account byte by byte.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace google::protobuf {
class Descriptor;
class MessageLite;
}  // namespace google::protobuf

namespace rdmarpc::internal {

// What `payload`, parsed as a message of `type`, will take in memory, in bytes, at least its wire
// size. For a payload that does not parse the figure covers what was walked before the error
// (the parser stops there too). Deeper nesting than protobuf's recursion limit (100) counts as
// SIZE_MAX: the parser refuses it.
size_t DecodedBytes(const google::protobuf::Descriptor& type, std::span<const std::byte> payload);

// What `payload`, parsed as `type`, will take beyond its own bytes: 0 for payloads under
// kDecodedCheckFromBytes and past the nesting limit (the parse refuses those).
size_t DecodedExcess(const google::protobuf::Descriptor& type, std::span<const std::byte> payload);
// The same for a payload about to be parsed into `into`, whatever its class: 0 as well for lite
// messages (no descriptor).
size_t DecodedExcess(const google::protobuf::MessageLite& into, std::span<const std::byte> payload);

// Why a message is refused for what it would take parsed, the same words wherever that happens:
// "<what> of N bytes would take about M once parsed (many small or unknown fields), more than
// the K bytes <bound>", `bound` saying whose allowance K is.
std::string ParsedTooLargeText(std::string_view what, size_t bytes, size_t excess, size_t allowed,
                               std::string_view bound);

// Payloads shorter than this are not walked: at most ~10 KiB parsed each, of the order of the
// allowance every call is counted with (kCallHeldBytes, 3 KiB).
inline constexpr size_t kDecodedCheckFromBytes = 256;

}  // namespace rdmarpc::internal

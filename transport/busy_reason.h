// Why a server turned a client away as busy (transport/transport.h, Options::full), in a header
// of its own: the handshake codec (handshake.h) carries it and is built alone for fuzzing.
#pragma once

#include <cstdint>

namespace rdmarpc::transport {

// Why a listener turned a client away as busy, when the server says (Options::full); carried in
// the handshake's busy answer, so that the client's error names the limit. Only for clients that
// passed authentication: refusals before it (descriptors, a flood of handshakes) say nothing more.
enum class BusyReason : uint8_t {
  kUnstated = 0,         // busy, no reason given (and, from Options::full: not busy)
  kConnectionLimit = 1,  // the server's limit of connections
  kPeerLimit = 2,        // the server's limit of connections from one client address
};
// The last reason this side knows; a byte past it reads as kUnstated.
inline constexpr BusyReason kLastBusyReason = BusyReason::kPeerLimit;

}  // namespace rdmarpc::transport

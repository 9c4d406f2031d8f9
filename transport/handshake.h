// The connection handshake both transports run before any message flows: the client's HELLO
// (protocol version, optional authentication token, and for RDMA where its receive ring is) and
// the server's ANSWER (accepted, or refused and why). Over TCP they are the first bytes on the
// socket; over RDMA they are the CM private data of the connect request and of the accept or
// reject. Byte layout in docs/PROTOCOL.md ("Handshake"); keep the two in step.
//
// Authentication: when the server has a secret, a HELLO must carry the SHA-256 digest of the same
// secret or the connection is refused before anything else happens (for RDMA: before the server
// allocates a ring or tells the peer any rkey). The digest stands in for the secret on the wire:
// it keeps the secret itself off the network, but anyone who can read the traffic can replay it.
// There is no encryption and no integrity protection of later messages.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rdmarpc::transport {

inline constexpr uint32_t kHelloMagic = 0x31435052;  // "RPC1" little-endian
inline constexpr uint16_t kHandshakeVersion = 2;
// 56 bytes: exactly what an RDMA CM connect request may carry as private data over IB/RoCE.
inline constexpr size_t kHelloBytes = 56;
inline constexpr size_t kAnswerBytes = 8;

using AuthToken = std::array<uint8_t, 32>;

// SHA-256 of `data` (FIPS 180-4). Used to derive the token from the shared secret.
AuthToken Sha256(std::string_view data);

struct Hello {
  // RDMA only (zero over TCP): the sender's receive ring.
  uint64_t ring_addr = 0;
  uint32_t ring_rkey = 0;
  uint32_t ring_bytes = 0;
  bool has_token = false;
  AuthToken token{};
};

void EncodeHello(const Hello& h, uint8_t* out);  // writes kHelloBytes
// Returns "" and fills `out`, or says what is wrong (short, not an rdmarpc peer, version).
std::string DecodeHello(const void* data, size_t len, Hello* out);

enum class Refusal : uint16_t {
  kNone = 0,          // accepted
  kBadSecret = 1,     // the server wants a secret and the HELLO had none or another
  kBadVersion = 2,    // the server does not speak the client's handshake version
  kServerError = 3,   // the server could not set the connection up (resources)
};

// What to answer a HELLO that DecodeHello rejected: kBadVersion when it is an rdmarpc HELLO of
// another version, else kServerError.
Refusal RefusalForBadHello(const void* data, size_t len);

void EncodeAnswer(Refusal r, uint8_t* out);  // writes kAnswerBytes
std::string DecodeAnswer(const void* data, size_t len, Refusal* out);
// What a refused client reports, e.g. "authentication failed: ...".
std::string RefusalText(Refusal r);

// The server's side of authentication: built once from the configured secret ("" = none).
class Authenticator {
 public:
  explicit Authenticator(std::string_view secret);
  bool required() const { return required_; }
  // kNone when `hello` may connect. Compares in constant time.
  Refusal Check(const Hello& hello) const;
  // Fills the client's token fields from the same secret (nothing when there is none).
  void Sign(Hello* hello) const;

 private:
  bool required_;
  AuthToken token_{};
};

}  // namespace rdmarpc::transport

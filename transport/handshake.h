// The connection handshake both transports run before any message flows: the client's HELLO
// (protocol version, authentication, and for RDMA where its receive ring is) and the server's
// ANSWER (accepted, a challenge, or refused and why). Over TCP they are the first bytes on the
// socket; over RDMA they are the CM private data of the connect request and of the accept or
// reject. Byte layout in docs/PROTOCOL.md ("Handshake"); keep the two in step.
//
// Authentication (when the server has a secret) is a mutual challenge-response with
// HMAC-SHA256 (OpenSSL's libcrypto), keyed by the shared secret, which never travels:
//   1. client -> server: HELLO with a fresh client nonce, flagged "wants auth".
//   2. server -> client: ANSWER "challenge" with a server challenge (its clock and a tag only this
//      server instance can make, bound to the client nonce). Over RDMA this is a reject: the
//      server has allocated nothing and revealed no rkey.
//   3. client -> server: the same HELLO with the challenge and a client proof, an HMAC over both
//      nonces and the HELLO's ring fields (over RDMA, a new connect request).
//   4. server -> client: ANSWER "accepted" with a server proof, an HMAC over both nonces and the
//      server's ring fields. The client closes the connection if it does not verify.
// Neither proof can be reused: the server accepts each (challenge, client nonce) pair once, and
// only within kChallengeLifetimeS of issuing it; a server proof answers one client nonce.
// A rogue server learns nothing reusable, and cannot pass step 4 without the secret.
// Not protected: confidentiality and integrity of later messages (no encryption), a live
// man-in-the-middle relaying both directions, and offline guessing of a weak secret from a
// captured exchange: use a long random secret (e.g. 32 bytes from /dev/urandom).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "transport/busy_reason.h"
#include "transport/expected.h"

namespace rdmarpc::transport {

inline constexpr uint32_t kHelloMagic = 0x31435052;  // "RPC1" little-endian
inline constexpr uint16_t kHandshakeVersion = 4;
// 56 bytes: exactly what an RDMA CM connect request may carry as private data over IB/RoCE.
inline constexpr size_t kHelloBytes = 56;
inline constexpr size_t kAnswerBytes = 48;
// How long a server challenge stays valid (a connect may need a new RDMA connection in between).
inline constexpr int kChallengeLifetimeS = 30;

using Nonce = std::array<uint8_t, 8>;
using ClientProof = std::array<uint8_t, 16>;  // HMAC-SHA256, truncated to fit the 56 bytes
using ServerProof = std::array<uint8_t, 32>;

struct Hello {
  // RDMA only (zero over TCP): the sender's receive ring.
  uint64_t ring_addr = 0;
  uint32_t ring_rkey = 0;
  uint32_t ring_bytes = 0;
  bool wants_auth = false;  // the client has a secret: it will prove it and wants proof back
  bool has_proof = false;   // challenge and proof below are filled in
  Nonce client_nonce{};
  Nonce challenge{};
  ClientProof proof{};
};

void EncodeHello(const Hello& h, uint8_t* out);  // writes kHelloBytes
// The HELLO in `data`, or what is wrong with it (short, not an rdmarpc peer, version).
Expected<Hello> DecodeHello(const void* data, size_t len);

enum class Refusal : uint16_t {
  kNone = 0,         // accepted
  kBadSecret = 1,    // the server wants a secret and the HELLO had none or another
  kBadVersion = 2,   // the server does not speak the client's handshake version
  kServerError = 3,  // the server could not set the connection up
  kChallenge = 4,    // not a refusal: prove the secret against Answer::challenge
  kBusy = 5,         // out of connections, descriptors or handshake slots: RESOURCE_EXHAUSTED
};

struct Answer {
  Refusal code = Refusal::kNone;
  Nonce challenge{};    // kChallenge
  ServerProof proof{};  // kNone, when the client wants auth and the server has a secret
  // kBusy: which limit, when the server says (in the first byte of the challenge field, zero
  // in a busy answer from a server that does not say: no new handshake version needed).
  BusyReason busy = BusyReason::kUnstated;
};

// What to answer a HELLO that DecodeHello rejected: kBadVersion when it is an rdmarpc HELLO of
// another version, else kServerError.
Refusal RefusalForBadHello(const void* data, size_t len);

void EncodeAnswer(const Answer& a, uint8_t* out);  // writes kAnswerBytes
// The ANSWER in `data`, or what is wrong with it. From a server of another handshake version
// only a refusal is understood (its other fields are left empty).
Expected<Answer> DecodeAnswer(const void* data, size_t len);
// What a refused client reports, e.g. "authentication failed: ..."; for kBusy, with the limit
// when `busy` names one.
std::string RefusalText(Refusal r, BusyReason busy = BusyReason::kUnstated);
// The limit `busy` names, e.g. "at the server's connection limit (max_connections)".
const char* BusyText(BusyReason busy);

// HMAC-SHA256 (RFC 2104) of `data` under `key`, from libcrypto.
std::array<uint8_t, 32> HmacSha256(std::string_view key, std::string_view data);

// Both sides of authentication, built once from the configured secret ("" = none). Copies share
// the server's replay record. Thread-safe: a listener's TCP handshakes run on several threads.
class Authenticator {
 public:
  explicit Authenticator(std::string_view secret);
  bool has_secret() const { return !secret_.empty(); }

  // --- client ---
  // A HELLO with a fresh client nonce, asking for authentication when we have a secret.
  Hello NewHello() const;
  // Fills `h`'s challenge and proof for the server's `challenge`. Call after the ring fields
  // are final: the proof covers them.
  void Prove(Hello* h, const Nonce& challenge) const;
  // For an accepted connection: success when the server proved it knows our secret (or we
  // have none), else why the connection must not be used.
  Expected<void> CheckServer(const Hello& sent, const Hello& server, const Answer& answer) const;

  // --- server ---
  // kNone: `h` may connect. kChallenge: answer with `*challenge`, expect the HELLO again with
  // a proof. kBadSecret: refuse. Constant-time comparisons; each proof is accepted once.
  Refusal Check(const Hello& h, Nonce* challenge) const;
  // The same at a given time on this process's steady clock, in seconds (for tests).
  Refusal CheckAt(const Hello& h, Nonce* challenge, uint32_t now_s) const;
  static uint32_t NowSeconds();
  // The proof an accepted answer carries, when the client asked for one; zeros otherwise.
  ServerProof ProveServer(const Hello& client, const Hello& server) const;

 private:
  struct ReplayRecord;
  Nonce MakeChallenge(const Nonce& client_nonce, uint32_t issued_s) const;
  std::string secret_;
  std::array<uint8_t, 32> instance_key_{};  // random per server: its challenges are its own
  std::shared_ptr<ReplayRecord> replay_;
};

}  // namespace rdmarpc::transport

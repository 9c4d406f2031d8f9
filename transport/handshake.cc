#include "transport/handshake.h"

#include <endian.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

namespace rdmarpc::transport {
namespace {

void Put16(uint8_t* p, uint16_t v) {
  v = htole16(v);
  std::memcpy(p, &v, 2);
}
void Put32(uint8_t* p, uint32_t v) {
  v = htole32(v);
  std::memcpy(p, &v, 4);
}
void Put64(uint8_t* p, uint64_t v) {
  v = htole64(v);
  std::memcpy(p, &v, 8);
}
uint16_t Get16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return le16toh(v);
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return le32toh(v);
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return le64toh(v);
}

constexpr uint16_t kFlagWantsAuth = 1;
constexpr uint16_t kFlagProof = 2;

// The ring fields as they are on the wire (HELLO bytes 8..23): what the proofs cover.
std::array<uint8_t, 16> RingFields(const Hello& h) {
  std::array<uint8_t, 16> out{};
  Put64(out.data(), h.ring_addr);
  Put32(out.data() + 8, h.ring_rkey);
  Put32(out.data() + 12, h.ring_bytes);
  return out;
}

template <class... Parts>
std::string Concat(std::string_view label, const Parts&... parts) {
  std::string s(label);
  (s.append(reinterpret_cast<const char*>(parts.data()), parts.size()), ...);
  return s;
}

void RandomBytes(uint8_t* out, size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) == 1) return;
  // libcrypto's generator failing is near impossible; never leave a nonce predictable anyway.
  std::random_device rd;
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(rd());
}

}  // namespace

std::array<uint8_t, 32> HmacSha256(std::string_view key, std::string_view data) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len);
  return out;
}

// Layout: u32 magic, u16 version, u16 flags, u64 ring addr, u32 rkey, u32 ring bytes,
// 8-byte client nonce, 8-byte challenge, 16-byte client proof.
void EncodeHello(const Hello& h, uint8_t* out) {
  std::memset(out, 0, kHelloBytes);
  Put32(out, kHelloMagic);
  Put16(out + 4, kHandshakeVersion);
  Put16(out + 6, (h.wants_auth ? kFlagWantsAuth : 0) | (h.has_proof ? kFlagProof : 0));
  Put64(out + 8, h.ring_addr);
  Put32(out + 16, h.ring_rkey);
  Put32(out + 20, h.ring_bytes);
  std::memcpy(out + 24, h.client_nonce.data(), 8);
  if (h.has_proof) {
    std::memcpy(out + 32, h.challenge.data(), 8);
    std::memcpy(out + 40, h.proof.data(), 16);
  }
}

Expected<Hello> DecodeHello(const void* data, size_t len) {
  if (data == nullptr || len < kHelloBytes) {
    return Error{"handshake too short (" + std::to_string(data ? len : 0) + " bytes, need " +
                 std::to_string(kHelloBytes) + ")"};
  }
  const auto* p = static_cast<const uint8_t*>(data);
  if (Get32(p) != kHelloMagic) return Error{"not an rdmarpc peer (bad handshake magic)"};
  if (const uint16_t v = Get16(p + 4); v != kHandshakeVersion) {
    return Error{"unsupported handshake version " + std::to_string(v) + " (this side speaks " +
                 std::to_string(kHandshakeVersion) + ")"};
  }
  const uint16_t flags = Get16(p + 6);
  if (flags & ~(kFlagWantsAuth | kFlagProof)) {
    return Error{"unknown handshake flags " + std::to_string(flags)};
  }
  if ((flags & kFlagProof) && !(flags & kFlagWantsAuth)) {
    return Error{"a proof without authentication"};
  }
  Hello h;
  h.ring_addr = Get64(p + 8);
  h.ring_rkey = Get32(p + 16);
  h.ring_bytes = Get32(p + 20);
  h.wants_auth = (flags & kFlagWantsAuth) != 0;
  h.has_proof = (flags & kFlagProof) != 0;
  std::memcpy(h.client_nonce.data(), p + 24, 8);
  if (h.has_proof) {
    std::memcpy(h.challenge.data(), p + 32, 8);
    std::memcpy(h.proof.data(), p + 40, 16);
  }
  return h;
}

Refusal RefusalForBadHello(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (p != nullptr && len >= 6 && Get32(p) == kHelloMagic && Get16(p + 4) != kHandshakeVersion) {
    return Refusal::kBadVersion;
  }
  return Refusal::kServerError;
}

// Layout: u32 magic, u16 version, u16 code, 8-byte challenge, 32-byte server proof. A busy
// answer has no challenge: its first byte says which limit (BusyReason; 0 = not said).
void EncodeAnswer(const Answer& a, uint8_t* out) {
  std::memset(out, 0, kAnswerBytes);
  Put32(out, kHelloMagic);
  Put16(out + 4, kHandshakeVersion);
  Put16(out + 6, static_cast<uint16_t>(a.code));
  std::memcpy(out + 8, a.challenge.data(), 8);
  if (a.code == Refusal::kBusy) out[8] = static_cast<uint8_t>(a.busy);
  std::memcpy(out + 16, a.proof.data(), 32);
}

Expected<Answer> DecodeAnswer(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  // A server of another handshake version may answer with fewer bytes; its code still counts.
  if (p == nullptr || len < 8) return Error{"handshake answer too short"};
  if (Get32(p) != kHelloMagic) return Error{"not an rdmarpc server (bad handshake magic)"};
  const uint16_t code = Get16(p + 6);
  if (code > static_cast<uint16_t>(Refusal::kBusy)) {
    return Error{"unknown handshake answer " + std::to_string(code)};
  }
  Answer out;
  out.code = static_cast<Refusal>(code);
  if (Get16(p + 4) != kHandshakeVersion) {
    // Only a refusal is understood across versions (the server says it does not speak ours).
    if (out.code == Refusal::kNone || out.code == Refusal::kChallenge) {
      return Error{"the server speaks handshake version " + std::to_string(Get16(p + 4)) +
                   ", this side " + std::to_string(kHandshakeVersion)};
    }
    return out;
  }
  if (len < kAnswerBytes) return Error{"handshake answer too short"};
  if (out.code == Refusal::kBusy) {
    // A reason this side does not know is still a busy answer.
    if (p[8] <= static_cast<uint8_t>(kLastBusyReason)) out.busy = BusyReason{p[8]};
    return out;
  }
  std::memcpy(out.challenge.data(), p + 8, 8);
  std::memcpy(out.proof.data(), p + 16, 32);
  return out;
}

const char* BusyText(BusyReason busy) {
  switch (busy) {
    case BusyReason::kConnectionLimit:
      return "at the server's connection limit (max_connections)";
    case BusyReason::kPeerLimit:
      return "at the server's limit of connections from one client address "
             "(max_connections_per_peer)";
    case BusyReason::kUnstated:
      break;
  }
  return "busy";
}

std::string RefusalText(Refusal r, BusyReason busy) {
  switch (r) {
    case Refusal::kNone:
      return "accepted";
    case Refusal::kBadSecret:
      return "authentication failed: the server requires a shared secret and ours is missing or "
             "different";
    case Refusal::kBadVersion:
      return "the server does not speak this handshake version";
    case Refusal::kServerError:
      return "the server could not set the connection up";
    case Refusal::kChallenge:
      return "the server asked for proof of a shared secret, and we have none";
    case Refusal::kBusy:
      if (busy != BusyReason::kUnstated)
        return std::string("the server is busy: ") + BusyText(busy);
      return "the server is busy (at its connection limit, out of descriptors, or flooded with "
             "connections being set up)";
  }
  return "refused";
}

// The (challenge, client nonce) pairs the server has accepted and when, so that none is
// accepted twice. Entries older than a challenge's lifetime are dropped: their challenges are
// refused as expired anyway. Only valid proofs get in, so its size is bounded by successful
// connections per lifetime.
struct Authenticator::ReplayRecord {
  std::mutex mu;
  std::multimap<uint32_t, std::array<uint8_t, 16>> by_time;  // issue time -> challenge+nonce

  // False if `key` was already accepted.
  bool Insert(uint32_t issued, const std::array<uint8_t, 16>& key, uint32_t now) {
    std::lock_guard lock(mu);
    while (!by_time.empty() && now - by_time.begin()->first > uint32_t(kChallengeLifetimeS)) {
      by_time.erase(by_time.begin());
    }
    auto [lo, hi] = by_time.equal_range(issued);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == key) return false;
    }
    by_time.emplace(issued, key);
    return true;
  }
};

Authenticator::Authenticator(std::string_view secret)
    : secret_(secret), replay_(std::make_shared<ReplayRecord>()) {
  RandomBytes(instance_key_.data(), instance_key_.size());
}

Hello Authenticator::NewHello() const {
  Hello h;
  h.wants_auth = has_secret();
  RandomBytes(h.client_nonce.data(), h.client_nonce.size());
  return h;
}

void Authenticator::Prove(Hello* h, const Nonce& challenge) const {
  h->has_proof = true;
  h->challenge = challenge;
  const auto mac = HmacSha256(
      secret_, Concat("rdmarpc-v3 client", RingFields(*h), h->client_nonce, h->challenge));
  std::memcpy(h->proof.data(), mac.data(), h->proof.size());
}

ServerProof Authenticator::ProveServer(const Hello& client, const Hello& server) const {
  if (!has_secret() || !client.wants_auth) return ServerProof{};
  return HmacSha256(secret_, Concat("rdmarpc-v3 server", RingFields(server), client.client_nonce,
                                    client.challenge));
}

Expected<void> Authenticator::CheckServer(const Hello& sent, const Hello& server,
                                          const Answer& answer) const {
  if (!has_secret()) return {};
  const ServerProof want = HmacSha256(
      secret_, Concat("rdmarpc-v3 server", RingFields(server), sent.client_nonce, sent.challenge));
  if (!sent.has_proof || CRYPTO_memcmp(want.data(), answer.proof.data(), want.size()) != 0) {
    return Error{
        "authentication failed: the server did not prove that it knows the shared secret "
        "(it has none configured, or another one)"};
  }
  return {};
}

Nonce Authenticator::MakeChallenge(const Nonce& client_nonce, uint32_t issued_s) const {
  Nonce c{};
  Put32(c.data(), issued_s);
  std::array<uint8_t, 4> issued;
  std::memcpy(issued.data(), c.data(), 4);
  const auto tag = HmacSha256(
      std::string_view(reinterpret_cast<const char*>(instance_key_.data()), instance_key_.size()),
      Concat("rdmarpc-v3 challenge", issued, client_nonce));
  std::memcpy(c.data() + 4, tag.data(), 4);
  return c;
}

// Seconds on this process's steady clock: a challenge's issue time, checked by the same process.
uint32_t Authenticator::NowSeconds() {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

Refusal Authenticator::Check(const Hello& h, Nonce* challenge) const {
  return CheckAt(h, challenge, NowSeconds());
}

Refusal Authenticator::CheckAt(const Hello& h, Nonce* challenge, uint32_t now) const {
  if (!has_secret()) return Refusal::kNone;
  if (!h.wants_auth) return Refusal::kBadSecret;
  if (!h.has_proof) {
    *challenge = MakeChallenge(h.client_nonce, now);
    return Refusal::kChallenge;
  }
  // Ours (the tag), recent (the time), right (the proof), and the first time (the record).
  const uint32_t issued = Get32(h.challenge.data());
  const Nonce expect = MakeChallenge(h.client_nonce, issued);
  if (CRYPTO_memcmp(expect.data(), h.challenge.data(), expect.size()) != 0) {
    return Refusal::kBadSecret;
  }
  if (issued > now || now - issued > uint32_t(kChallengeLifetimeS)) return Refusal::kBadSecret;
  Hello want = h;
  Prove(&want, h.challenge);
  if (CRYPTO_memcmp(want.proof.data(), h.proof.data(), want.proof.size()) != 0) {
    return Refusal::kBadSecret;
  }
  std::array<uint8_t, 16> key;
  std::memcpy(key.data(), h.challenge.data(), 8);
  std::memcpy(key.data() + 8, h.client_nonce.data(), 8);
  if (!replay_->Insert(issued, key, now)) return Refusal::kBadSecret;
  return Refusal::kNone;
}

}  // namespace rdmarpc::transport

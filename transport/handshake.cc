#include "transport/handshake.h"

#include <endian.h>

#include <cstring>

namespace rdmarpc::transport {
namespace {

constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

constexpr uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void Compress(uint32_t state[8], const uint8_t block[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t(block[4 * i]) << 24) | (uint32_t(block[4 * i + 1]) << 16) |
           (uint32_t(block[4 * i + 2]) << 8) | uint32_t(block[4 * i + 3]);
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kRoundConstants[i] + w[i];
    const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state[0] += a, state[1] += b, state[2] += c, state[3] += d;
  state[4] += e, state[5] += f, state[6] += g, state[7] += h;
}

void Put16(uint8_t* p, uint16_t v) {
  v = htole16(v);
  std::memcpy(p, &v, 2);
}
void Put32(uint8_t* p, uint32_t v) {
  v = htole32(v);
  std::memcpy(p, &v, 4);
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

constexpr uint16_t kFlagToken = 1;

}  // namespace

AuthToken Sha256(std::string_view data) {
  uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                       0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t n = data.size();
  while (n >= 64) {
    Compress(state, p);
    p += 64;
    n -= 64;
  }
  // Padding: 0x80, zeros, then the message length in bits as a big-endian u64.
  uint8_t tail[128] = {};
  std::memcpy(tail, p, n);
  tail[n] = 0x80;
  const size_t tail_len = n + 1 + 8 <= 64 ? 64 : 128;
  const uint64_t bits = uint64_t(data.size()) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_len - 1 - i] = uint8_t(bits >> (8 * i));
  Compress(state, tail);
  if (tail_len == 128) Compress(state, tail + 64);
  AuthToken out;
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = uint8_t(state[i] >> 24);
    out[4 * i + 1] = uint8_t(state[i] >> 16);
    out[4 * i + 2] = uint8_t(state[i] >> 8);
    out[4 * i + 3] = uint8_t(state[i]);
  }
  return out;
}

// Layout: u32 magic, u16 version, u16 flags, u64 ring addr, u32 rkey, u32 ring bytes,
// 32-byte token (zeros unless flags has kFlagToken).
void EncodeHello(const Hello& h, uint8_t* out) {
  std::memset(out, 0, kHelloBytes);
  Put32(out, kHelloMagic);
  Put16(out + 4, kHandshakeVersion);
  Put16(out + 6, h.has_token ? kFlagToken : 0);
  const uint64_t addr = htole64(h.ring_addr);
  std::memcpy(out + 8, &addr, 8);
  Put32(out + 16, h.ring_rkey);
  Put32(out + 20, h.ring_bytes);
  if (h.has_token) std::memcpy(out + 24, h.token.data(), h.token.size());
}

std::string DecodeHello(const void* data, size_t len, Hello* out) {
  if (data == nullptr || len < kHelloBytes) {
    return "handshake too short (" + std::to_string(data ? len : 0) + " bytes, need " +
           std::to_string(kHelloBytes) + ")";
  }
  const auto* p = static_cast<const uint8_t*>(data);
  if (Get32(p) != kHelloMagic) return "not an rdmarpc peer (bad handshake magic)";
  if (const uint16_t v = Get16(p + 4); v != kHandshakeVersion) {
    return "unsupported handshake version " + std::to_string(v) + " (this side speaks " +
           std::to_string(kHandshakeVersion) + ")";
  }
  const uint16_t flags = Get16(p + 6);
  if (flags & ~kFlagToken) return "unknown handshake flags " + std::to_string(flags);
  uint64_t addr;
  std::memcpy(&addr, p + 8, 8);
  out->ring_addr = le64toh(addr);
  out->ring_rkey = Get32(p + 16);
  out->ring_bytes = Get32(p + 20);
  out->has_token = (flags & kFlagToken) != 0;
  out->token = {};
  if (out->has_token) std::memcpy(out->token.data(), p + 24, out->token.size());
  return "";
}

Refusal RefusalForBadHello(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (p != nullptr && len >= 6 && Get32(p) == kHelloMagic && Get16(p + 4) != kHandshakeVersion) {
    return Refusal::kBadVersion;
  }
  return Refusal::kServerError;
}

// Layout: u32 magic, u16 version, u16 refusal code.
void EncodeAnswer(Refusal r, uint8_t* out) {
  Put32(out, kHelloMagic);
  Put16(out + 4, kHandshakeVersion);
  Put16(out + 6, static_cast<uint16_t>(r));
}

std::string DecodeAnswer(const void* data, size_t len, Refusal* out) {
  if (data == nullptr || len < kAnswerBytes) return "handshake answer too short";
  const auto* p = static_cast<const uint8_t*>(data);
  if (Get32(p) != kHelloMagic) return "not an rdmarpc server (bad handshake magic)";
  // The version is not checked: a server that refuses our version says so in its own.
  const uint16_t code = Get16(p + 6);
  if (code > static_cast<uint16_t>(Refusal::kServerError)) {
    return "unknown handshake answer " + std::to_string(code);
  }
  *out = static_cast<Refusal>(code);
  return "";
}

std::string RefusalText(Refusal r) {
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
  }
  return "refused";
}

Authenticator::Authenticator(std::string_view secret) : required_(!secret.empty()) {
  if (required_) token_ = Sha256(secret);
}

Refusal Authenticator::Check(const Hello& hello) const {
  if (!required_) return Refusal::kNone;
  // Constant time: how many leading bytes matched must not show in the timing.
  uint8_t diff = hello.has_token ? 0 : 1;
  for (size_t i = 0; i < token_.size(); ++i) diff |= uint8_t(hello.token[i] ^ token_[i]);
  return diff == 0 ? Refusal::kNone : Refusal::kBadSecret;
}

void Authenticator::Sign(Hello* hello) const {
  hello->has_token = required_;
  if (required_) hello->token = token_;
}

}  // namespace rdmarpc::transport

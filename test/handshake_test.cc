// The connection handshake codec and the authentication token (transport/handshake.h).
#include "transport/handshake.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>

using namespace rdmarpc::transport;

namespace {
std::string Hex(const AuthToken& t) {
  std::string out;
  char b[3];
  for (uint8_t c : t) {
    std::snprintf(b, sizeof b, "%02x", c);
    out += b;
  }
  return out;
}
}  // namespace

TEST_CASE("SHA-256 matches the FIPS 180-4 test vectors", "[handshake]") {
  CHECK(Hex(Sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Hex(Sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the padding spills into a second block.
  CHECK(Hex(Sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(Hex(Sha256(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("a HELLO round-trips, and a damaged one is refused with the reason", "[handshake]") {
  Authenticator auth("s3cret");
  Hello h;
  h.ring_addr = 0x1122334455667788ull;
  h.ring_rkey = 0xabcdef;
  h.ring_bytes = 1 << 20;
  auth.Sign(&h);
  uint8_t buf[kHelloBytes];
  EncodeHello(h, buf);
  Hello back;
  REQUIRE(DecodeHello(buf, sizeof buf, &back).empty());
  CHECK(back.ring_addr == h.ring_addr);
  CHECK(back.ring_rkey == h.ring_rkey);
  CHECK(back.ring_bytes == h.ring_bytes);
  CHECK(auth.Check(back) == Refusal::kNone);
  CHECK(Authenticator("other").Check(back) == Refusal::kBadSecret);
  Hello unsigned_hello;
  CHECK(auth.Check(unsigned_hello) == Refusal::kBadSecret);
  CHECK(Authenticator("").Check(unsigned_hello) == Refusal::kNone);

  CHECK_THAT(DecodeHello(buf, 20, &back), Catch::Contains("too short"));
  CHECK_THAT(DecodeHello(nullptr, 0, &back), Catch::Contains("too short"));
  uint8_t bad[kHelloBytes];
  std::memcpy(bad, buf, sizeof bad);
  bad[0] ^= 1;
  CHECK_THAT(DecodeHello(bad, sizeof bad, &back), Catch::Contains("not an rdmarpc peer"));
  CHECK(RefusalForBadHello(bad, sizeof bad) == Refusal::kServerError);
  std::memcpy(bad, buf, sizeof bad);
  bad[4] = 9;  // version
  CHECK_THAT(DecodeHello(bad, sizeof bad, &back), Catch::Contains("unsupported handshake version 9"));
  CHECK(RefusalForBadHello(bad, sizeof bad) == Refusal::kBadVersion);
  std::memcpy(bad, buf, sizeof bad);
  bad[7] = 0x80;  // unknown flag
  CHECK_THAT(DecodeHello(bad, sizeof bad, &back), Catch::Contains("unknown handshake flags"));
}

TEST_CASE("an ANSWER round-trips; unknown codes are errors", "[handshake]") {
  uint8_t buf[kAnswerBytes];
  for (Refusal r : {Refusal::kNone, Refusal::kBadSecret, Refusal::kBadVersion,
                    Refusal::kServerError}) {
    EncodeAnswer(r, buf);
    Refusal back;
    REQUIRE(DecodeAnswer(buf, sizeof buf, &back).empty());
    CHECK(back == r);
  }
  CHECK_THAT(RefusalText(Refusal::kBadSecret), Catch::Contains("authentication failed"));
  buf[6] = 77;
  Refusal back;
  CHECK_THAT(DecodeAnswer(buf, sizeof buf, &back), Catch::Contains("unknown handshake answer"));
  CHECK_FALSE(DecodeAnswer(buf, 3, &back).empty());
}

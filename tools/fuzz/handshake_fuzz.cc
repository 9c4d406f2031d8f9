// Fuzz target: the connection handshake parsers (transport/handshake.h): a HELLO as a server
// reads it from a TCP peer or from RDMA CM private data, and the ANSWER a client reads. What
// decodes must re-encode to the same fields; a server with a secret never accepts a HELLO the
// fuzzer made up (that would take forging an HMAC); a server without one accepts any.
#include <cstdlib>
#include <cstring>

#include "transport/handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmarpc::transport;
  static const Authenticator auth("fuzz secret");
  static const Authenticator open("");
  if (Expected<Hello> decoded = DecodeHello(data, size); decoded.ok()) {
    const Hello& h = decoded.value();
    uint8_t again[kHelloBytes];
    EncodeHello(h, again);
    if (std::memcmp(again, data, 32) != 0) std::abort();  // magic .. client nonce
    if (h.has_proof && std::memcmp(again + 32, data + 32, 24) != 0) std::abort();
    Nonce challenge{};
    if (open.Check(h, &challenge) != Refusal::kNone) std::abort();
    const Refusal r = auth.Check(h, &challenge);
    if (r == Refusal::kNone) std::abort();  // a forged proof got in
    if (r == Refusal::kChallenge && h.has_proof) std::abort();
    if (r == Refusal::kBadSecret && h.wants_auth && !h.has_proof) std::abort();
  } else {
    const Refusal r = RefusalForBadHello(data, size);
    if (r != Refusal::kBadVersion && r != Refusal::kServerError) std::abort();
  }
  if (Expected<Answer> decoded = DecodeAnswer(data, size); decoded.ok()) {
    const Answer& answer = decoded.value();
    (void)RefusalText(answer.code);
    if (size >= kAnswerBytes && data[4] == (kHandshakeVersion & 0xff) && data[5] == 0) {
      uint8_t again[kAnswerBytes];
      EncodeAnswer(answer, again);
      if (std::memcmp(again, data, kAnswerBytes) != 0) std::abort();
    }
  }
  return 0;
}

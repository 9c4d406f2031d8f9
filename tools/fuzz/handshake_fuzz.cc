// Fuzz target: the connection handshake parsers (transport/handshake.h): a HELLO as a server
// reads it from a TCP peer or from RDMA CM private data, and the ANSWER a client reads. What
// decodes must re-encode to the same fields (a busy answer: its code and reason); a server with a
// secret never accepts a HELLO the fuzzer made up (that would take forging an HMAC); a server
// without one accepts any.
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
    (void)RefusalText(answer.code, answer.busy);
    if (size >= kAnswerBytes && data[4] == (kHandshakeVersion & 0xff) && data[5] == 0) {
      uint8_t again[kAnswerBytes];
      EncodeAnswer(answer, again);
      // A busy answer keeps only its code and its reason (the byte when it is one this side
      // knows, else "not said"); every other answer all of its fields.
      size_t kept = kAnswerBytes;
      if (answer.code == Refusal::kBusy) {
        kept = 8;
        if (data[8] <= static_cast<uint8_t>(kLastBusyReason)) {
          if (answer.busy != BusyReason{data[8]}) std::abort();
          kept = 9;
        } else if (answer.busy != BusyReason::kUnstated) {
          std::abort();
        }
      }
      if (std::memcmp(again, data, kept) != 0) std::abort();
    }
  }
  return 0;
}

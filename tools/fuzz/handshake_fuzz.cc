// Fuzz target: the connection handshake parsers (transport/handshake.h): a HELLO as a server
// reads it from a TCP peer or from RDMA CM private data, and the ANSWER a client reads. What
// decodes must re-encode to the same fields; a token check never passes for a wrong token.
#include <cstdlib>
#include <cstring>

#include "transport/handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rdmarpc::transport;
  static const Authenticator auth("fuzz secret");
  static const Authenticator open("");
  Hello h;
  if (DecodeHello(data, size, &h).empty()) {
    uint8_t again[kHelloBytes];
    EncodeHello(h, again);
    if (std::memcmp(again, data, 24) != 0) std::abort();  // magic, version, flags, ring
    if (h.has_token && std::memcmp(again + 24, data + 24, 32) != 0) std::abort();
    if (open.Check(h) != Refusal::kNone) std::abort();
    Hello signed_hello = h;
    auth.Sign(&signed_hello);
    if (auth.Check(signed_hello) != Refusal::kNone) std::abort();
    if (auth.Check(h) == Refusal::kNone && h.token != signed_hello.token) std::abort();
  } else {
    const Refusal r = RefusalForBadHello(data, size);
    if (r != Refusal::kBadVersion && r != Refusal::kServerError) std::abort();
  }
  Refusal answer;
  if (DecodeAnswer(data, size, &answer).empty()) (void)RefusalText(answer);
  return 0;
}

// The connection handshake without a network: HMAC-SHA256 against RFC 4231's vectors, the HELLO
// and ANSWER codecs, and the challenge-response rules (mutual proof, no replay, no reuse across
// servers or after expiry), and a listener's verdict on a HELLO (transport/acceptor.h). The same
// exchange runs over real TCP and RDMA in reliability_test.
#include "transport/handshake.h"

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test/expected_text.h"
#include "transport/acceptor.h"
#include "transport/stats.h"

using namespace rdmarpc::transport;
using rdmarpc::testing::ErrorOf;

namespace {
std::string Hex(const std::array<uint8_t, 32>& d) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

// The full client/server exchange, in memory: what each side would send over the wire.
struct Exchange {
  Refusal first = Refusal::kNone;   // the server's answer to the first HELLO
  Refusal second = Refusal::kNone;  // ... and to the HELLO with the proof
  Hello proved;                     // the client's second HELLO
  std::string client_verdict;       // the client's check of the server's proof ("" = good)
};

Exchange Run(const Authenticator& client, const Authenticator& server) {
  Exchange x;
  Hello h = client.NewHello();
  Nonce challenge{};
  x.first = server.Check(h, &challenge);
  if (x.first == Refusal::kChallenge) {
    client.Prove(&h, challenge);
    Nonce unused{};
    x.second = server.Check(h, &unused);
  } else {
    x.second = x.first;
  }
  x.proved = h;
  if (x.second == Refusal::kNone) {
    Answer a;
    a.proof = server.ProveServer(h, Hello{});
    x.client_verdict = ErrorOf(client.CheckServer(h, Hello{}, a));
  }
  return x;
}

}  // namespace

TEST_CASE("HMAC-SHA256 matches RFC 4231", "[handshake]") {
  CHECK(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(Hex(HmacSha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than the block size is hashed first (test case 6).
  CHECK(Hex(HmacSha256(std::string(131, '\xaa'),
                       "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_CASE("a HELLO round-trips through its 56 bytes", "[handshake]") {
  Hello h;
  h.ring_addr = 0x7f00123456789abcull;
  h.ring_rkey = 0xdeadbeef;
  h.ring_bytes = 1 << 20;
  h.wants_auth = true;
  h.has_proof = true;
  for (int i = 0; i < 8; ++i) h.client_nonce[i] = uint8_t(i + 1), h.challenge[i] = uint8_t(40 + i);
  for (int i = 0; i < 16; ++i) h.proof[i] = uint8_t(0xa0 + i);
  uint8_t buf[kHelloBytes];
  EncodeHello(h, buf);
  auto decoded = DecodeHello(buf, sizeof buf);
  REQUIRE(decoded.ok());
  const Hello back = decoded.value();
  CHECK(back.ring_addr == h.ring_addr);
  CHECK(back.ring_rkey == h.ring_rkey);
  CHECK(back.ring_bytes == h.ring_bytes);
  CHECK(back.wants_auth);
  CHECK(back.has_proof);
  CHECK(back.client_nonce == h.client_nonce);
  CHECK(back.challenge == h.challenge);
  CHECK(back.proof == h.proof);

  CHECK_THAT(ErrorOf(DecodeHello(buf, 10)), Catch::Contains("too short"));
  uint8_t bad[kHelloBytes];
  std::memcpy(bad, buf, sizeof bad);
  bad[0] ^= 1;
  CHECK_THAT(ErrorOf(DecodeHello(bad, sizeof bad)), Catch::Contains("not an rdmarpc peer"));
  CHECK(RefusalForBadHello(bad, sizeof bad) == Refusal::kServerError);
  std::memcpy(bad, buf, sizeof bad);
  bad[4] = 2;  // the previous version (a static token) is refused by version, not misread
  CHECK_THAT(ErrorOf(DecodeHello(bad, sizeof bad)),
             Catch::Contains("unsupported handshake version 2"));
  CHECK(RefusalForBadHello(bad, sizeof bad) == Refusal::kBadVersion);
  std::memcpy(bad, buf, sizeof bad);
  bad[7] = 0x80;  // unknown flag
  CHECK_THAT(ErrorOf(DecodeHello(bad, sizeof bad)), Catch::Contains("unknown handshake flags"));
  std::memcpy(bad, buf, sizeof bad);
  bad[6] = 2;  // a proof without asking for authentication
  CHECK_FALSE(ErrorOf(DecodeHello(bad, sizeof bad)).empty());
}

TEST_CASE("an ANSWER round-trips; unknown codes are errors", "[handshake]") {
  uint8_t buf[kAnswerBytes];
  for (Refusal r : {Refusal::kNone, Refusal::kBadSecret, Refusal::kBadVersion,
                    Refusal::kServerError, Refusal::kChallenge, Refusal::kBusy}) {
    Answer a;
    a.code = r;
    a.challenge[3] = 7;
    a.proof[31] = 9;
    EncodeAnswer(a, buf);
    auto decoded = DecodeAnswer(buf, sizeof buf);
    REQUIRE(decoded.ok());
    const Answer back = decoded.value();
    CHECK(back.code == r);
    if (r == Refusal::kBusy) continue;  // carries which limit instead (see below)
    CHECK(back.challenge == a.challenge);
    CHECK(back.proof == a.proof);
  }
  CHECK_THAT(RefusalText(Refusal::kBadSecret), Catch::Contains("authentication failed"));
  CHECK_THAT(RefusalText(Refusal::kBusy), Catch::Contains("connection limit"));
  buf[6] = 77;
  CHECK_THAT(ErrorOf(DecodeAnswer(buf, sizeof buf)), Catch::Contains("unknown handshake answer"));
  CHECK_FALSE(DecodeAnswer(buf, 3).ok());
  // A refusal from a server of another version (8 bytes, as version 2 sent) is still understood.
  uint8_t old[8] = {0x52, 0x50, 0x43, 0x31, 2, 0, 2, 0};
  auto old_answer = DecodeAnswer(old, sizeof old);
  REQUIRE(old_answer.ok());
  CHECK(old_answer.value().code == Refusal::kBadVersion);
}

TEST_CASE("a busy ANSWER says which limit, and one that does not is still busy", "[handshake]") {
  uint8_t buf[kAnswerBytes];
  for (BusyReason why :
       {BusyReason::kUnstated, BusyReason::kConnectionLimit, BusyReason::kPeerLimit}) {
    Answer a;
    a.code = Refusal::kBusy;
    a.busy = why;
    EncodeAnswer(a, buf);
    auto decoded = DecodeAnswer(buf, sizeof buf);
    REQUIRE(decoded.ok());
    CHECK(decoded.value().code == Refusal::kBusy);
    CHECK(decoded.value().busy == why);
  }
  CHECK_THAT(RefusalText(Refusal::kBusy, BusyReason::kConnectionLimit),
             Catch::Contains("(max_connections)"));
  CHECK_THAT(RefusalText(Refusal::kBusy, BusyReason::kPeerLimit),
             Catch::Contains("one client address (max_connections_per_peer)"));
  // What a server before the reason sent: zeros where it goes (not said).
  Answer plain;
  plain.code = Refusal::kBusy;
  EncodeAnswer(plain, buf);
  CHECK(buf[8] == 0);
  CHECK(DecodeAnswer(buf, sizeof buf).value().busy == BusyReason::kUnstated);
  // A reason this side does not know: busy, not said.
  buf[8] = 200;
  auto unknown = DecodeAnswer(buf, sizeof buf);
  REQUIRE(unknown.ok());
  CHECK(unknown.value().code == Refusal::kBusy);
  CHECK(unknown.value().busy == BusyReason::kUnstated);
  // Only a busy answer carries one: a challenge's first byte is the challenge's.
  Answer challenge;
  challenge.code = Refusal::kChallenge;
  challenge.challenge[0] = 2;
  EncodeAnswer(challenge, buf);
  CHECK(DecodeAnswer(buf, sizeof buf).value().busy == BusyReason::kUnstated);
  CHECK(DecodeAnswer(buf, sizeof buf).value().challenge[0] == 2);
}

TEST_CASE("both sides prove the same secret; a wrong or missing one fails", "[handshake]") {
  const Authenticator server("correct horse battery staple");
  auto ok = Run(Authenticator("correct horse battery staple"), server);
  CHECK(ok.first == Refusal::kChallenge);
  CHECK(ok.second == Refusal::kNone);
  CHECK(ok.client_verdict.empty());

  CHECK(Run(Authenticator("wrong"), server).second == Refusal::kBadSecret);
  CHECK(Run(Authenticator(""), server).first == Refusal::kBadSecret);  // refused outright
  // A server without a secret takes anyone, but a client with a secret does not take it: the
  // server cannot prove what it does not know.
  auto open = Run(Authenticator("correct horse battery staple"), Authenticator(""));
  CHECK(open.second == Refusal::kNone);
  CHECK_THAT(open.client_verdict, Catch::Contains("did not prove"));
  CHECK(Run(Authenticator(""), Authenticator("")).client_verdict.empty());
}

TEST_CASE("a captured proof cannot be replayed or taken to another server", "[handshake]") {
  const Authenticator client("s3cret-s3cret-s3cret");
  const Authenticator server("s3cret-s3cret-s3cret");
  auto x = Run(client, server);
  REQUIRE(x.second == Refusal::kNone);
  Nonce unused{};
  // The very same HELLO again (an eavesdropper's replay): refused.
  CHECK(server.Check(x.proved, &unused) == Refusal::kBadSecret);
  // A copy of the server object shares its record of accepted proofs.
  const Authenticator same_server = server;
  CHECK(same_server.Check(x.proved, &unused) == Refusal::kBadSecret);
  // Another server with the same secret did not issue that challenge.
  const Authenticator other_server("s3cret-s3cret-s3cret");
  CHECK(other_server.Check(x.proved, &unused) == Refusal::kBadSecret);
  // Changing anything the proof covers breaks it: the ring fields, the nonce, the challenge.
  auto fresh = [&] {
    Hello h = client.NewHello();
    Nonce c{};
    REQUIRE(server.Check(h, &c) == Refusal::kChallenge);
    client.Prove(&h, c);
    return h;
  };
  Hello h = fresh();
  h.ring_rkey ^= 1;
  CHECK(server.Check(h, &unused) == Refusal::kBadSecret);
  h = fresh();
  h.client_nonce[0] ^= 1;
  CHECK(server.Check(h, &unused) == Refusal::kBadSecret);
  h = fresh();
  h.challenge[0] ^= 1;  // the issue time: not a challenge this server made
  CHECK(server.Check(h, &unused) == Refusal::kBadSecret);
  // Two clients challenged in the same second are both served (challenges differ per nonce).
  Hello a = fresh(), b = fresh();
  CHECK(server.Check(a, &unused) == Refusal::kNone);
  CHECK(server.Check(b, &unused) == Refusal::kNone);
  // A server proof answers one client nonce only.
  Answer answer;
  answer.proof = server.ProveServer(a, Hello{});
  CHECK(client.CheckServer(a, Hello{}, answer).ok());
  CHECK_FALSE(client.CheckServer(b, Hello{}, answer).ok());
}

TEST_CASE("a challenge expires", "[handshake]") {
  const Authenticator client("k"), server("k");
  const uint32_t t0 = Authenticator::NowSeconds();
  auto proved_at = [&](uint32_t issued_at) {
    Hello h = client.NewHello();
    Nonce c{};
    REQUIRE(server.CheckAt(h, &c, issued_at) == Refusal::kChallenge);
    client.Prove(&h, c);
    return h;
  };
  Nonce unused{};
  CHECK(server.CheckAt(proved_at(t0), &unused, t0 + kChallengeLifetimeS) == Refusal::kNone);
  CHECK(server.CheckAt(proved_at(t0), &unused, t0 + kChallengeLifetimeS + 1) ==
        Refusal::kBadSecret);
  // Nor is a challenge from the future taken (a clock cannot run backwards here).
  CHECK(server.CheckAt(proved_at(t0 + 100), &unused, t0) == Refusal::kBadSecret);
}

// What both listeners (tcp, rdma) decide with transport/acceptor.h.
TEST_CASE("a listener's verdict on a HELLO: go on, challenge, or refuse saying why",
          "[handshake]") {
  boost::asio::io_context io1, io2;
  auto core = [&](std::string secret) {
    Options o;
    o.auth_secret = std::move(secret);
    return std::make_unique<AcceptorCore>(
        std::vector<Executor>{io1.get_executor(), io2.get_executor()},
        [](std::shared_ptr<Connection>) {}, o);
  };
  uint8_t buf[kHelloBytes];
  std::string why;
  auto screen = [&](AcceptorCore& c, const uint8_t* bytes, size_t n, bool retry) {
    why.clear();
    return c.Screen(bytes, n, DecodeHello(bytes, n), retry, "tcp://127.0.0.1:1", &why);
  };

  auto open = core("");
  EncodeHello(Authenticator("").NewHello(), buf);
  CHECK(screen(*open, buf, sizeof buf, false).code == Refusal::kNone);
  CHECK(why.empty());
  // Not a HELLO: refused, saying what the decoder found.
  const uint8_t junk[kHelloBytes] = {1, 2, 3};
  CHECK(screen(*open, junk, sizeof junk, false).code == Refusal::kServerError);
  CHECK_FALSE(why.empty());

  // With a secret: challenged first; the same HELLO again (no proof) is refused; with the proof
  // it goes on.
  auto guarded = core("s3cret");
  Authenticator client("s3cret");
  Hello h = client.NewHello();
  EncodeHello(h, buf);
  const Answer challenge = screen(*guarded, buf, sizeof buf, false);
  REQUIRE(challenge.code == Refusal::kChallenge);
  CHECK(why.empty());
  CHECK(screen(*guarded, buf, sizeof buf, true).code == Refusal::kBadSecret);
  CHECK(why == RefusalText(Refusal::kBadSecret));
  client.Prove(&h, challenge.challenge);
  EncodeHello(h, buf);
  CHECK(screen(*guarded, buf, sizeof buf, true).code == Refusal::kNone);
  CHECK(why.empty());

  // Accepted connections go to the I/O threads in turn.
  CHECK(open->NextExecutor() == Executor(io1.get_executor()));
  CHECK(open->NextExecutor() == Executor(io2.get_executor()));
  CHECK(open->NextExecutor() == Executor(io1.get_executor()));
}

// Options::max_handshakes, decided where both listeners (tcp, rdma) decide it, without the
// timing a flood over a real socket depends on: the set-ups' threads (here one io_context) are
// not run until the test says so, as when a flood outpaces them.
TEST_CASE(
    "connections in set-up: at the bound the oldest gives up, at twice the bound new ones are "
    "refused as busy",
    "[handshake][limits]") {
  boost::asio::io_context io;
  Options o;
  o.max_handshakes = 4;
  AcceptorCore core(
      {io.get_executor()}, [](std::shared_ptr<Connection>) {}, o);
  struct Tracked {
    std::shared_ptr<AcceptorCore::SetUp> set_up;
    std::unique_ptr<AcceptorCore::SetUpEnd> end;
    bool gave_up = false;
  };
  std::vector<std::unique_ptr<Tracked>> set_ups;
  auto begin = [&] {
    auto t = std::make_unique<Tracked>();
    t->set_up = core.BeginSetUp(io.get_executor());
    t->end = std::make_unique<AcceptorCore::SetUpEnd>(core, t->set_up);
    Tracked* raw = t.get();
    t->set_up->give_up.slot().assign(
        [raw](boost::asio::cancellation_type) { raw->gave_up = true; });
    set_ups.push_back(std::move(t));
  };
  const auto before = Snapshot();
  // Below the bound: let in, nobody gives up.
  for (int i = 0; i < 4; ++i) {
    REQUIRE(core.MakeRoom("tcp", "tcp://127.0.0.1:1"));
    begin();
  }
  io.poll();
  io.restart();
  for (const auto& t : set_ups) CHECK_FALSE(t->gave_up);
  // At the bound: each new one is let in and the oldest still in set-up is told to give up, on
  // its own thread (so not yet).
  for (int i = 0; i < 4; ++i) {
    REQUIRE(core.MakeRoom("tcp", "tcp://127.0.0.1:1"));
    begin();
  }
  CHECK_FALSE(set_ups[0]->gave_up);
  // Twice the bound in set-up (the give-ups have not run): refused as busy, and counted.
  CHECK_FALSE(core.MakeRoom("rdma", "rdma://127.0.0.1:1"));
  CHECK_FALSE(core.MakeRoom("tcp", "tcp://127.0.0.1:1"));
  io.poll();
  io.restart();
  for (int i = 0; i < 8; ++i) {
    INFO("set-up " << i);
    CHECK(set_ups[i]->gave_up == (i < 4));  // the four oldest, not the newer ones
  }
  const auto after = Snapshot();
  CHECK(Get(after, Stat::kRefusedHandshakes) - Get(before, Stat::kRefusedHandshakes) == 2);
  CHECK(Get(after, Stat::kHandshakesGivenUp) - Get(before, Stat::kHandshakesGivenUp) == 4);
  // A set-up that ends (here the oldest, having given up) makes room again.
  set_ups[0]->end.reset();
  CHECK(core.MakeRoom("tcp", "tcp://127.0.0.1:1"));

  // No bound (0): never refused, nobody gives up.
  Options unbounded;
  unbounded.max_handshakes = 0;
  AcceptorCore open(
      {io.get_executor()}, [](std::shared_ptr<Connection>) {}, unbounded);
  std::vector<std::unique_ptr<AcceptorCore::SetUpEnd>> many;
  for (int i = 0; i < 100; ++i) {
    REQUIRE(open.MakeRoom("tcp", "tcp://127.0.0.1:1"));
    many.push_back(
        std::make_unique<AcceptorCore::SetUpEnd>(open, open.BeginSetUp(io.get_executor())));
  }
}

// (A name that does not resolve is left to the tests that may wait on the resolver.)
TEST_CASE("a listener binds localhost as 127.0.0.1, and addresses as they are", "[handshake]") {
  auto local = ListenAddress(Endpoint{Scheme::kTcp, "localhost", 0});
  REQUIRE(local.ok());
  CHECK(local.value().to_string() == "127.0.0.1");
  auto v6 = ListenAddress(Endpoint{Scheme::kTcp, "::1", 0});
  REQUIRE(v6.ok());
  CHECK(v6.value().is_v6());
}

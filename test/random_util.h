// Randomness for the randomized hostile tests (hostile_random_test: clients that send what no
// client should; hostile_server_test's random case: a server that answers what no server should).
// Each run prints its seed; RDMARPC_TEST_SEED=N replays one run's choices.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

#include "rpc/internal/frame.h"
#include "rpc/metadata.h"

namespace rdmarpc::testing {

using Rng = std::mt19937_64;

// RDMARPC_TEST_SEED when set, else a fresh one.
inline uint64_t TestSeed() {
  if (const char* s = std::getenv("RDMARPC_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

inline size_t Below(Rng& rng, size_t n) {
  return std::uniform_int_distribution<size_t>(0, n - 1)(rng);
}
inline bool Chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// Up to `max` random bytes.
inline std::string RandomBytes(Rng& rng, size_t max) {
  std::string s(Below(rng, max + 1), '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A frame's metadata: usually none, sometimes a "mode" entry (what the test service reads to
// stall or stop a stream) or an entry of random text, sometimes bytes that are not metadata.
inline std::string RandomMetadata(Rng& rng) {
  const size_t pick = Below(rng, 10);
  if (pick < 5) return {};
  Metadata md;
  if (pick < 7) {
    md.emplace_back("mode",
                    Chance(rng, 0.5) ? "stall" : "stop-after:" + std::to_string(Below(rng, 5)));
  } else if (pick < 9) {
    md.emplace_back(RandomBytes(rng, 20), RandomBytes(rng, 40));
  } else {
    return RandomBytes(rng, 40);
  }
  std::string raw(MetadataEncodedSize(md), '\0');
  EncodeMetadata(md, reinterpret_cast<std::byte*>(raw.data()));
  return raw;
}

}  // namespace rdmarpc::testing

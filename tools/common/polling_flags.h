// The RDMA polling flags the samples and the benchmark take (--busy-poll, --poll-spin-us), and
// what they set in transport::Options. One place, so that the binaries agree.
#pragma once

#include <map>
#include <string>

#include "tools/common/flags.h"
#include "transport/transport.h"

namespace rdmarpc::cmdline {

// Merge into the map given to Flags.
inline std::map<std::string, bool> WithPollingFlags(std::map<std::string, bool> known) {
  known["busy-poll"] = false;
  known["poll-spin-us"] = true;
  return known;
}

// Sets busy_poll and poll_spin_us from the flags (keeping the environment's defaults when
// absent); a bad value sets flags.error().
inline void ApplyPollingFlags(Flags& flags, transport::Options& o) {
  if (flags.has("busy-poll")) o.busy_poll = true;
  o.poll_spin_us = static_cast<int>(flags.get_int("poll-spin-us", o.poll_spin_us, 0, 10'000'000));
}

}  // namespace rdmarpc::cmdline

// The samples' and tools' flag parsing (tools/common/flags.h, on Boost.Program_options): what a
// user types and the one-line errors the programs print for it.
#include "tools/common/flags.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using rdmarpc::cmdline::Flags;

namespace {
// Parses `args` (after a program name) with the flags --listen, --threads (values), --verbose and
// --help (switches).
Flags Parse(std::vector<std::string> args, bool positional = false) {
  static std::vector<std::string> keep;
  keep = std::move(args);
  keep.insert(keep.begin(), "prog");
  static std::vector<char*> argv;
  argv.clear();
  for (auto& a : keep) argv.push_back(a.data());
  return Flags(static_cast<int>(argv.size()), argv.data(),
               {{"listen", true}, {"threads", true}, {"verbose", false}, {"help", false}},
               positional);
}
}  // namespace

TEST_CASE("flags take values as --name=value and --name value, and may repeat", "[flags]") {
  Flags f = Parse({"--listen=tcp://a:1", "--listen", "tcp://b:2", "--threads", "4", "--verbose"});
  REQUIRE(f.error().empty());
  CHECK(f.all("listen") == std::vector<std::string>{"tcp://a:1", "tcp://b:2"});
  CHECK(f.get("listen", "") == "tcp://b:2");
  CHECK(f.get_int("threads", 1, 1, 8) == 4);
  CHECK(f.has("verbose"));
  CHECK_FALSE(f.has("help"));
  CHECK(f.get("absent", "fallback") == "fallback");
  CHECK(Parse({"-h"}).has("help"));
  CHECK(Parse({"--help"}).has("help"));
}

TEST_CASE("flag errors name the flag", "[flags]") {
  CHECK(Parse({"--frobnicate"}).error() == "unknown flag --frobnicate");
  CHECK(Parse({"--frobnicate=3"}).error() == "unknown flag --frobnicate");
  CHECK(Parse({"--threads"}).error() == "flag --threads needs a value");
  CHECK(Parse({"--verbose=yes"}).error() == "flag --verbose takes no value");
  CHECK(Parse({"stray"}).error() == "unexpected argument 'stray'");
  // Never abbreviated: --thr is not --threads.
  CHECK(Parse({"--thr", "2"}).error() == "unknown flag --thr");
  Flags f = Parse({"--threads", "x"});
  CHECK(f.get_int("threads", 1, 1, 8) == 1);
  CHECK(f.error() == "--threads must be a number from 1 to 8, got 'x'");
  Flags n = Parse({"--threads", "-3"});
  n.get_int("threads", 1, 1, 8);
  CHECK(n.error() == "--threads must be a number from 1 to 8, got '-3'");
  Flags g = Parse({"--threads=-3"});
  g.get_int("threads", 1, 1, 8);
  CHECK(g.error() == "--threads must be a number from 1 to 8, got '-3'");
}

TEST_CASE("positional arguments are kept in order; -- ends the flags", "[flags]") {
  Flags f = Parse({"get", "--threads", "2", "key", "--", "--verbose", "-x"}, true);
  REQUIRE(f.error().empty());
  CHECK(f.positional() == std::vector<std::string>{"get", "key", "--verbose", "-x"});
  CHECK_FALSE(f.has("verbose"));
  CHECK(f.get("threads", "") == "2");
}

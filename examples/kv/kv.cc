// kv: command-line client for kv_server, over one server or several (sharded by key).
//
//   kv --targets tcp://127.0.0.1:7480 put greeting hello
//   kv --targets tcp://h1:7480,tcp://h2:7480,tcp://h3:7480 scan --start a --end b
#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <climits>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "examples/kv/kv_client.h"
#include "rpc/logging.h"
#include "tools/common/flags.h"

namespace asio = boost::asio;
using rdmarpc::EscapeForDisplay;
using rdmarpc::Status;

namespace {

constexpr char kUsage[] =
    "usage: kv [--targets URI[,URI...]]... [--timeout-ms N] [--log-level L] COMMAND [ARGS]\n"
    "       kv --help | -h\n"
    "\n"
    "Commands:\n"
    "  get KEY                          print KEY's value and version\n"
    "  put KEY VALUE [--expect-version N]  write (N: only if the version is N; 0 = absent)\n"
    "  delete KEY [--expect-version N]  remove\n"
    "  mget KEY...                      several keys at once\n"
    "  scan [--start K] [--end K] [--after K] [--limit N] [--all]\n"
    "                                   keys in [start, end) in order (after K if given);\n"
    "                                   --all follows every page\n"
    "  info                             each server's state (up or DOWN and why), engine, key\n"
    "                                   count and uptime\n"
    "  watch PREFIX [--after-version N] [--count N]\n"
    "                                   print every change to keys starting with PREFIX as it\n"
    "                                   happens (after version N: replay from there), until\n"
    "                                   interrupted or N changes; one server only (versions are\n"
    "                                   per server); no deadline unless --timeout-ms is given\n"
    "  bench [--count N] [--concurrency N] [--value-bytes N]\n"
    "                                   put N keys, then get them; prints calls/s and latency\n"
    "\n"
    "  --targets URIs   servers (default tcp://127.0.0.1:7480); several, comma-separated or\n"
    "                   repeated, spread keys over the servers by consistent hashing.\n"
    "                   A dead server costs only its keys: calls for them fail with\n"
    "                   UNAVAILABLE naming it; keys on the others keep working.\n"
    "  --timeout-ms N   per-call deadline (default 5000; 0 = none).\n"
    "  --auth-secret-file F  present the secret in file F (for servers that require one).\n"
    "  --log-level L    trace|debug|info|warn|error|off (default $RDMARPC_LOG_LEVEL or warn).\n"
    "\n"
    "Values print as text with non-printable bytes as \\xNN.\n"
    "Exit codes: 0 done, 1 a call failed (e.g. ABORTED on a version mismatch, UNAVAILABLE for a\n"
    "key on a dead server; for mget and info: any key or server), 2 bad arguments, 3 could not\n"
    "connect to any server, 4 key not found (get).\n";

std::string Printable(const std::string& s) {
  std::string out;
  char buf[8];
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

int Fail(const Status& s) {
  std::cerr << "kv: " << s.ToString() << "\n";
  return 1;
}

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(v.size() * q))];
}

struct Args {
  std::vector<std::string> targets;
  std::string command;
  std::vector<std::string> operands;
  rdmarpc::cmdline::Flags* flags;
  long timeout_ms, limit, count, concurrency, value_bytes;
  long after_version = 0;
  std::optional<uint64_t> expected;
  std::string secret;  // --auth-secret-file
};

asio::awaitable<int> Bench(kv::ShardedClient& client, long count, long concurrency,
                           long value_bytes) {
  auto ex = co_await asio::this_coro::executor;
  const std::string value(static_cast<size_t>(value_bytes), 'v');
  for (const char* phase : {"put", "get"}) {
    std::vector<double> lat;
    lat.reserve(count);
    long next = 0, failed = 0, running = concurrency;
    asio::steady_timer done(ex, asio::steady_timer::time_point::max());
    const auto start = std::chrono::steady_clock::now();
    for (long w = 0; w < concurrency; ++w) {
      asio::co_spawn(
          ex,
          [&]() -> asio::awaitable<void> {
            while (next < count) {
              const std::string key = "bench/" + std::to_string(next++);
              const auto t0 = std::chrono::steady_clock::now();
              bool ok;
              if (phase[0] == 'p') {
                ok = (co_await client.Put(key, value)).ok();
              } else {
                auto r = co_await client.Get(key);
                ok = r.ok() && r->found() && r->value().size() == value.size();
              }
              lat.push_back(
                  std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                      .count());
              if (!ok) ++failed;
            }
            if (--running == 0) done.expires_at(asio::steady_timer::time_point::min());
          },
          asio::detached);
    }
    while (running > 0) co_await done.async_wait(asio::as_tuple(asio::use_awaitable));
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %ld calls, %ld failed, %.3f s, %.0f calls/s, p50 %.1f us, p99 %.1f us\n",
                phase, count, failed, secs, count / secs, Percentile(lat, 0.5),
                Percentile(lat, 0.99));
    if (failed) co_return 1;
  }
  co_return 0;
}

// kv watch: a server stream of changes, printed as they come.
asio::awaitable<int> Watch(const Args& a) {
  if (a.targets.size() != 1) {
    std::cerr << "kv: watch takes one server (--targets with one URI): versions are per server\n";
    co_return 2;
  }
  rdmarpc::ChannelOptions options;
  options.transport.auth_secret = a.secret;
  auto ch = co_await rdmarpc::Channel::Connect(a.targets[0], options);
  if (!ch.ok()) {
    std::cerr << "kv: cannot connect: " << EscapeForDisplay(ch.status().message()) << "\n";
    co_return 3;
  }
  kv::KV::Stub stub(*ch);
  kv::WatchRequest req;
  req.set_prefix(a.operands[0]);
  req.set_after_version(static_cast<uint64_t>(a.after_version));
  rdmarpc::CallOptions o;
  if (a.flags->has("timeout-ms")) o.timeout = std::chrono::milliseconds(a.timeout_ms);
  const long want = a.flags->has("count") ? a.count : 0;
  auto call = co_await stub.Watch(req, o);
  long n = 0;
  while (auto ev = co_await call.Read()) {
    if (ev->kind() == kv::WatchEvent::DELETE) {
      std::cout << "delete\t" << Printable(ev->key()) << "\t(version " << ev->version() << ")"
                << std::endl;
    } else {
      std::cout << "put\t" << Printable(ev->key()) << "\t" << Printable(ev->value())
                << "\t(version " << ev->version() << ")" << std::endl;
    }
    if (want != 0 && ++n >= want) co_return 0;  // dropping the reader cancels the stream
  }
  Status s = co_await call.Finish();
  if (!s.ok()) co_return Fail(s);
  co_return 0;
}

asio::awaitable<int> Run(Args a) {
  if (a.command == "watch") co_return co_await Watch(a);
  rdmarpc::ChannelOptions options;
  options.transport.auth_secret = a.secret;
  auto connected = co_await kv::ShardedClient::Connect(a.targets, options);
  if (!connected.ok()) {
    std::cerr << "kv: cannot connect: " << EscapeForDisplay(connected.status().message()) << "\n";
    co_return 3;
  }
  kv::ShardedClient& client = **connected;
  client.call_options().timeout = std::chrono::milliseconds(a.timeout_ms);
  // A dead server costs only its own keys; say so once (info shows it in its table instead).
  if (a.command != "info") {
    for (size_t i = 0; i < client.targets().size(); ++i) {
      if (!client.shard_down(i).ok()) {
        std::cerr << "kv: warning: " << client.targets()[i] << " is down ("
                  << EscapeForDisplay(client.shard_down(i).message())
                  << "); calls for its keys fail with UNAVAILABLE\n";
      }
    }
  }
  auto& f = *a.flags;
  const auto expected = a.expected;
  const auto& ops = a.operands;
  if (a.command == "get") {
    auto r = co_await client.Get(ops[0]);
    if (!r.ok()) co_return Fail(r.status());
    if (!r->found()) {
      std::cerr << "kv: " << Printable(ops[0]) << ": not found\n";
      co_return 4;
    }
    std::cout << Printable(r->value()) << "\t(version " << r->version() << ")\n";
  } else if (a.command == "put") {
    auto r = co_await client.Put(ops[0], ops[1], expected);
    if (!r.ok()) co_return Fail(r.status());
    std::cout << "ok (version " << r->version() << ")\n";
  } else if (a.command == "delete") {
    auto r = co_await client.Delete(ops[0], expected);
    if (!r.ok()) co_return Fail(r.status());
    std::cout << (r->existed() ? "deleted\n" : "was not there\n");
  } else if (a.command == "mget") {
    auto r = co_await client.MultiGet(ops);
    int failed = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      std::cout << Printable(ops[i]) << "\t";
      if (!r[i].ok()) {
        ++failed;
        std::cout << "(" << r[i].status().ToString() << ")\n";
        continue;
      }
      const auto& g = *r[i];
      std::cout << (g.found()
                        ? Printable(g.value()) + "\t(version " + std::to_string(g.version()) + ")"
                        : std::string("(not found)"))
                << "\n";
    }
    if (failed) {
      std::cerr << "kv: " << failed << " of " << ops.size() << " keys could not be read\n";
      co_return 1;
    }
  } else if (a.command == "scan") {
    kv::ScanRequest req;
    req.set_start(f.get("start", ""));
    req.set_end(f.get("end", ""));
    req.set_after(f.get("after", ""));
    req.set_limit(static_cast<uint32_t>(a.limit));
    const bool all = f.has("all");
    for (;;) {
      auto r = co_await client.Scan(req);
      if (!r.ok()) co_return Fail(r.status());
      for (const auto& e : r->entries()) {
        std::cout << Printable(e.key()) << "\t" << Printable(e.value()) << "\t(version "
                  << e.version() << ")\n";
      }
      if (!r->more()) break;
      if (!all) {
        std::cout << "... more: add --all, or continue with --after '"
                  << Printable(r->continuation()) << "'\n";
        break;
      }
      req.set_after(r->continuation());
    }
  } else if (a.command == "info") {
    auto r = co_await client.Info();
    int down = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      if (!r[i].ok()) {
        ++down;
        std::cout << client.targets()[i] << ": DOWN: " << r[i].status().ToString() << "\n";
        continue;
      }
      const auto& in = *r[i];
      std::cout << client.targets()[i] << ": up, engine " << in.engine() << ", " << in.keys()
                << " keys, version " << in.version() << ", up " << in.uptime_s() << " s"
                << (in.data_dir().empty() ? "" : ", data in " + in.data_dir()) << "\n";
    }
    if (down) co_return 1;  // the table is printed either way; scripts see the exit code
  } else if (a.command == "bench") {
    co_return co_await Bench(client, a.count, a.concurrency, a.value_bytes);
  }
  co_return 0;
}

}  // namespace

int main(int argc, char** argv) {
  rdmarpc::cmdline::Flags flags(argc, argv,
                                {{"targets", true},
                                 {"timeout-ms", true},
                                 {"log-level", true},
                                 {"expect-version", true},
                                 {"start", true},
                                 {"end", true},
                                 {"after", true},
                                 {"after-version", true},
                                 {"limit", true},
                                 {"all", false},
                                 {"count", true},
                                 {"concurrency", true},
                                 {"value-bytes", true},
                                 {"auth-secret-file", true},
                                 {"help", false}},
                                /*positional=*/true);
  if (flags.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  Args a;
  a.flags = &flags;
  a.timeout_ms = flags.get_int("timeout-ms", 5000, 0, 86400000);
  a.secret = flags.auth_secret();
  for (const auto& t : flags.all("targets")) {
    std::stringstream ss(t);
    std::string one;
    while (std::getline(ss, one, ',')) {
      if (!one.empty()) a.targets.push_back(one);
    }
  }
  std::string bad = flags.error();
  if (a.targets.empty()) {
    if (flags.has("targets")) {
      if (bad.empty()) bad = "--targets names no server";
    } else {
      a.targets.push_back("tcp://127.0.0.1:7480");
    }
  }
  const auto& pos = flags.positional();
  if (bad.empty() && pos.empty()) bad = "no command given";
  if (bad.empty()) {
    a.command = pos[0];
    a.operands.assign(pos.begin() + 1, pos.end());
    const std::map<std::string, std::pair<size_t, size_t>> arity = {
        {"get", {1, 1}},  {"put", {2, 2}},  {"delete", {1, 1}}, {"mget", {1, SIZE_MAX}},
        {"scan", {0, 0}}, {"info", {0, 0}}, {"bench", {0, 0}},  {"watch", {1, 1}}};
    auto it = arity.find(a.command);
    if (it == arity.end()) {
      bad = "unknown command '" + a.command + "'";
    } else if (a.operands.size() < it->second.first || a.operands.size() > it->second.second) {
      bad = "wrong number of arguments for '" + a.command + "'";
    }
  }
  // Numbers are checked before anything connects.
  a.limit = flags.get_int("limit", 100, 1, 10000);
  a.count = flags.get_int("count", 10000, 1, 100000000);
  a.concurrency = flags.get_int("concurrency", 16, 1, 4096);
  a.value_bytes = flags.get_int("value-bytes", 100, 0, 64 << 20);
  a.after_version = flags.get_int("after-version", 0, 0, LONG_MAX);
  if (flags.has("expect-version")) {
    a.expected = static_cast<uint64_t>(flags.get_int("expect-version", 0, 0, LONG_MAX));
  }
  if (bad.empty()) bad = flags.error();
  if (bad.empty() && !rdmarpc::InitLogging(flags.get("log-level", ""), "warn")) {
    bad = rdmarpc::LogLevelError(flags.get("log-level", ""));
  }
  if (!bad.empty()) {
    std::cerr << "kv: " << bad << "\n(see kv --help)\n";
    return 2;
  }
  asio::io_context ioc(1);
  auto result = asio::co_spawn(ioc, Run(std::move(a)), asio::use_future);
  ioc.run();
  return result.get();
}

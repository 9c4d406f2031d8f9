// The key-value sample (examples/kv): every method on both engines through the RPC layer,
// durability across restarts of the real kv_server binary, sharding over three servers, and
// compare-and-set under concurrent writers.
#include <rocksdb/db.h>

#include <atomic>
#include <boost/asio/detached.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "examples/kv/engine.h"
#include "examples/kv/kv_client.h"
#include "examples/kv/kv_service.h"
#include "test/process_util.h"
#include "test/test_util.h"

namespace asio = boost::asio;
using namespace rdmarpc;
using namespace rdmarpc::testing;
using namespace std::chrono_literals;

namespace {

// A fresh folder under the test's temporary directory, removed at the end.
struct TempDir {
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/kvtest.XXXXXX";
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

// A KV server in this process on one engine.
struct KvServer {
  KvServer(const std::string& engine_name, const std::string& listen = "tcp://127.0.0.1:0",
           size_t history_events = kv::KvService::kHistoryEvents)
      : server(ServerOptions{.io_threads = 2}) {
    if (engine_name == "rocksdb") {
      dir = std::make_unique<TempDir>();
      auto e = kv::OpenRocksDbEngine(dir->path, false);
      if (!e.ok()) throw std::runtime_error(e.status().ToString());
      engine = std::move(*e);
    } else {
      engine = kv::NewMemoryEngine();
    }
    service = std::make_unique<kv::KvService>(*engine, "", history_events);
    if (!server.AddService(*service).ok()) throw std::runtime_error("AddService failed");
    auto bound = server.Listen(listen);
    if (!bound.ok()) throw std::runtime_error(bound.status().ToString());
    uri = *bound;
    server.Start();
  }
  ~KvServer() { server.Shutdown(); }

  std::unique_ptr<TempDir> dir;
  std::unique_ptr<kv::Engine> engine;
  std::unique_ptr<kv::KvService> service;
  Server server;
  std::string uri;
};

// Runs `body` with a client of `targets` on a fresh event loop.
template <class F>
void WithClient(std::vector<std::string> targets, F body) {
  RunLoop([&]() -> asio::awaitable<void> {
    auto c = co_await kv::ShardedClient::Connect(targets);
    if (!c.ok()) throw std::runtime_error("connect: " + c.status().ToString());
    co_await body(**c);
  }());
}

std::string AllBytes() {
  std::string s;
  for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  return s;
}

// Starts examples/kv/kv_server with `args` and returns it with the address it bound.
std::pair<std::unique_ptr<Child>, std::string> StartKvServer(std::vector<std::string> args) {
  args.insert(args.begin(), Runfile("examples/kv/kv_server"));
  args.insert(args.end(), {"--listen", "tcp://127.0.0.1:0"});
  return StartServer(args);
}

// Added to what a server's resident memory may grow by in the memory-bound cases below: under
// a sanitizer (see kRssMeaningful) the figures are only printed.
constexpr double kSanitizerSlackMiB = kRssMeaningful ? 0 : 1e9;

// The bytes of the regular files under `path`.
uintmax_t FolderBytes(const std::string& path) {
  uintmax_t total = 0;
  for (const auto& f : std::filesystem::recursive_directory_iterator(path)) {
    if (f.is_regular_file()) total += f.file_size();
  }
  return total;
}

std::string Key(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "key/%06d", i);
  return buf;
}

}  // namespace

TEST_CASE("KV: Get, Put, Delete, MultiGet and Scan behave as documented", "[kv]") {
  const std::string engine = GENERATE(as<std::string>{}, "memory", "rocksdb");
  const std::string listen = GENERATE(from_range(ListenUris()));
  INFO("engine: " << engine << ", listening on " << listen);
  KvServer s(engine, listen);
  WithClient({s.uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
    // Missing keys.
    auto miss = co_await c.Get("nope");
    REQUIRE(miss.ok());
    CHECK_FALSE(miss->found());
    CHECK(miss->version() == 0);
    auto del_miss = co_await c.Delete("nope");
    REQUIRE(del_miss.ok());
    CHECK_FALSE(del_miss->existed());

    // Put and Get, an empty value, binary keys and values, 1 MiB.
    auto v1 = co_await c.Put("a", "alpha");
    REQUIRE(v1.ok());
    CHECK(v1->version() > 0);
    auto got = co_await c.Get("a");
    REQUIRE(got.ok());
    CHECK(got->found());
    CHECK(got->value() == "alpha");
    CHECK(got->version() == v1->version());

    auto put_empty = co_await c.Put("empty", "");
    REQUIRE(put_empty.ok());
    auto empty = co_await c.Get("empty");
    REQUIRE(empty.ok());
    CHECK(empty->found());
    CHECK(empty->value().empty());

    const std::string bin_key = std::string("\0k\xff", 3), bin_value = AllBytes();
    auto put_bin = co_await c.Put(bin_key, bin_value);
    REQUIRE(put_bin.ok());
    auto bin = co_await c.Get(bin_key);
    REQUIRE(bin.ok());
    CHECK(bin->value() == bin_value);
    auto prefix = co_await c.Get(std::string("\0k", 2));
    CHECK_FALSE(prefix->found());  // a prefix is another key

    const std::string big = Pattern(1 << 20, 7);
    auto put_big = co_await c.Put("big", big);
    REQUIRE(put_big.ok());
    auto big_got = co_await c.Get("big");
    REQUIRE(big_got.ok());
    CHECK(big_got->value() == big);

    // Compare-and-set.
    auto create = co_await c.Put("cas", "v0", 0);  // 0 = only if absent
    REQUIRE(create.ok());
    auto again = co_await c.Put("cas", "other", 0);
    REQUIRE_FALSE(again.ok());
    CHECK(again.status().code() == StatusCode::kAborted);
    auto stale = co_await c.Put("cas", "other", create->version() + 1000);
    REQUIRE_FALSE(stale.ok());
    CHECK(stale.status().code() == StatusCode::kAborted);
    CHECK_THAT(stale.status().message(),
               Catch::Contains("current " + std::to_string(create->version())));
    auto next = co_await c.Put("cas", "v1", create->version());
    REQUIRE(next.ok());
    CHECK(next->version() > create->version());
    auto cas_got = co_await c.Get("cas");
    CHECK(cas_got->value() == "v1");
    auto bad_del = co_await c.Delete("cas", create->version());  // stale version
    CHECK(bad_del.status().code() == StatusCode::kAborted);
    cas_got = co_await c.Get("cas");
    CHECK(cas_got->found());
    auto good_del = co_await c.Delete("cas", next->version());
    REQUIRE(good_del.ok());
    CHECK(good_del->existed());
    // Written again after a delete, a key never gets an old version back.
    auto reborn = co_await c.Put("cas", "v2");
    REQUIRE(reborn.ok());
    CHECK(reborn->version() > next->version());

    // MultiGet keeps the request's order and reports missing keys.
    // (A braced list inside co_await trips GCC 12: "array used as initializer".)
    std::vector<std::string> wanted = {"big", "nope", "a", "empty"};
    auto multi = co_await c.MultiGet(std::move(wanted));
    REQUIRE(multi.size() == 4);
    for (auto& m : multi) REQUIRE(m.ok());
    CHECK(multi[0]->value() == big);
    CHECK_FALSE(multi[1]->found());
    CHECK(multi[2]->value() == "alpha");
    CHECK(multi[3]->found());

    // Scan: a range, pages with continuations, an empty range.
    for (int i = 0; i < 50; ++i) {
      auto put = co_await c.Put(Key(i), "v" + std::to_string(i));
      REQUIRE(put.ok());
    }
    kv::ScanRequest range;
    range.set_start(Key(10));
    range.set_end(Key(20));
    auto ten = co_await c.Scan(range);
    REQUIRE(ten.ok());
    REQUIRE(ten->entries_size() == 10);
    CHECK_FALSE(ten->more());
    for (int i = 0; i < 10; ++i) {
      CHECK(ten->entries(i).key() == Key(10 + i));
      CHECK(ten->entries(i).value() == "v" + std::to_string(10 + i));
    }
    kv::ScanRequest paged;
    paged.set_start("key/");
    paged.set_end("key0");
    paged.set_limit(7);
    std::vector<std::string> seen;
    for (;;) {
      auto page = co_await c.Scan(paged);
      REQUIRE(page.ok());
      for (auto& e : page->entries()) seen.push_back(e.key());
      if (!page->more()) break;
      paged.set_after(page->continuation());
    }
    REQUIRE(seen.size() == 50);
    for (int i = 0; i < 50; ++i) CHECK(seen[i] == Key(i));
    kv::ScanRequest backwards;
    backwards.set_start("z");
    backwards.set_end("a");
    auto empty_range = co_await c.Scan(backwards);
    CHECK(empty_range.status().code() == StatusCode::kInvalidArgument);

    auto info = co_await c.Info();
    REQUIRE(info.size() == 1);
    REQUIRE(info[0].ok());
    CHECK(info[0]->engine() == engine);
  });
}

// Each engine is held to --max-store-bytes (1 GiB by default): a put that would grow the store
// past it fails with RESOURCE_EXHAUSTED and changes nothing, and the server serves on. Without a
// bound any client could fill the server's memory or disk: these 2,000 puts of 64 KiB (125 MiB)
// all went in, and the memory server's resident memory went from 18.8 to 208.5 MiB; on RocksDB
// its folder grew by 125 MiB (write-ahead log).
TEST_CASE(
    "KV store: puts past --max-store-bytes fail with RESOURCE_EXHAUSTED; reads, deletes and "
    "smaller puts go on",
    "[kv]") {
  const std::string engine = GENERATE(as<std::string>{}, "memory", "rocksdb");
  INFO("engine: " << engine);
  constexpr size_t kValue = 64 << 10;
  constexpr long kBound = 8 << 20;
  TempDir dir;
  std::vector<std::string> args = {"--max-store-bytes", std::to_string(kBound)};
  if (engine == "rocksdb") args.insert(args.end(), {"--data-dir", dir.path});
  auto [server, uri] = StartKvServer(args);
  const double rss_start = RssMiB(server->pid());
  WithClient({uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
    const std::string value(kValue, 'v');
    int accepted = 0;
    std::string refusal;
    for (int i = 0; i < 2000; ++i) {
      auto r = co_await c.Put(Key(i), value);
      if (r.ok()) {
        ++accepted;
      } else if (refusal.empty()) {
        refusal = r.status().ToString();
      }
    }
    const double rss = RssMiB(server->pid());
    const double disk = double(FolderBytes(dir.path)) / (1 << 20);
    std::printf(
        "%s: 2,000 puts of 64 KiB against --max-store-bytes %ld: %d accepted; the server's "
        "resident memory %.1f -> %.1f MiB, its folder %.1f MiB; refused with: %s\n",
        engine.c_str(), kBound, accepted, rss_start, rss, disk, refusal.c_str());
    // As many as fit, each entry counted as its key and value and 128 bytes of bookkeeping.
    const long entry = long(kValue + Key(0).size() + kv::kEntryOverheadBytes);
    CHECK(accepted == kBound / entry);
    CHECK(refusal.rfind("RESOURCE_EXHAUSTED", 0) == 0);
    CHECK(refusal.find("store full: the " + engine + " engine") != std::string::npos);
    CHECK(rss - rss_start < 64 + kSanitizerSlackMiB);
    CHECK(disk < 3.0 * kBound / (1 << 20));  // RocksDB's log and files: about the bound
    // What is stored is still there; a key made smaller makes room for one more value, a delete
    // for another.
    auto got = co_await c.Get(Key(0));
    REQUIRE(got.ok());
    CHECK(got->value() == value);
    auto smaller = co_await c.Put(Key(1), "small");
    CHECK(smaller.ok());
    auto after1 = co_await c.Put("after/1", value);
    CHECK(after1.ok());
    auto full = co_await c.Put("after/2", value);
    CHECK_FALSE(full.ok());
    auto deleted = co_await c.Delete(Key(2));
    CHECK(deleted.ok());
    auto after2 = co_await c.Put("after/2", value);
    CHECK(after2.ok());
  });
}

// RocksDB keeps what its entries count for in the database, written with each change: the bound
// holds across restarts, and a database from before the count was kept is counted when opened.
TEST_CASE("KV on RocksDB: the store's bound holds across restarts and for an older database",
          "[kv]") {
  TempDir dir;
  const std::string value(1000, 'v');
  const uint64_t bound = 10 * kv::EntryBytes(Key(0), value);  // room for 10 entries
  auto open = [&] {
    auto e = kv::OpenRocksDbEngine(dir.path, false, bound);
    if (!e.ok()) throw std::runtime_error(e.status().ToString());
    return std::move(*e);
  };
  auto full = [&](kv::Engine& e, const std::string& key) {
    auto r = e.Put(key, value, std::nullopt);
    return !r.ok() && r.status().code() == StatusCode::kResourceExhausted;
  };
  {
    auto e = open();
    for (int i = 0; i < 10; ++i) REQUIRE(e->Put(Key(i), value, std::nullopt).ok());
    CHECK(full(*e, Key(10)));
  }
  {
    auto e = open();  // the count came back with the data
    CHECK(full(*e, Key(10)));
    REQUIRE(e->Delete(Key(0), std::nullopt).ok());
    CHECK(e->Put(Key(10), value, std::nullopt).ok());
    CHECK(full(*e, Key(11)));
  }
  {
    // As a database written before the count was kept: the same entries, no count.
    rocksdb::DB* db = nullptr;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    const std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
        {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
        {"meta", rocksdb::ColumnFamilyOptions()}};
    REQUIRE(rocksdb::DB::Open(rocksdb::Options(), dir.path, cfs, &handles, &db).ok());
    std::string count;
    CHECK(db->Get(rocksdb::ReadOptions(), handles[1], "bytes", &count).ok());
    CHECK(db->Delete(rocksdb::WriteOptions(), handles[1], "bytes").ok());
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    delete db;
  }
  auto e = open();  // counted by a scan
  CHECK(full(*e, Key(11)));
  REQUIRE(e->Delete(Key(1), std::nullopt).ok());
  CHECK(e->Put(Key(11), value, std::nullopt).ok());
  CHECK(full(*e, Key(12)));
}

// MultiGet and Scan copy values into one reply, so a small request could make the server build
// a huge one: a 1 MiB value asked for 2,000 times in one MultiGet (a request of ~20 KB) made the
// server build 2 GiB (resident memory 18.8 -> 2,036 MiB) before the reply was refused as over
// the message limit; 20,000 times would have taken 20 GiB. A MultiGet reply is held to
// KvService::kMaxReplyBytes now, past which it fails with RESOURCE_EXHAUSTED.
TEST_CASE("KV: a MultiGet whose reply would be huge fails, costing the server at most the limit",
          "[kv]") {
  auto [server, uri] = StartKvServer({});
  const double rss_start = RssMiB(server->pid());
  WithClient({uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
    const std::string value(1 << 20, 'v');
    std::vector<std::string> distinct;
    for (int i = 0; i < 8; ++i) {
      auto put = co_await c.Put(Key(i), value);
      REQUIRE(put.ok());
      distinct.push_back(Key(i));
    }
    auto huge = co_await c.MultiGet(std::vector<std::string>(2000, Key(0)));
    const double rss = RssMiB(server->pid());
    REQUIRE(huge.size() == 2000);
    std::printf(
        "MultiGet of one 1 MiB value 2,000 times: %s; the server's resident memory %.1f -> %.1f "
        "MiB\n",
        huge[0].ok() ? "ok" : huge[0].status().ToString().c_str(), rss_start, rss);
    REQUIRE_FALSE(huge[0].ok());
    CHECK(huge[0].status().code() == StatusCode::kResourceExhausted);
    CHECK(huge[0].status().message().find("ask for fewer keys") != std::string::npos);
    CHECK(rss - rss_start < 256 + kSanitizerSlackMiB);
    // Within the limit, as before.
    auto some = co_await c.MultiGet(distinct);
    for (auto& r : some) {
      REQUIRE(r.ok());
      CHECK(r->value() == value);
    }
  });
}

// A Scan page ends before an entry that would take it past KvService::kScanPageBytes (16 MiB),
// with `more` set, so that a store of large values can be scanned page by page: before, 80 values
// of 1 MiB in the range made every page with the default limit an 80 MiB reply, refused as over
// the message limit (RESOURCE_EXHAUSTED), and the range could not be scanned at all.
TEST_CASE("KV: Scan pages over large values stay under the page limit and cover the range",
          "[kv]") {
  const std::string engine = GENERATE(as<std::string>{}, "memory", "rocksdb");
  INFO("engine: " << engine);
  KvServer s(engine);
  WithClient({s.uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
    const std::string value(1 << 20, 'v');
    for (int i = 0; i < 80; ++i) {
      auto put = co_await c.Put(Key(i), value);
      REQUIRE(put.ok());
    }
    kv::ScanRequest req;
    int seen = 0, pages = 0;
    for (;;) {
      auto page = co_await c.Scan(req);
      REQUIRE(page.ok());
      ++pages;
      CHECK(page->entries_size() > 0);
      CHECK(page->entries_size() <= 16);  // 16 MiB of keys and values
      for (const auto& e : page->entries()) {
        CHECK(e.key() == Key(seen++));
        CHECK(e.value().size() == value.size());
      }
      if (!page->more()) break;
      req.set_after(page->continuation());
    }
    std::printf("%s: 80 values of 1 MiB scanned in %d pages\n", engine.c_str(), pages);
    CHECK(seen == 80);
  });
}

TEST_CASE("KV Watch: every change under a prefix, in version order, live and replayed",
          "[kv][watch]") {
  const std::string engine = GENERATE(as<std::string>{}, "memory", "rocksdb");
  const std::string listen = GENERATE(from_range(ListenUris()));
  INFO("engine: " << engine << ", listening on " << listen);
  KvServer s(engine, listen, /*history_events=*/8);
  RunLoop([&]() -> asio::awaitable<void> {
    auto ch = co_await Channel::Connect(s.uri);
    REQUIRE(ch.ok());
    kv::KV::Stub stub(*ch);
    auto put = [&](std::string k, std::string v) -> asio::awaitable<uint64_t> {
      kv::PutRequest r;
      r.set_key(std::move(k));
      r.set_value(std::move(v));
      auto reply = co_await stub.Put(r);
      REQUIRE(reply.ok());
      co_return reply->version();
    };
    const uint64_t v1 = co_await put("a/1", "x");  // before the watch: not streamed live
    kv::WatchRequest req;
    req.set_prefix("a/");
    auto live = co_await stub.Watch(req);
    co_await put("b/1", "other prefix");
    const uint64_t v2 = co_await put("a/2", "y");
    kv::DeleteRequest del;
    del.set_key("a/1");
    auto deleted = co_await stub.Delete(del);
    REQUIRE(deleted.ok());
    CHECK(deleted->existed());
    CHECK(deleted->version() > v2);  // a delete takes a version too
    const uint64_t v4 = co_await put("a/3", "z");
    struct Want {
      kv::WatchEvent::Kind kind;
      std::string key, value;
      uint64_t version;
    };
    const std::vector<Want> want = {{kv::WatchEvent::PUT, "a/2", "y", v2},
                                    {kv::WatchEvent::DELETE, "a/1", "", deleted->version()},
                                    {kv::WatchEvent::PUT, "a/3", "z", v4}};
    for (const auto& w : want) {
      auto ev = co_await live.Read();
      REQUIRE(ev.has_value());
      CHECK(ev->kind() == w.kind);
      CHECK(ev->key() == w.key);
      CHECK(ev->value() == w.value);
      CHECK(ev->version() == w.version);
    }
    live.Cancel();
    auto after_cancel = co_await live.Read();
    CHECK_FALSE(after_cancel.has_value());
    const Status live_end = co_await live.Finish();
    CHECK(live_end.code() == StatusCode::kCancelled);

    // Replayed from the history: everything under a/ after v1, then live again.
    req.set_after_version(v1);
    auto replay = co_await stub.Watch(req);
    for (const auto& w : want) {
      auto ev = co_await replay.Read();
      REQUIRE(ev.has_value());
      CHECK(ev->key() == w.key);
      CHECK(ev->version() == w.version);
    }
    const uint64_t v5 = co_await put("a/4", "w");
    auto ev = co_await replay.Read();
    REQUIRE(ev.has_value());
    CHECK(ev->version() == v5);

    // A history of 8 events: after 10 more writes, v1 is too old to replay from.
    for (int i = 0; i < 10; ++i) co_await put("c/" + std::to_string(i), "v");
    auto gone = co_await stub.Watch(req);
    auto from_gone = co_await gone.Read();
    CHECK_FALSE(from_gone.has_value());
    Status s_gone = co_await gone.Finish();
    CHECK(s_gone.code() == StatusCode::kOutOfRange);
    CHECK_THAT(s_gone.message(), Catch::Contains("no longer kept"));
  }());
  // The server ended the replay stream when its reader went: no watcher left running.
  CHECK(Eventually([&] { return s.server.in_flight_calls() == 0; }, 10000ms));
}

// A watch that replays history copied up to 256 changes at a time into its handler, and kept
// the copy while its caller did not read: 32 such watches over 48 changes of 1 MiB held some
// 1.5 GiB of copies. Now a watch takes the next change only once its stream can send it at once
// (ServerWriter::Writable), so a caller that does not read holds the server to the stream's
// window and the connection's budget, not to a copy of the history.
TEST_CASE("KV Watch: callers that do not read cost the server its stream bounds, not copies",
          "[kv][watch]") {
  auto [server, uri] = StartKvServer({});
  const double rss_start = RssMiB(server->pid());
  RunLoop([&]() -> asio::awaitable<void> {
    auto ch = co_await Channel::Connect(uri);
    REQUIRE(ch.ok());
    kv::KV::Stub stub(*ch);
    kv::PutRequest put;
    put.set_key("start");
    auto start = co_await stub.Put(put);
    REQUIRE(start.ok());
    put.set_value(std::string(1 << 20, 'v'));
    for (int i = 0; i < 48; ++i) {
      put.set_key(Key(i));
      auto reply = co_await stub.Put(put);
      REQUIRE(reply.ok());
    }
    const double rss_stored = RssMiB(server->pid());
    // 32 watches replaying the 48 changes, none read for a second.
    kv::WatchRequest req;
    req.set_after_version(start->version());
    std::vector<ClientReader<kv::WatchEvent>> watches;
    for (int w = 0; w < 32; ++w) watches.push_back(co_await stub.Watch(req));
    asio::steady_timer pause(co_await asio::this_coro::executor, 1s);
    co_await pause.async_wait(asio::use_awaitable);
    const double rss = RssMiB(server->pid());
    std::printf(
        "32 watches of 48 changes of 1 MiB, not read: the server's resident memory %.1f MiB "
        "at start, %.1f with the changes stored, %.1f with the watches\n",
        rss_start, rss_stored, rss);
    CHECK(rss - rss_stored < 128 + kSanitizerSlackMiB);
    // Nothing is lost: a watch read to the end has every change, in order.
    for (int i = 0; i < 48; ++i) {
      auto ev = co_await watches[0].Read();
      if (!ev) {
        const Status why = co_await watches[0].Finish();
        FAIL("change " << i << ": the watch ended: " << why.ToString());
      }
      CHECK(ev->key() == Key(i));
      CHECK(ev->version() == start->version() + 1 + uint64_t(i));
    }
  }());
}

TEST_CASE("KV Watch: a server killed (SIGKILL) mid-stream ends the watch with UNAVAILABLE at once",
          "[kv][watch]") {
  const std::string listen = GENERATE(from_range(ListenUris()));
  INFO("listening on " << listen);
  auto [server, uri] = StartServer({Runfile("examples/kv/kv_server"), "--listen", listen});
  RunLoop([&, &server = server, &uri = uri]() -> asio::awaitable<void> {
    ChannelOptions o;
    o.reconnect = false;
    auto ch = co_await Channel::Connect(uri, o);
    REQUIRE(ch.ok());
    kv::KV::Stub stub(*ch);
    kv::WatchRequest req;
    req.set_prefix("w/");
    auto watch = co_await stub.Watch(req, {.timeout = 60s});
    kv::PutRequest put;
    put.set_key("w/1");
    put.set_value("v");
    auto put_reply = co_await stub.Put(put);
    REQUIRE(put_reply.ok());
    auto first = co_await watch.Read();
    REQUIRE(first.has_value());
    CHECK(first->key() == "w/1");
    const auto killed = std::chrono::steady_clock::now();
    server->Kill();
    while (co_await watch.Read()) {
    }
    Status s = co_await watch.Finish();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - killed)
            .count();
    std::printf("watch over %s ended %.0f ms after the server was killed: %s\n", listen.c_str(), ms,
                s.ToString().c_str());
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK(ms < 10000);
  }());
}

TEST_CASE("KV on RocksDB: every acknowledged Put survives SIGTERM and SIGKILL", "[kv]") {
  TempDir dir;
  const std::vector<std::string> args = {"--data-dir", dir.path, "--threads", "2"};
  auto put_range = [](const std::string& uri, int from, int to) {
    int acked = 0;
    WithClient({uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
      for (int i = from; i < to; ++i) {
        if ((co_await c.Put(Key(i), Pattern(100 + i % 900, i))).ok()) ++acked;
      }
    });
    return acked;
  };
  auto count_intact = [](const std::string& uri, int to) {
    int intact = 0;
    WithClient({uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
      for (int i = 0; i < to; ++i) {
        auto r = co_await c.Get(Key(i));
        if (r.ok() && r->found() && r->value() == Pattern(100 + i % 900, i)) ++intact;
      }
    });
    return intact;
  };
  {
    auto [server, uri] = StartKvServer(args);
    REQUIRE(put_range(uri, 0, 1000) == 1000);
    CHECK(server->Stop(SIGTERM) == 0);  // drains, flushes, exits cleanly
  }
  {
    auto [server, uri] = StartKvServer(args);
    CHECK(count_intact(uri, 1000) == 1000);
    REQUIRE(put_range(uri, 1000, 2000) == 1000);
    server->Kill();  // SIGKILL right after the last acknowledgement: no flush
  }
  auto [server, uri] = StartKvServer(args);
  CHECK(count_intact(uri, 2000) == 2000);
}

TEST_CASE("KV sharded over three servers: 10,000 keys readable, spread, scanned in order", "[kv]") {
  const std::string listen = GENERATE(from_range(ListenUris()));
  KvServer a("memory", listen), b("memory", listen), c3("memory", listen);
  constexpr int kKeys = 10000;
  WithClient({a.uri, b.uri, c3.uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
    // Writes at 64 in flight.
    std::atomic<int> next{0}, acked{0}, workers{64};
    auto ex = co_await asio::this_coro::executor;
    for (int w = 0; w < 64; ++w) {
      asio::co_spawn(
          ex,
          [&]() -> asio::awaitable<void> {
            for (int i = next++; i < kKeys; i = next++) {
              if ((co_await c.Put(Key(i), "value " + std::to_string(i))).ok()) ++acked;
            }
            --workers;
          },
          asio::detached);
    }
    co_await WaitUntil([&] { return workers == 0; }, 300s);
    REQUIRE(acked == kKeys);

    // Every key readable, one by one and in batches.
    int readable = 0;
    for (int i = 0; i < kKeys; ++i) {
      auto r = co_await c.Get(Key(i));
      readable += r.ok() && r->value() == "value " + std::to_string(i);
    }
    CHECK(readable == kKeys);
    std::vector<std::string> batch;
    for (int i = 0; i < 500; ++i) batch.push_back(Key(i * 20));
    auto multi = co_await c.MultiGet(batch);
    REQUIRE(multi.size() == 500);
    int batch_ok = 0;
    for (int i = 0; i < 500; ++i)
      batch_ok += multi[i].ok() && multi[i]->value() == "value " + std::to_string(i * 20);
    CHECK(batch_ok == 500);

    // Spread: each server holds about a third.
    auto info = co_await c.Info();
    REQUIRE(info.size() == 3);
    uint64_t total = 0;
    for (auto& in : info) {
      REQUIRE(in.ok());
      INFO("keys on one server: " << in->keys());
      CHECK(in->keys() > kKeys * 0.2);
      CHECK(in->keys() < kKeys * 0.47);
      total += in->keys();
    }
    CHECK(total == kKeys);

    // Scan merges the shards in key order, page by page.
    kv::ScanRequest req;
    req.set_limit(999);
    std::vector<std::string> keys;
    for (;;) {
      auto page = co_await c.Scan(req);
      REQUIRE(page.ok());
      for (auto& e : page->entries()) keys.push_back(e.key());
      if (!page->more()) break;
      req.set_after(page->continuation());
    }
    REQUIRE(keys.size() == size_t(kKeys));
    for (int i = 0; i < kKeys; ++i) {
      if (keys[i] != Key(i)) FAIL("scan position " << i << " has " << keys[i]);
    }
  });
}

TEST_CASE("KV: concurrent compare-and-set increments lose no update", "[kv]") {
  const std::string engine = GENERATE(as<std::string>{}, "memory", "rocksdb");
  INFO("engine: " << engine);
  KvServer s(engine);
  constexpr int kThreads = 4, kIncrements = 100;
  std::atomic<int> conflicts{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      WithClient({s.uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
        for (int i = 0; i < kIncrements; ++i) {
          for (;;) {  // read, add one, write back only if nobody wrote in between
            auto cur = co_await c.Get("counter");
            if (!cur.ok()) {
              ++errors;
              co_return;
            }
            const int n = cur->found() ? std::stoi(cur->value()) : 0;
            auto put = co_await c.Put("counter", std::to_string(n + 1), cur->version());
            if (put.ok()) break;
            if (put.status().code() != StatusCode::kAborted) {
              ++errors;
              co_return;
            }
            ++conflicts;
          }
        }
      });
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors == 0);
  INFO("conflicts retried: " << conflicts.load());
  KvServer* sp = &s;
  WithClient({sp->uri}, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
    auto r = co_await c.Get("counter");
    REQUIRE(r.ok());
    CHECK(r->value() == std::to_string(kThreads * kIncrements));
  });
}

TEST_CASE("kv CLI: bad arguments print usage and exit 2; a missing key exits 4", "[kv]") {
  const std::string kv_bin = Runfile("examples/kv/kv");
  for (std::vector<std::string> args :
       std::vector<std::vector<std::string>>{{},
                                             {"frob"},
                                             {"get"},
                                             {"put", "only-key"},
                                             {"scan", "--limit", "x"},
                                             {"put", "k", "v", "--expect-version", "-1"}}) {
    args.insert(args.begin(), kv_bin);
    Child c(args);
    INFO("args: " << args.size());
    CHECK(c.Wait() == 2);
  }
  KvServer s("memory");
  Child put({kv_bin, "--targets", s.uri, "put", "k", "v"});
  CHECK(put.ReadLine(10s).rfind("ok (version ", 0) == 0);
  CHECK(put.Wait() == 0);
  Child get({kv_bin, "--targets", s.uri, "get", "k"});
  CHECK(get.ReadLine(10s).rfind("v\t(version ", 0) == 0);
  CHECK(get.Wait() == 0);
  Child missing({kv_bin, "--targets", s.uri, "get", "absent"});
  CHECK(missing.Wait() == 4);
}

TEST_CASE("KV sharded: a dead server costs only its own keys, and is used again when it is back",
          "[kv]") {
  const std::string listen = GENERATE(from_range(ListenUris()));
  KvServer a("memory", listen), b("memory", listen);
  std::string dead_uri;
  {
    KvServer gone("memory", listen);  // an address nobody serves once this scope ends
    dead_uri = gone.uri;
  }
  std::unique_ptr<KvServer> back;
  const std::vector<std::string> targets = {a.uri, b.uri, dead_uri};
  WithClient(targets, [&](kv::ShardedClient& c) -> asio::awaitable<void> {
    REQUIRE(c.shard_down(0).ok());
    REQUIRE(c.shard_down(1).ok());
    REQUIRE_FALSE(c.shard_down(2).ok());

    // Every key on a live server works; every key on the dead one fails at once with
    // UNAVAILABLE naming it.
    int live = 0, dead = 0;
    for (int i = 0; i < 300; ++i) {
      auto put = co_await c.Put(Key(i), "v" + std::to_string(i));
      auto got = co_await c.Get(Key(i));
      if (c.ShardOf(Key(i)) == 2) {
        ++dead;
        CHECK(put.status().code() == StatusCode::kUnavailable);
        CHECK(got.status().code() == StatusCode::kUnavailable);
        CHECK_THAT(got.status().message(), Catch::Contains(dead_uri));
      } else {
        ++live;
        CHECK(put.ok());
        REQUIRE(got.ok());
        CHECK(got->value() == "v" + std::to_string(i));
      }
    }
    CHECK(dead > 50);
    CHECK(live > 150);

    // MultiGet answers per key; Info per server; Scan, which needs every shard, names the dead.
    std::vector<std::string> keys;
    for (int i = 0; i < 30; ++i) keys.push_back(Key(i));
    auto multi = co_await c.MultiGet(keys);
    REQUIRE(multi.size() == keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      INFO(keys[i]);
      if (c.ShardOf(keys[i]) == 2) {
        CHECK(multi[i].status().code() == StatusCode::kUnavailable);
      } else {
        REQUIRE(multi[i].ok());
        CHECK(multi[i]->found());
      }
    }
    auto info = co_await c.Info();
    REQUIRE(info.size() == 3);
    CHECK(info[0].ok());
    CHECK(info[1].ok());
    CHECK(info[2].status().code() == StatusCode::kUnavailable);
    CHECK_THAT(info[2].status().message(), Catch::Contains(dead_uri));
    auto scan = co_await c.Scan(kv::ScanRequest());
    CHECK(scan.status().code() == StatusCode::kUnavailable);
    CHECK_THAT(scan.status().message(), Catch::Contains(dead_uri));

    // The server comes back at the same address: within the retry interval its keys work.
    back = std::make_unique<KvServer>("memory", dead_uri);
    int i2 = 0;
    while (c.ShardOf(Key(i2)) != 2) ++i2;
    const bool revived = co_await [&]() -> asio::awaitable<bool> {
      for (int tries = 0; tries < 100; ++tries) {
        if ((co_await c.Put(Key(i2), "back")).ok()) co_return true;
        co_await WaitUntil([] { return false; }, 50ms);
      }
      co_return false;
    }();
    CHECK(revived);
    CHECK(c.shard_down(2).ok());
    auto back = co_await c.Get(Key(i2));
    CHECK(back->value() == "back");

    // A server that dies while connected: its keys fail naming it, the others carry on.
    std::atomic<bool> stopped{false};
    std::thread stopper([&] {
      b.server.Shutdown();
      stopped = true;
    });
    co_await WaitUntil([&] { return stopped.load(); }, 60s);
    stopper.join();
    int after_live = 0;
    for (int i = 0; i < 300; ++i) {
      auto got = co_await c.Get(Key(i));
      if (c.ShardOf(Key(i)) == 1) {
        CHECK(got.status().code() == StatusCode::kUnavailable);
        CHECK_THAT(got.status().message(), Catch::Contains(b.uri));
      } else if (c.ShardOf(Key(i)) == 0) {
        REQUIRE(got.ok());
        after_live += got->value() == "v" + std::to_string(i);
      }
    }
    CHECK(after_live > 50);
  });
}

// The transport's Poller (transport/poller.h) on its own: what a TCP connection and the RDMA
// completion channel rely on from it -- readiness from inside io_context::run(), once per edge;
// removal at any moment (from inside its own event too, and of another descriptor whose event
// is already pending); the descriptor closed only once the reactor has let go of it;
// registrations that do not keep run() going by themselves; clients told and released when the
// io_context goes away. Then the loop of our own (RunOwnLoop): the same readiness, and Asio run
// beside it as under run() -- handlers posted from other threads while it sleeps, timers, Asio's
// own descriptors, stop(), running out of work, fairness between the two.
#include "transport/poller.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace rdmarpc::transport {
namespace {
namespace asio = boost::asio;

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

// A connected pair: the poller is given the reading end (and closes it); we keep the other.
struct Pair {
  int fd[2] = {-1, -1};
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fd) == 0); }
  ~Pair() {
    if (fd[1] >= 0) ::close(fd[1]);
  }
  // False once the reading end is closed (no SIGPIPE).
  bool Write() { return ::send(fd[1], "x", 1, MSG_NOSIGNAL) == 1; }
};

struct Recorder final : Poller::Client {
  int fd;
  int reads = 0;
  bool gone = false;
  std::function<void()> on_ready;
  explicit Recorder(int f) : fd(f) {}
  void OnReady(bool) override {
    ++reads;
    char buf[64];
    while (::read(fd, buf, sizeof buf) > 0) {
    }
    if (on_ready) on_ready();
  }
  void OnPollerGone() override { gone = true; }
};

TEST_CASE("the poller reports readiness from inside run(), once per edge", "[poller]") {
  asio::io_context ioc(1);
  // What a connection holds while open (registrations are not work of their own).
  auto work = asio::make_work_guard(ioc);
  Pair p;
  auto rec = std::make_shared<Recorder>(p.fd[0]);
  int error = 0;
  Poller& poller = Poller::For(ioc.get_executor());
  auto* reg = poller.Add(p.fd[0], rec, &error);
  REQUIRE(reg != nullptr);
  REQUIRE(p.Write());
  ioc.poll();
  CHECK(rec->reads == 1);
  ioc.restart();
  ioc.poll();  // nothing new arrived: no second report
  CHECK(rec->reads == 1);
  REQUIRE(p.Write());
  ioc.restart();
  ioc.poll();
  CHECK(rec->reads == 2);
  // Data that arrived before the registration is reported too.
  Pair q;
  REQUIRE(q.Write());
  auto early = std::make_shared<Recorder>(q.fd[0]);
  REQUIRE(poller.Add(q.fd[0], early, &error) != nullptr);
  ioc.restart();
  ioc.poll();
  CHECK(early->reads == 1);
  // Removed outside any event: closed at once, and nothing more is reported.
  CHECK(poller.Remove(reg) == rec);
  CHECK_FALSE(IsOpen(p.fd[0]));
}

TEST_CASE("a registration does not keep run() going by itself", "[poller]") {
  asio::io_context ioc(1);
  Pair p;
  auto rec = std::make_shared<Recorder>(p.fd[0]);
  int error = 0;
  REQUIRE(Poller::For(ioc.get_executor()).Add(p.fd[0], rec, &error) != nullptr);
  ioc.run();  // returns: nothing but the registration is outstanding
  CHECK(rec->reads == 0);
}

TEST_CASE("a client may remove itself, or another whose event is pending", "[poller]") {
  asio::io_context ioc(1);
  auto work = asio::make_work_guard(ioc);
  Poller& poller = Poller::For(ioc.get_executor());
  int error = 0;

  SECTION("itself: the descriptor stays open until the reactor has let go of it") {
    Pair p;
    auto rec = std::make_shared<Recorder>(p.fd[0]);
    Poller::Registration* reg = poller.Add(p.fd[0], rec, &error);
    REQUIRE(reg);
    std::shared_ptr<Poller::Client> held;
    bool open_inside = false;
    rec->on_ready = [&] {
      held = poller.Remove(reg);
      open_inside = IsOpen(p.fd[0]);
    };
    REQUIRE(p.Write());
    ioc.poll();
    CHECK(rec->reads == 1);
    CHECK(held == rec);
    CHECK(open_inside);  // (closing it there would let its number be reused while registered)
    CHECK_FALSE(IsOpen(p.fd[0]));  // closed by the posted deregistration
    CHECK_FALSE(p.Write());        // the peer sees it closed
    ioc.restart();
    ioc.poll();
    CHECK(rec->reads == 1);
  }

  SECTION("another: its pending event does not reach it") {
    Pair a, b;
    auto ra = std::make_shared<Recorder>(a.fd[0]);
    auto rb = std::make_shared<Recorder>(b.fd[0]);
    Poller::Registration* reg_a = poller.Add(a.fd[0], ra, &error);
    Poller::Registration* reg_b = poller.Add(b.fd[0], rb, &error);
    REQUIRE((reg_a && reg_b));
    // Whichever runs first removes both; the other's event, already taken from the kernel in
    // the same reactor pass, must not reach it (its registration is gone, its client may be).
    std::shared_ptr<Poller::Client> held_a, held_b;
    auto remove_both = [&] {
      if (reg_a) held_a = poller.Remove(std::exchange(reg_a, nullptr));
      if (reg_b) held_b = poller.Remove(std::exchange(reg_b, nullptr));
    };
    ra->on_ready = remove_both;
    rb->on_ready = remove_both;
    REQUIRE(a.Write());
    REQUIRE(b.Write());
    ioc.poll();
    CHECK(ra->reads + rb->reads == 1);
    CHECK(held_a == ra);
    CHECK(held_b == rb);
    CHECK_FALSE(a.Write());  // both closed
    CHECK_FALSE(b.Write());
    ioc.restart();
    ioc.poll();
    CHECK(ra->reads + rb->reads == 1);
  }
}

TEST_CASE("the io_context's end tells and releases the clients still registered", "[poller]") {
  Pair p;
  std::shared_ptr<Recorder> rec = std::make_shared<Recorder>(p.fd[0]);
  {
    asio::io_context ioc(1);
    int error = 0;
    REQUIRE(Poller::For(ioc.get_executor()).Add(p.fd[0], rec, &error));
    REQUIRE(p.Write());  // an event pending, never handed out
    CHECK(rec.use_count() == 2);
  }
  CHECK(rec->gone);
  CHECK(rec->reads == 0);
  CHECK(rec.use_count() == 1);  // the poller's reference is gone
  CHECK_FALSE(IsOpen(p.fd[0]));
}

TEST_CASE("a descriptor that cannot be watched is refused with errno", "[poller]") {
  asio::io_context ioc(1);
  int error = 0;
  auto rec = std::make_shared<Recorder>(-1);
  CHECK(Poller::For(ioc.get_executor()).Add(-1, rec, &error) == nullptr);
  CHECK(error == EBADF);
  CHECK(rec.use_count() == 1);
}

// The loop of our own, run on a thread of the test's: RunOwnLoop's result (or what it threw).
struct OwnLoopThread {
  asio::io_context ioc{1};
  std::atomic<bool> returned{false};
  std::string threw;
  std::thread thread;
  void Start() {
    thread = std::thread([this] {
      try {
        Poller::RunOwnLoop(ioc);
      } catch (const std::exception& e) {
        threw = e.what();
      }
      returned = true;
    });
  }
  ~OwnLoopThread() {
    if (thread.joinable()) {
      ioc.stop();
      thread.join();
    }
  }
  void Join() { thread.join(); }
};

// Waits up to 5 s for `done`.
template <class F>
bool Eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// A Recorder whose count other threads may read.
struct CountingClient final : Poller::Client {
  int fd;
  std::atomic<int> reads{0};
  std::function<void()> on_ready;
  explicit CountingClient(int f) : fd(f) {}
  void OnReady(bool) override {
    char buf[64];
    while (::read(fd, buf, sizeof buf) > 0) {
    }
    ++reads;
    if (on_ready) on_ready();
  }
};

TEST_CASE(
    "the loop of our own reports readiness once per edge and runs what other threads post "
    "while it sleeps",
    "[poller][own_loop]") {
  OwnLoopThread loop;
  auto work = asio::make_work_guard(loop.ioc);
  Pair early, p;
  // Added before the loop runs (watched by the reactor until then): it moves over, and what
  // is pending on it is reported.
  REQUIRE(early.Write());
  auto early_client = std::make_shared<CountingClient>(early.fd[0]);
  int error = 0;
  REQUIRE(Poller::For(loop.ioc.get_executor()).Add(early.fd[0], early_client, &error));
  loop.Start();
  CHECK(Eventually([&] { return early_client->reads == 1; }));

  auto client = std::make_shared<CountingClient>(p.fd[0]);
  std::promise<Poller::Registration*> added;
  asio::post(loop.ioc, [&] {
    added.set_value(Poller::For(loop.ioc.get_executor()).Add(p.fd[0], client, &error));
  });
  Poller::Registration* reg = added.get_future().get();
  REQUIRE(reg != nullptr);
  for (int i = 1; i <= 3; ++i) {
    REQUIRE(p.Write());
    CHECK(Eventually([&] { return client->reads == i; }));
    // The loop sleeps now (nothing else to do): a post from this thread must wake it.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<bool> ran{false};
    asio::post(loop.ioc, [&] { ran = true; });
    CHECK(Eventually([&] { return ran.load(); }));
  }
  CHECK(client->reads == 3);  // once per edge, none spurious
  CHECK(early_client->reads == 1);

  // Removed from the loop's thread: closed, and the peer sees it.
  std::promise<std::shared_ptr<Poller::Client>> removed;
  asio::post(loop.ioc,
             [&] { removed.set_value(Poller::For(loop.ioc.get_executor()).Remove(reg)); });
  CHECK(removed.get_future().get() == client);
  CHECK_FALSE(p.Write());
  // stop() from another thread while it sleeps ends it.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  loop.ioc.stop();
  CHECK(Eventually([&] { return loop.returned.load(); }));
  loop.Join();
  CHECK(loop.threw.empty());
}

TEST_CASE("beside the loop of our own, Asio's timers, descriptors and handlers run as under run()",
          "[poller][own_loop]") {
  OwnLoopThread loop;
  auto work = asio::make_work_guard(loop.ioc);
  loop.Start();
  std::atomic<int> step{0};

  // A timer wakes the sleeping loop.
  asio::steady_timer timer(loop.ioc, std::chrono::milliseconds(30));
  timer.async_wait([&](boost::system::error_code ec) {
    if (!ec) step = 1;
  });
  CHECK(Eventually([&] { return step == 1; }));

  // One of Asio's own descriptors (in its reactor) is reported through the loop.
  int fds[2];
  REQUIRE(::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0);
  asio::posix::stream_descriptor read_end(loop.ioc, fds[0]);
  read_end.async_wait(asio::posix::stream_descriptor::wait_read, [&](boost::system::error_code ec) {
    if (!ec) step = 2;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(::write(fds[1], "x", 1) == 1);
  CHECK(Eventually([&] { return step == 2; }));

  // From inside a descriptor's event: dispatch() runs inline, as in a handler under run(), and
  // what it posts runs before the loop sleeps (no other event comes to wake it).
  Pair p;
  auto client = std::make_shared<CountingClient>(p.fd[0]);
  std::atomic<bool> inline_dispatch{false}, posted_ran{false};
  client->on_ready = [&] {
    bool inside = true;
    asio::dispatch(loop.ioc, [&] { inline_dispatch = inside; });
    inside = false;
    asio::post(loop.ioc, [&] { posted_ran = true; });
  };
  int error = 0;
  std::promise<Poller::Registration*> added;
  asio::post(loop.ioc, [&] {
    added.set_value(Poller::For(loop.ioc.get_executor()).Add(p.fd[0], client, &error));
  });
  REQUIRE(added.get_future().get() != nullptr);
  REQUIRE(p.Write());
  CHECK(Eventually([&] { return posted_ran.load(); }));
  CHECK(inline_dispatch);

  // Running out of work ends it, as run() does (the registration is not work of its own).
  asio::post(loop.ioc, [&] { read_end.close(); });
  work.reset();
  CHECK(Eventually([&] { return loop.returned.load(); }));
  loop.Join();
  CHECK(loop.threw.empty());
  ::close(fds[1]);
}

TEST_CASE("the loop of our own lets a descriptor in between handlers that post themselves again",
          "[poller][own_loop]") {
  OwnLoopThread loop;
  auto work = asio::make_work_guard(loop.ioc);
  // A handler that posts itself again forever (a spin, a yield), until told to stop.
  std::atomic<bool> stop_spinning{false};
  std::atomic<long> spins{0};
  std::function<void()> spin = [&] {
    ++spins;
    if (!stop_spinning) asio::post(loop.ioc, spin);
  };
  asio::post(loop.ioc, spin);
  Pair p;
  auto client = std::make_shared<CountingClient>(p.fd[0]);
  client->on_ready = [&] { stop_spinning = true; };
  int error = 0;
  REQUIRE(Poller::For(loop.ioc.get_executor()).Add(p.fd[0], client, &error));
  loop.Start();
  REQUIRE(Eventually([&] { return spins > 1000; }));
  REQUIRE(p.Write());
  CHECK(Eventually([&] { return client->reads == 1; }));
  CHECK(stop_spinning);
  work.reset();
  CHECK(Eventually([&] { return loop.returned.load(); }));
  loop.Join();
}

TEST_CASE("a handler spinning on the loop sees WorkCount change when another thread posts",
          "[poller][own_loop]") {
  // What lets RDMA busy-polling end a burst early for work from other threads.
  OwnLoopThread loop;
  auto work = asio::make_work_guard(loop.ioc);
  Poller& poller = Poller::For(loop.ioc.get_executor());
  std::atomic<int> stage{0};
  std::atomic<bool> changed{false}, ran{false};
  asio::post(loop.ioc, [&] {
    const long before = poller.WorkCount();
    stage = 1;  // the other thread posts now
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (poller.WorkCount() == before && std::chrono::steady_clock::now() < until) {
    }
    changed = poller.WorkCount() != before;
  });
  loop.Start();
  REQUIRE(Eventually([&] { return stage == 1; }));
  asio::post(loop.ioc, [&] { ran = true; });
  CHECK(Eventually([&] { return ran.load(); }));
  CHECK(changed);
  work.reset();
  CHECK(Eventually([&] { return loop.returned.load(); }));
  loop.Join();
}

TEST_CASE("the loop of our own closes a descriptor removed in its own event only after it",
          "[poller][own_loop]") {
  OwnLoopThread loop;
  auto work = asio::make_work_guard(loop.ioc);
  Pair a, b;
  auto ca = std::make_shared<CountingClient>(a.fd[0]);
  auto cb = std::make_shared<CountingClient>(b.fd[0]);
  Poller& poller = Poller::For(loop.ioc.get_executor());
  int error = 0;
  Poller::Registration* reg_a = poller.Add(a.fd[0], ca, &error);
  Poller::Registration* reg_b = poller.Add(b.fd[0], cb, &error);
  REQUIRE((reg_a && reg_b));
  // Whichever runs first removes both (the other's event may be in the same batch: it must not
  // reach it); the descriptor stays open to the end of the client's own OnReady.
  std::shared_ptr<Poller::Client> held_a, held_b;
  std::atomic<bool> open_inside{false};
  auto remove_both = [&](int own_fd) {
    if (reg_a) held_a = poller.Remove(std::exchange(reg_a, nullptr));
    if (reg_b) held_b = poller.Remove(std::exchange(reg_b, nullptr));
    open_inside = IsOpen(own_fd);
  };
  ca->on_ready = [&] { remove_both(a.fd[0]); };
  cb->on_ready = [&] { remove_both(b.fd[0]); };
  REQUIRE(a.Write());
  REQUIRE(b.Write());
  loop.Start();
  CHECK(Eventually([&] { return ca->reads + cb->reads >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  work.reset();
  CHECK(Eventually([&] { return loop.returned.load(); }));
  loop.Join();
  CHECK(ca->reads + cb->reads == 1);
  CHECK(held_a == ca);
  CHECK(held_b == cb);
  CHECK(open_inside);
  CHECK_FALSE(a.Write());  // both closed
  CHECK_FALSE(b.Write());
}

TEST_CASE("a handler that throws inside the loop of our own leaves it, as it leaves run()",
          "[poller][own_loop]") {
  OwnLoopThread loop;
  auto work = asio::make_work_guard(loop.ioc);
  Pair p;
  auto client = std::make_shared<CountingClient>(p.fd[0]);
  client->on_ready = [&] {
    asio::dispatch(loop.ioc, [] { throw std::runtime_error("handler failed"); });
  };
  int error = 0;
  REQUIRE(Poller::For(loop.ioc.get_executor()).Add(p.fd[0], client, &error));
  loop.Start();
  REQUIRE(p.Write());
  CHECK(Eventually([&] { return loop.returned.load(); }));
  loop.Join();
  CHECK(loop.threw == "handler failed");
}

// Receiving through io_uring (Add with receives = true, in the loop of our own).

// Runs `f` on the loop's thread and returns what it returns.
template <class F>
auto OnLoop(OwnLoopThread& loop, F f) {
  std::promise<decltype(f())> result;
  asio::post(loop.ioc, [&] { result.set_value(f()); });
  return result.get_future().get();
}

bool RingWanted() {
  const char* v = std::getenv("RDMARPC_IO_URING");
  return v == nullptr || std::string(v) != "0";
}

// A client that receives through the ring into a buffer of its own, again after each receive
// while `rearm` is set; the test thread reads its counters.
struct RingClient final : Poller::Client {
  Poller* poller = nullptr;
  Poller::Registration* reg = nullptr;
  char buf[64] = {};
  std::string data;  // what arrived (written on the loop, read after `received` moved)
  std::atomic<int> received{0};
  std::atomic<int> last{1};
  std::atomic<int> hang_ups{0};
  std::atomic<int> readies{0};
  bool rearm = true;
  bool Arm() { return poller->Receive(reg, std::as_writable_bytes(std::span(buf)), true); }
  void OnReceived(int result) override {
    if (result > 0) data.append(buf, static_cast<size_t>(result));
    last = result;
    ++received;
    if (rearm && result > 0) Arm();
  }
  void OnHangUp() override { ++hang_ups; }
  void OnReady(bool) override { ++readies; }
};

// Adds p's reading end to the loop as a receiving socket (on the loop's thread).
Poller::Registration* AddReceiving(OwnLoopThread& loop, Pair& p, std::shared_ptr<RingClient> c) {
  return OnLoop(loop, [&] {
    int error = 0;
    c->poller = &Poller::For(loop.ioc.get_executor());
    c->reg = c->poller->Add(p.fd[0], c, &error, /*receives=*/true);
    return c->reg;
  });
}

// A loop running on its thread with one receiving socket (p's reading end) already added.
struct RingLoop {
  OwnLoopThread loop;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(loop.ioc);
  Pair p;
  std::shared_ptr<RingClient> client = std::make_shared<RingClient>();
  RingLoop() {
    loop.Start();
    REQUIRE(AddReceiving(loop, p, client) != nullptr);
    REQUIRE(Poller::Completes(client->reg));
  }
  // Removes the socket, lets the loop finish, and checks it ended without an exception.
  void Finish() {
    OnLoop(loop, [&] { return client->poller->Remove(client->reg) != nullptr; });
    work.reset();
    loop.ioc.stop();
    loop.Join();
    CHECK(loop.threw.empty());
  }
};

TEST_CASE("the loop of our own receives through io_uring, beside readiness, timers and posts",
          "[poller][own_loop][io_uring]") {
  OwnLoopThread loop;
  auto work = asio::make_work_guard(loop.ioc);
  loop.Start();
  Pair p, q;
  auto client = std::make_shared<RingClient>();
  Poller::Registration* reg = AddReceiving(loop, p, client);
  REQUIRE(reg != nullptr);
  // This machine's kernel has io_uring (CI's does): a loop that fell back to readiness here
  // would not be the one this test is about.
  REQUIRE(Poller::Completes(reg) == RingWanted());
  if (!RingWanted()) return;
  CHECK(OnLoop(loop, [&] { return client->Arm(); }));
  // Bytes land in the client's buffer, one completion each time (the socket is empty between).
  for (int i = 1; i <= 3; ++i) {
    REQUIRE(p.Write());
    CHECK(Eventually([&] { return client->received == i; }));
    CHECK(client->last == 1);
    // The loop sleeps in the ring now: a post from another thread wakes it (the reactor's set).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<bool> ran{false};
    asio::post(loop.ioc, [&] { ran = true; });
    CHECK(Eventually([&] { return ran.load(); }));
  }
  CHECK(client->data == "xxx");
  // A descriptor watched for readiness in the same loop (the loop's epoll set, polled by the
  // ring) and a timer.
  auto ready = std::make_shared<CountingClient>(q.fd[0]);
  REQUIRE(OnLoop(loop, [&] {
    int error = 0;
    return Poller::For(loop.ioc.get_executor()).Add(q.fd[0], ready, &error) != nullptr;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(q.Write());
  CHECK(Eventually([&] { return ready->reads == 1; }));
  std::atomic<bool> fired{false};
  asio::steady_timer timer(loop.ioc, std::chrono::milliseconds(30));
  timer.async_wait([&](boost::system::error_code) { fired = true; });
  CHECK(Eventually([&] { return fired.load(); }));
  // The end of the stream: 0.
  ::close(p.fd[1]);
  p.fd[1] = -1;
  CHECK(Eventually([&] { return client->received == 4; }));
  CHECK(client->last == 0);
  CHECK(client->readies == 0);  // never told of readiness
  OnLoop(loop, [&] { return Poller::For(loop.ioc.get_executor()).Remove(reg) != nullptr; });
  work.reset();
  loop.ioc.stop();
  loop.Join();
  CHECK(loop.threw.empty());
}

TEST_CASE("a receiving socket removed with a receive in flight keeps its client until it ends",
          "[poller][own_loop][io_uring]") {
  if (!RingWanted()) return;
  RingLoop t;
  CHECK(OnLoop(t.loop, [&] { return t.client->Arm(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (submitted, waiting)
  std::weak_ptr<RingClient> weak = t.client;
  Poller* poller = t.client->poller;
  Poller::Registration* reg = t.client->reg;
  auto handed_back = OnLoop(t.loop, [&] { return poller->Remove(reg); });
  CHECK(handed_back == t.client);
  handed_back.reset();
  t.client.reset();
  // The socket was shut down, so the peer sees the end at once, and the receive ends; the client
  // lives until then (its buffer is the kernel's), and goes with its descriptor after.
  char c;
  CHECK(Eventually([&] { return ::recv(t.p.fd[1], &c, 1, MSG_DONTWAIT) == 0; }));
  CHECK(Eventually([&] { return weak.expired(); }));
  t.work.reset();
  t.loop.ioc.stop();
  t.loop.Join();
  CHECK(t.loop.threw.empty());
}

TEST_CASE("the io_context's end releases a receiving client whose receive is in flight",
          "[poller][own_loop][io_uring]") {
  if (!RingWanted()) return;
  std::weak_ptr<RingClient> weak;
  int peer = -1;
  {
    RingLoop t;
    CHECK(OnLoop(t.loop, [&] { return t.client->Arm(); }));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    weak = t.client;
    t.client.reset();
    CHECK_FALSE(weak.expired());  // the poller holds it
    t.loop.ioc.stop();
    t.loop.Join();
    CHECK(t.loop.threw.empty());
    std::swap(peer, t.p.fd[1]);  // (kept open past the pair)
    // (the io_context goes here, on this thread: the ring is closed, then the client freed)
  }
  CHECK(weak.expired());
  CHECK(::send(peer, "x", 1, MSG_NOSIGNAL) == -1);  // its descriptor is closed
  ::close(peer);
}

TEST_CASE("a hang-up watch fires on the peer's end, not on data", "[poller][own_loop][io_uring]") {
  if (!RingWanted()) return;
  RingLoop t;
  CHECK(OnLoop(t.loop, [&] { return t.client->poller->WatchHangUp(t.client->reg); }));
  REQUIRE(t.p.Write());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(t.client->hang_ups == 0);
  CHECK(t.client->received == 0);  // nothing received: no receive was asked for
  ::shutdown(t.p.fd[1], SHUT_WR);
  CHECK(Eventually([&] { return t.client->hang_ups == 1; }));
  t.Finish();
}

TEST_CASE("a loop that receives through io_uring refuses to run on another thread",
          "[poller][own_loop][io_uring]") {
  if (!RingWanted()) return;
  RingLoop t;
  t.loop.ioc.stop();
  t.loop.Join();
  t.loop.ioc.restart();
  CHECK_THROWS_AS(Poller::RunOwnLoop(t.loop.ioc), std::logic_error);
}

}  // namespace
}  // namespace rdmarpc::transport

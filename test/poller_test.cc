// The transport's Poller (transport/poller.h) on its own: what a TCP connection and the RDMA
// completion channel rely on from it -- readiness from inside io_context::run(), once per edge;
// removal at any moment (from inside its own event too, and of another descriptor whose event
// is already pending); the descriptor closed only once the reactor has let go of it;
// registrations that do not keep run() going by themselves; clients told and released when the
// io_context goes away.
#include "transport/poller.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
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

}  // namespace
}  // namespace rdmarpc::transport

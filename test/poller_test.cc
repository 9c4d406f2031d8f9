// The transport's Poller (transport/poller.h) on its own: what a TCP connection relies on from
// it -- events for registered descriptors from inside io_context::run(), removal at any moment
// (also of another descriptor whose event is in the same batch), registrations that do not
// keep run() going by themselves, and clients released when the io_context goes away.
#include "transport/poller.h"

#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <vector>

namespace rdmarpc::transport {
namespace {
namespace asio = boost::asio;

struct Pair {
  int fd[2] = {-1, -1};
  Pair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fd) == 0); }
  ~Pair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  void Write(const char* s = "x") { REQUIRE(::write(fd[1], s, 1) == 1); }
};

struct Recorder final : Poller::Client {
  int fd;
  std::vector<uint32_t> events;
  std::function<void()> on_ready;
  explicit Recorder(int f) : fd(f) {}
  void OnReady(uint32_t e) override {
    events.push_back(e);
    char buf[64];
    while (::read(fd, buf, sizeof buf) > 0) {
    }
    if (on_ready) on_ready();
  }
  size_t reads() const {
    size_t n = 0;
    for (uint32_t e : events) n += (e & EPOLLIN) != 0;
    return n;
  }
};

TEST_CASE("the poller reports readiness from inside run(), once per edge", "[poller]") {
  asio::io_context ioc(1);
  // What a connection holds while open (registrations are not work of their own; without
  // work, poll() returns at once).
  auto work = asio::make_work_guard(ioc);
  Pair p;
  auto rec = std::make_shared<Recorder>(p.fd[0]);
  int error = 0;
  Poller& poller = Poller::For(ioc.get_executor());
  auto* reg = poller.Add(p.fd[0], EPOLLIN, rec, &error);
  REQUIRE(reg != nullptr);
  p.Write();
  ioc.poll();
  CHECK(rec->reads() == 1);
  ioc.restart();
  ioc.poll();  // nothing new arrived: no second report
  CHECK(rec->reads() == 1);
  p.Write();
  ioc.restart();
  ioc.poll();
  CHECK(rec->reads() == 2);
  // Data that arrived before the registration is reported too.
  Pair q;
  q.Write();
  auto early = std::make_shared<Recorder>(q.fd[0]);
  REQUIRE(poller.Add(q.fd[0], EPOLLIN, early, &error) != nullptr);
  ioc.restart();
  ioc.poll();
  CHECK(early->reads() == 1);
  CHECK(poller.Remove(reg) == rec);
}

TEST_CASE("a registration does not keep run() going by itself", "[poller]") {
  asio::io_context ioc(1);
  Pair p;
  auto rec = std::make_shared<Recorder>(p.fd[0]);
  int error = 0;
  REQUIRE(Poller::For(ioc.get_executor()).Add(p.fd[0], EPOLLIN, rec, &error) != nullptr);
  ioc.run();  // returns: nothing but the registration is outstanding
  CHECK(rec->events.empty());
}

TEST_CASE("removing a descriptor whose event is in the same batch suppresses it", "[poller]") {
  asio::io_context ioc(1);
  auto work = asio::make_work_guard(ioc);
  Pair a, b;
  auto ra = std::make_shared<Recorder>(a.fd[0]);
  auto rb = std::make_shared<Recorder>(b.fd[0]);
  int error = 0;
  Poller& poller = Poller::For(ioc.get_executor());
  Poller::Registration* reg_a = poller.Add(a.fd[0], EPOLLIN, ra, &error);
  Poller::Registration* reg_b = poller.Add(b.fd[0], EPOLLIN, rb, &error);
  REQUIRE((reg_a && reg_b));
  // Whichever runs first removes both; the other's event, already taken from the kernel in the
  // same batch, must not reach it (its registration is gone, its client may be too).
  std::shared_ptr<Poller::Client> held_a, held_b;
  auto remove_both = [&] {
    if (reg_a) held_a = poller.Remove(std::exchange(reg_a, nullptr));
    if (reg_b) held_b = poller.Remove(std::exchange(reg_b, nullptr));
  };
  ra->on_ready = remove_both;
  rb->on_ready = remove_both;
  a.Write();
  b.Write();
  ioc.poll();
  CHECK(ra->events.size() + rb->events.size() == 1);
  CHECK(held_a == ra);
  CHECK(held_b == rb);
  // And nothing more comes for either.
  a.Write();
  b.Write();
  ioc.restart();
  ioc.poll();
  CHECK(ra->events.size() + rb->events.size() == 1);
}

TEST_CASE("the io_context's end releases the clients still registered", "[poller]") {
  Pair p;
  std::weak_ptr<Recorder> weak;
  {
    asio::io_context ioc(1);
    auto rec = std::make_shared<Recorder>(p.fd[0]);
    weak = rec;
    int error = 0;
    REQUIRE(Poller::For(ioc.get_executor()).Add(p.fd[0], EPOLLIN, std::move(rec), &error));
    p.Write();  // an event pending, never handed out
  }
  CHECK(weak.expired());
}

TEST_CASE("a descriptor that cannot be watched is refused with errno", "[poller]") {
  asio::io_context ioc(1);
  int error = 0;
  auto rec = std::make_shared<Recorder>(-1);
  CHECK(Poller::For(ioc.get_executor()).Add(-1, EPOLLIN, rec, &error) == nullptr);
  CHECK(error == EBADF);
  CHECK(rec.use_count() == 1);
}

}  // namespace
}  // namespace rdmarpc::transport

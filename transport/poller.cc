#include "transport/poller.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/detail/epoll_reactor.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/query.hpp>
#include <boost/version.hpp>
#include <cerrno>
#include <system_error>

// The detail API used below (epoll_reactor's internal descriptors, reactor_op) was read in this
// version; another one must be checked before this is built against it.
static_assert(BOOST_VERSION == 108100, "transport/poller.cc uses Boost.Asio 1.81's detail API");
#if !defined(BOOST_ASIO_HAS_EPOLL) || defined(BOOST_ASIO_HAS_IO_URING_AS_DEFAULT)
#error "transport/poller.cc needs Asio's epoll reactor"
#endif

namespace rdmarpc::transport {
namespace asio = boost::asio;
using Reactor = asio::detail::epoll_reactor;

boost::asio::execution_context::id Poller::id;

struct Poller::Registration {
  int fd = -1;
  std::shared_ptr<Client> client;
  Registration* prev = nullptr;
  Registration* next = nullptr;
  bool removed = false;
};

// Queued on epfd_'s read side for good: the reactor performs it whenever epfd_ becomes
// readable (under epfd_'s descriptor lock, which nothing else takes) and it never reports done,
// so it is never completed, re-queued or re-armed. The Poller owns it; the reactor only ever
// destroys it (at deregistration or shutdown), which must do nothing.
struct Poller::Op final : asio::detail::reactor_op {
  explicit Op(Poller* p)
      : reactor_op(boost::system::error_code(), &Perform, &Complete), poller(p) {}
  static status Perform(reactor_op* base) {
    static_cast<Op*>(base)->poller->Drain();
    return not_done;
  }
  static void Complete(void*, asio::detail::operation*, const boost::system::error_code&,
                       std::size_t) {}
  Poller* poller;
};

Poller::Poller(asio::execution_context& context) : asio::execution_context::service(context) {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) {
    throw std::system_error(errno, std::generic_category(), "epoll_create1 for the poller");
  }
  Reactor& reactor = asio::use_service<Reactor>(context);
  reactor_ = &reactor;
  op_ = std::make_unique<Op>(this);
  Reactor::per_descriptor_data data = nullptr;
  if (int e = reactor.register_internal_descriptor(Reactor::read_op, epfd_, data, op_.get())) {
    reactor.cleanup_descriptor_data(data);
    ::close(epfd_);
    throw std::system_error(e, std::generic_category(), "registering the poller");
  }
  reactor_data_ = data;
  // Make sure the io_context runs the reactor at all (its I/O object services do this; a
  // context whose first I/O is ours would otherwise never look at epfd_).
  reactor.init_task();
}

Poller::~Poller() {
  shutdown();
  if (epfd_ >= 0) ::close(epfd_);
}

void Poller::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  auto* reactor = static_cast<Reactor*>(reactor_);
  auto data = static_cast<Reactor::per_descriptor_data>(reactor_data_);
  reactor->deregister_internal_descriptor(epfd_, data);
  reactor->cleanup_descriptor_data(data);
  reactor_data_ = nullptr;
  // Drop the clients (their descriptors close with them); the io_context is going away.
  for (Registration* lists : {live_, removed_}) {
    for (Registration* r = lists; r;) {
      Registration* next = r->next;
      delete r;
      r = next;
    }
  }
  live_ = removed_ = nullptr;
}

Poller& Poller::For(const Executor& executor) {
  return asio::use_service<Poller>(asio::query(executor, asio::execution::context));
}

Poller::Registration* Poller::Add(int fd, uint32_t events, std::shared_ptr<Client> client,
                                  int* error) {
  if (shut_down_) {
    *error = ESHUTDOWN;
    return nullptr;
  }
  auto* r = new Registration;
  epoll_event ev{};
  ev.events = events | EPOLLET;
  ev.data.ptr = r;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    *error = errno;
    delete r;
    return nullptr;
  }
  r->fd = fd;
  r->client = std::move(client);
  r->next = live_;
  if (live_) live_->prev = r;
  live_ = r;
  return r;
}

std::shared_ptr<Poller::Client> Poller::Remove(Registration* r) {
  if (shut_down_ || r == nullptr) return nullptr;
  epoll_event ev{};
  ::epoll_ctl(epfd_, EPOLL_CTL_DEL, r->fd, &ev);
  if (r->prev) r->prev->next = r->next;
  if (r->next) r->next->prev = r->prev;
  if (live_ == r) live_ = r->next;
  std::shared_ptr<Client> client = std::move(r->client);
  if (draining_) {
    // Events for it may still be in the batch being handed out: free it after the batch.
    r->removed = true;
    r->prev = nullptr;
    r->next = removed_;
    removed_ = r;
  } else {
    delete r;
  }
  return client;
}

void Poller::Drain() {
  constexpr int kBatch = 64;
  epoll_event events[kBatch];
  draining_ = true;
  // Also when a client throws (it then leaves io_context::run(), as a handler's exception does).
  struct EndBatch {
    Poller* p;
    ~EndBatch() {
      p->draining_ = false;
      while (Registration* r = p->removed_) {
        p->removed_ = r->next;
        delete r;
      }
    }
  } end_batch{this};
  for (;;) {
    // syscall() rather than epoll_wait(): glibc's wrapper is a thread-cancellation point and
    // costs ~120 instructions more; nothing here is ever cancelled that way.
    const long n = ::syscall(SYS_epoll_wait, epfd_, events, kBatch, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (long i = 0; i < n; ++i) {
      auto* r = static_cast<Registration*>(events[i].data.ptr);
      if (r->removed) continue;
      // The client stays alive through its own call: Remove hands its reference to the caller.
      r->client->OnReady(events[i].events);
    }
    // A short batch emptied the ready list; what becomes ready from now on wakes the reactor
    // again (epfd_ is edge-triggered there).
    if (n < kBatch) break;
  }
}

}  // namespace rdmarpc::transport

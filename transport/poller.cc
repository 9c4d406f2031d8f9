#include "transport/poller.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <boost/asio/detail/epoll_reactor.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/version.hpp>
#include <cerrno>

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

// Queued on the descriptor's read side for good: the reactor performs it each time the
// descriptor reports readable (or an error or hang-up), under that descriptor's lock, and it
// never reports done, so it is never completed, re-queued or re-armed. The Registration owns
// it; the reactor only ever destroys it (at deregistration or shutdown), which must do nothing.
struct Poller::Op final : asio::detail::reactor_op {
  explicit Op(Registration* r)
      : reactor_op(boost::system::error_code(), &Perform, &Complete), registration(r) {}
  static status Perform(reactor_op* base);
  static void Complete(void*, asio::detail::operation*, const boost::system::error_code&,
                       std::size_t) {}
  Registration* registration;
};

struct Poller::Registration {
  explicit Registration(int f) : fd(f), op(this) {}
  int fd;
  Reactor::per_descriptor_data data = nullptr;
  std::shared_ptr<Client> client;
  Op op;
  Registration* prev = nullptr;
  Registration* next = nullptr;
  bool removed = false;
  bool in_ready = false;  // inside client->OnReady: the reactor holds this descriptor's lock
};

namespace {
// The events the reactor is handling for a descriptor: from epoll_wait to the end of its
// perform_io they are kept in the descriptor's state, an operation, as its task_result_
// (protected), and perform_io does not hand them to the operations it performs. Read through a
// pointer to the member formed in a derived class.
struct EventsOf : asio::detail::scheduler_operation {
  static constexpr unsigned int asio::detail::scheduler_operation::*kTaskResult =
      &EventsOf::task_result_;
};
}  // namespace

Poller::Op::status Poller::Op::Perform(reactor_op* base) {
  Registration* r = static_cast<Op*>(base)->registration;
  if (r->removed) return not_done;
  r->in_ready = true;
  // Reset even if the client throws (it then leaves io_context::run(), as a handler would).
  struct Reset {
    Registration* r;
    ~Reset() { r->in_ready = false; }
  } reset{r};
  // (A C-style cast: descriptor_state derives from the operation privately.)
  const auto* state = (const asio::detail::scheduler_operation*)r->data;
  const bool failed = (state->*EventsOf::kTaskResult & (EPOLLERR | EPOLLHUP)) != 0;
  // The client stays alive through its own call: Remove hands its reference to the caller.
  r->client->OnReady(failed);
  return not_done;
}

Poller::Poller(asio::execution_context& context) : asio::execution_context::service(context) {
  Reactor& reactor = asio::use_service<Reactor>(context);
  reactor_ = &reactor;
  // Make sure the io_context runs the reactor at all (its I/O object services do this; a
  // context whose first I/O is ours would otherwise never look at our descriptors).
  reactor.init_task();
}

Poller::~Poller() { shutdown(); }

void Poller::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Before the reactor's own shutdown (it was made first, so it goes last), which would
  // otherwise still hold our operations. The clients go too (their descriptors closed here).
  while (Registration* r = live_) {
    if (r->client) r->client->OnPollerGone();
    Deregister(r);
  }
}

Poller& Poller::For(const Executor& executor) {
  Poller& p = asio::use_service<Poller>(asio::query(executor, asio::execution::context));
  if (!p.executor_) p.executor_ = executor;
  return p;
}

Poller::Registration* Poller::Add(int fd, std::shared_ptr<Client> client, int* error) {
  if (shut_down_) {
    ::close(fd);
    *error = ESHUTDOWN;
    return nullptr;
  }
  auto* r = new Registration(fd);
  auto* reactor = static_cast<Reactor*>(reactor_);
  if (int e = reactor->register_internal_descriptor(Reactor::read_op, fd, r->data, &r->op)) {
    // The op was queued on the state before epoll_ctl failed: take it off (deregistering does,
    // destroying it, which does nothing) before the state goes back to the reactor's pool and
    // the op's memory is freed.
    reactor->deregister_internal_descriptor(fd, r->data);
    reactor->cleanup_descriptor_data(r->data);
    delete r;
    ::close(fd);
    *error = e;
    return nullptr;
  }
  r->client = std::move(client);
  r->next = live_;
  if (live_) live_->prev = r;
  live_ = r;
  return r;
}

std::shared_ptr<Poller::Client> Poller::Remove(Registration* r) {
  if (shut_down_ || r == nullptr || r->removed) return nullptr;
  r->removed = true;
  std::shared_ptr<Client> client = std::move(r->client);
  if (!r->in_ready) {
    Deregister(r);
  } else {
    // Deregistering takes the descriptor's lock, which the reactor holds around OnReady.
    asio::post(executor_, [this, r] {
      if (!shut_down_) Deregister(r);
    });
  }
  return client;
}

void Poller::Deregister(Registration* r) {
  auto* reactor = static_cast<Reactor*>(reactor_);
  reactor->deregister_internal_descriptor(r->fd, r->data);
  reactor->cleanup_descriptor_data(r->data);
  ::close(r->fd);
  if (r->prev) r->prev->next = r->next;
  if (r->next) r->next->prev = r->prev;
  if (live_ == r) live_ = r->next;
  delete r;
}

}  // namespace rdmarpc::transport

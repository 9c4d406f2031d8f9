#include "transport/poller.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <boost/asio/detail/call_stack.hpp>
#include <boost/asio/detail/epoll_reactor.hpp>
#include <boost/asio/detail/op_queue.hpp>
#include <boost/asio/detail/reactor_op.hpp>
#include <boost/asio/detail/scheduler.hpp>
#include <boost/asio/detail/scheduler_thread_info.hpp>
#include <boost/asio/detail/thread_context.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/query.hpp>
#include <boost/version.hpp>
#include <cerrno>
#include <stdexcept>
#include <system_error>

// The detail API used below (epoll_reactor's internal descriptors, reactor_op) was read in this
// version; another one must be checked before this is built against it.
static_assert(BOOST_VERSION == 108100, "transport/poller.cc uses Boost.Asio 1.81's detail API");
#if !defined(BOOST_ASIO_HAS_EPOLL) || defined(BOOST_ASIO_HAS_IO_URING_AS_DEFAULT)
#error "transport/poller.cc needs Asio's epoll reactor"
#endif
#if !defined(BOOST_ASIO_HAS_TIMERFD)
// The loop of our own sleeps outside the reactor's epoll_wait: Asio's timers must wake it
// through a timerfd in the reactor's set, not through that wait's timeout.
#error "transport/poller.cc needs Asio's reactor to keep its timers in a timerfd"
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

// Private members of Asio's scheduler and reactor that the loop of our own needs (poller.h),
// named through explicit instantiation, which may name private members.
template <typename Tag, typename Tag::type kMember>
struct Reach {
  friend typename Tag::type Member(Tag) { return kMember; }
};
using Scheduler = asio::detail::scheduler;
struct SchedulerMutex {
  using type = asio::detail::conditionally_enabled_mutex Scheduler::*;
  friend type Member(SchedulerMutex);
};
struct SchedulerQueue {
  using type = asio::detail::op_queue<asio::detail::scheduler_operation> Scheduler::*;
  friend type Member(SchedulerQueue);
};
struct TaskInterrupted {
  using type = bool Scheduler::*;
  friend type Member(TaskInterrupted);
};
struct SchedulerStopped {
  using type = bool Scheduler::*;
  friend type Member(SchedulerStopped);
};
struct ReactorEpoll {
  using type = int Reactor::*;
  friend type Member(ReactorEpoll);
};
template struct Reach<SchedulerMutex, &Scheduler::mutex_>;
template struct Reach<SchedulerQueue, &Scheduler::op_queue_>;
template struct Reach<TaskInterrupted, &Scheduler::task_interrupted_>;
template struct Reach<SchedulerStopped, &Scheduler::stopped_>;
template struct Reach<ReactorEpoll, &Reactor::epoll_fd_>;
}  // namespace

// Hands an event (epoll's flags) to r's client, marked as inside its OnReady meanwhile.
static void Deliver(Poller::Registration* r, uint32_t events) {
  r->in_ready = true;
  // Reset even if the client throws (it then leaves the loop, as a handler would).
  struct Reset {
    Poller::Registration* r;
    ~Reset() { r->in_ready = false; }
  } reset{r};
  const bool failed = (events & (EPOLLERR | EPOLLHUP)) != 0;
  // The client stays alive through its own call: Remove hands its reference to the caller.
  r->client->OnReady(failed);
}

Poller::Op::status Poller::Op::Perform(reactor_op* base) {
  Registration* r = static_cast<Op*>(base)->registration;
  if (r->removed) return not_done;
  // (A C-style cast: descriptor_state derives from the operation privately.)
  const auto* state = (const asio::detail::scheduler_operation*)r->data;
  Deliver(r, state->*EventsOf::kTaskResult);
  return not_done;
}

Poller::Poller(asio::execution_context& context) : asio::execution_context::service(context) {
  Reactor& reactor = asio::use_service<Reactor>(context);
  reactor_ = &reactor;
  // Make sure the io_context runs the reactor at all (its I/O object services do this; a
  // context whose first I/O is ours would otherwise never look at our descriptors).
  reactor.init_task();
}

Poller::~Poller() {
  shutdown();
  if (own_epoll_ >= 0) ::close(own_epoll_);
}

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
  if (own_epoll_ >= 0) {
    if (!WatchInOwnSet(r)) {
      *error = errno;
      delete r;
      ::close(fd);
      return nullptr;
    }
  } else if (int e = reactor->register_internal_descriptor(Reactor::read_op, fd, r->data, &r->op)) {
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
  if (!r->in_ready || own_epoll_ >= 0) {
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
  if (own_epoll_ >= 0) {
    epoll_event ev{};
    ::epoll_ctl(own_epoll_, EPOLL_CTL_DEL, r->fd, &ev);
  } else {
    auto* reactor = static_cast<Reactor*>(reactor_);
    reactor->deregister_internal_descriptor(r->fd, r->data);
    reactor->cleanup_descriptor_data(r->data);
  }
  if (r->prev) r->prev->next = r->next;
  if (r->next) r->next->prev = r->prev;
  if (live_ == r) live_ = r->next;
  if (in_batch_) {
    // A later event of the batch being handled may point at it, and its client may still be
    // inside OnReady with the descriptor: closed and freed once the batch is done.
    r->removed = true;
    r->next = removed_in_batch_;
    removed_in_batch_ = r;
  } else {
    ::close(r->fd);
    delete r;
  }
}

bool Poller::WatchInOwnSet(Registration* r) {
  // The reactor's flags for its internal descriptors (edge-triggered).
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLPRI | EPOLLET;
  ev.data.ptr = r;
  return ::epoll_ctl(own_epoll_, EPOLL_CTL_ADD, r->fd, &ev) == 0;
}

void Poller::RunOwnLoop(asio::io_context& ioc) {
  Poller& p = asio::use_service<Poller>(ioc);
  if (p.own_epoll_ < 0) p.StartOwnLoop();
  p.Run(ioc);
}

void Poller::StartOwnLoop() {
  const int epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  // The reactor's set, level-triggered: readable while the reactor has events to collect (its
  // timerfd, Asio's own descriptors, the interrupter a post from another thread sets off).
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  auto* reactor = static_cast<Reactor*>(reactor_);
  if (::epoll_ctl(epfd, EPOLL_CTL_ADD, reactor->*Member(ReactorEpoll{}), &ev) != 0) {
    const int e = errno;
    ::close(epfd);
    throw std::system_error(e, std::generic_category(), "epoll_ctl(reactor)");
  }
  own_epoll_ = epfd;
  // Descriptors added while the reactor watched them move over (what is pending on them is
  // reported again: their new registration is edge-triggered from its start).
  for (Registration* r = live_; r != nullptr; r = r->next) {
    if (r->removed) continue;
    reactor->deregister_internal_descriptor(r->fd, r->data);
    reactor->cleanup_descriptor_data(r->data);
    if (!WatchInOwnSet(r)) {
      throw std::system_error(errno, std::generic_category(), "epoll_ctl(descriptor)");
    }
  }
}

void Poller::Run(asio::io_context& ioc) {
  Scheduler& scheduler = asio::use_service<Scheduler>(ioc);
  auto& mutex = scheduler.*Member(SchedulerMutex{});
  auto& queue = scheduler.*Member(SchedulerQueue{});
  bool& task_interrupted = scheduler.*Member(TaskInterrupted{});
  const bool& stopped = scheduler.*Member(SchedulerStopped{});
  using Access = asio::detail::op_queue_access;
  // The thread as Asio's handlers see it while the loop handles a batch of events, as if inside
  // run(): dispatch() runs inline, a post goes to this thread's private queue without a lock,
  // handler memory is recycled through it. Lives as long as the loop (its recycled blocks).
  asio::detail::scheduler_thread_info batch_thread;
  batch_thread.private_outstanding_work = 0;
  struct BatchEnd {
    Poller* p;
    ~BatchEnd() {
      p->in_batch_ = false;
      while (Registration* r = p->removed_in_batch_) {
        p->removed_in_batch_ = r->next;
        ::close(r->fd);
        delete r;
      }
    }
  };
  constexpr int kMaxEvents = 64;
  // Asio's handlers run at most this many at a time before the descriptors get their turn: a
  // handler that posts itself again (a spin, a stream's yield) must not hold them off.
  constexpr int kAsioBurst = 64;
  epoll_event events[kMaxEvents];
  bool run_asio = true;  // what was posted before the loop started
  // The reactor's task operation, which stays queued while the loop sleeps (known once the
  // queue was seen holding it alone).
  const void* task_op = nullptr;
  for (;;) {
    if (run_asio) {
      if (task_op != nullptr) {
        // Handlers posted while the loop slept queue behind the reactor's task, whose run
        // (epoll_wait on the reactor's set, to take what woke the loop) poll_one would do
        // first: run them first, as run() does (its task was out of the queue, blocked).
        asio::detail::conditionally_enabled_mutex::scoped_lock lock(mutex);
        auto* front = Access::front(queue);
        if (front == task_op && Access::next(front) != nullptr) {
          queue.pop();
          queue.push(front);
        }
      }
      for (int i = 0; i < kAsioBurst && ioc.poll_one() != 0; ++i) {
      }
      // Stopped, or out of work (poll_one() stops it then, as run() does).
      if (ioc.stopped()) return;
      asio::detail::conditionally_enabled_mutex::scoped_lock lock(mutex);
      // Only the reactor's task left queued (it always is, between polls): sleep, with the
      // flag clear, so that a post or stop() from any thread interrupts the reactor, whose set
      // then wakes this loop. Anything more is either left from a full burst or came in from
      // another thread while the flag was still set (no interrupt), and so may a stop(): take
      // the descriptors' events without sleeping, then poll again.
      if (!stopped && Access::front(queue) == Access::back(queue)) {
        task_op = Access::front(queue);
        task_interrupted = false;
        run_asio = false;
      }
    }
    const int n = ::epoll_wait(own_epoll_, events, kMaxEvents, run_asio ? 0 : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "epoll_wait");
    }
    {
      asio::detail::call_stack<asio::detail::thread_context,
                               asio::detail::thread_info_base>::context in_loop(&scheduler,
                                                                                batch_thread);
      in_batch_ = true;
      BatchEnd end{this};
      for (int i = 0; i < n; ++i) {
        auto* r = static_cast<Registration*>(events[i].data.ptr);
        if (r == nullptr) {
          run_asio = true;
          continue;
        }
        if (r->removed) continue;
        Deliver(r, events[i].events);
      }
    }
    // A handler dispatched inline in the batch that threw: out of the loop, as out of run().
    batch_thread.rethrow_pending_exception();
    if (!batch_thread.private_op_queue.empty() || batch_thread.private_outstanding_work > 0) {
      // Handlers the batch posted: hand them and their work count to the scheduler, as its own
      // run() does after each handler, and run them before sleeping.
      asio::detail::conditionally_enabled_mutex::scoped_lock lock(mutex);
      for (; batch_thread.private_outstanding_work > 0; --batch_thread.private_outstanding_work) {
        scheduler.work_started();
      }
      queue.push(batch_thread.private_op_queue);
      run_asio = true;
    }
  }
}

}  // namespace rdmarpc::transport

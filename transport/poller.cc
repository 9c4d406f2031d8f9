#include "transport/poller.h"

#include <liburing.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
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
#include <cstdlib>
#include <cstring>
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

namespace {
// The loop's epoll_wait as a raw system call: glibc's wrapper is a thread-cancellation point
// (~30 instructions per wake-up more than this, for nothing here, as for the transports' recv
// and send). Out of line and named, so that a profile counts the loop's sleeps by this
// function (tools/bench/lib.sh, cg_sleeps).
[[gnu::noipa]] int LoopEpollWait(int epfd, epoll_event* events, int max, int timeout_ms) {
  return static_cast<int>(::syscall(SYS_epoll_wait, epfd, events, max, timeout_ms));
}
}  // namespace

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
  bool in_ready = false;    // inside client->OnReady: the reactor holds this descriptor's lock
  bool completion = false;  // receives through io_uring (in no epoll set)
  uint8_t ops = 0;          // io_uring operations in flight (a receive, a hang-up watch)
  bool draining = false;    // removed with ops in flight: on Poller::draining_
  // After Remove while ops were in flight: the client whose buffer the kernel may still fill.
  std::shared_ptr<Client> keep;
};

// The io_uring of a loop of our own (poller.h). Operations carry a Registration's address with
// their kind in its low bits; the loop's own polls carry constants.
struct Poller::Ring {
  ~Ring() {
    if (made) io_uring_queue_exit(&ring);
  }
  io_uring ring{};
  bool made = false;
  std::thread::id owner;
  // A poll on the loop's epoll set and one on the reactor's set are in the ring (single-shot,
  // armed again before each sleep: a poll armed on a set that is already readable completes at
  // once, so nothing left in a set is missed).
  bool own_set_polled = false;
  bool reactor_polled = false;
  bool bounded_sleep = false;  // under valgrind (UseRing)
};

namespace {
constexpr uint64_t kKindMask = 3;
constexpr uint64_t kReceiveKind = 1;
constexpr uint64_t kHangUpKind = 2;
constexpr uint64_t kOwnSetPoll = 3;       // (no address: kind 3 alone)
constexpr uint64_t kReactorPoll = 4 | 3;  // (likewise)
static_assert(alignof(std::max_align_t) > kKindMask);
}  // namespace

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
struct SchedulerWork {
  using type = asio::detail::atomic_count Scheduler::*;
  friend type Member(SchedulerWork);
};
struct ReactorEpoll {
  using type = int Reactor::*;
  friend type Member(ReactorEpoll);
};
template struct Reach<SchedulerMutex, &Scheduler::mutex_>;
template struct Reach<SchedulerQueue, &Scheduler::op_queue_>;
template struct Reach<TaskInterrupted, &Scheduler::task_interrupted_>;
template struct Reach<SchedulerStopped, &Scheduler::stopped_>;
template struct Reach<SchedulerWork, &Scheduler::outstanding_work_>;
template struct Reach<ReactorEpoll, &Reactor::epoll_fd_>;
}  // namespace

// The poller's lists of registrations (live_, draining_), doubly linked through prev/next.
static void Push(Poller::Registration*& head, Poller::Registration* r) {
  r->prev = nullptr;
  r->next = head;
  if (head) head->prev = r;
  head = r;
}
static void Unlink(Poller::Registration*& head, Poller::Registration* r) {
  if (r->prev) r->prev->next = r->next;
  if (r->next) r->next->prev = r->prev;
  if (head == r) head = r->next;
  r->prev = nullptr;
}

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
  scheduler_ = &asio::use_service<Scheduler>(context);
  // Make sure the io_context runs the reactor at all (its I/O object services do this; a
  // context whose first I/O is ours would otherwise never look at our descriptors).
  reactor.init_task();
}

long Poller::WorkCount() const {
  static_assert(std::is_same_v<asio::detail::atomic_count, std::atomic<long>>);
  return (static_cast<Scheduler*>(scheduler_)->*Member(SchedulerWork{}))
      .load(std::memory_order_relaxed);
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
  // Closing the ring drops its operations without running them (no thread is inside its
  // io_uring_enter now, and only that would): the buffers they held are free after it.
  ring_.reset();
  while (Registration* r = draining_) {
    draining_ = r->next;
    ::close(r->fd);
    delete r;
  }
}

Poller& Poller::For(const Executor& executor) {
  Poller& p = asio::use_service<Poller>(asio::query(executor, asio::execution::context));
  if (!p.executor_) p.executor_ = executor;
  return p;
}

Poller::Registration* Poller::Add(int fd, std::shared_ptr<Client> client, int* error,
                                  bool receives) {
  if (shut_down_) {
    ::close(fd);
    *error = ESHUTDOWN;
    return nullptr;
  }
  auto* r = new Registration(fd);
  auto* reactor = static_cast<Reactor*>(reactor_);
  if (receives && own_epoll_ >= 0 && UseRing()) {
    r->completion = true;  // watched by nothing until its client asks for a receive
  } else if (own_epoll_ >= 0) {
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
  Push(live_, r);
  return r;
}

bool Poller::Completes(const Registration* r) { return r != nullptr && r->completion; }

bool Poller::UseRing() {
  if (ring_) return ring_->owner == std::this_thread::get_id();
  // Made only by the thread running the loop: the ring is that thread's from then on.
  if (ring_off_ || run_thread_ != std::this_thread::get_id()) return false;
  const char* want = std::getenv("RDMARPC_IO_URING");
  if (want != nullptr && std::strcmp(want, "0") == 0) {
    ring_off_ = true;
    return false;
  }
  // Valgrind (its preloads are how it shows) neither sees the kernel's writes into receive
  // buffers (memcheck would call every received byte uninitialised) nor lets other threads run
  // while one sleeps in io_uring_enter (3.19 does not count it as a blocking call): readiness
  // under it, unless RDMARPC_IO_URING=1 asks for the ring (callgrind counting its path), which
  // then sleeps at most 10 ms at a time (a wake-up every 10 ms when idle, counted in such a
  // profile). (Sleeping in epoll_wait on the ring's descriptor instead does not work: with
  // DEFER_TASKRUN, a receive that is ready to finish does not make that descriptor readable.)
  const char* preload = std::getenv("LD_PRELOAD");
  const bool valgrind = preload != nullptr && std::strstr(preload, "vgpreload") != nullptr;
  if (valgrind && (want == nullptr || std::strcmp(want, "1") != 0)) {
    ring_off_ = true;
    return false;
  }
  auto ring = std::make_unique<Ring>();
  io_uring_params p{};
  // DEFER_TASKRUN: completions are finished (a receive's copy into its buffer included) only
  // inside this thread's io_uring_enter, never behind its back; SINGLE_ISSUER comes with it.
  // Sizes: the submissions of one turn of the loop (more are submitted at once to make room),
  // and room for a burst of completions (each socket has at most two operations in flight; past
  // the queue, the kernel keeps them on its overflow list, which io_uring_enter empties into it).
  p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_CQSIZE;
  p.cq_entries = 4096;
  if (io_uring_queue_init_params(256, &ring->ring, &p) < 0) {
    ring_off_ = true;  // (an old kernel, io_uring_disabled, a seccomp filter: readiness it is)
    return false;
  }
  ring->made = true;
  ring->owner = std::this_thread::get_id();
  ring->bounded_sleep = valgrind;
  // The reactor's set is watched by a poll of the ring's own from now on, not through the
  // loop's set: a wake-up for Asio then costs no epoll_wait of the loop's.
  epoll_event ev{};
  auto* reactor = static_cast<Reactor*>(reactor_);
  ::epoll_ctl(own_epoll_, EPOLL_CTL_DEL, reactor->*Member(ReactorEpoll{}), &ev);
  ring_ = std::move(ring);
  return true;
}

// A submission queue entry (the queue is flushed to make room if this is the ring's thread).
static inline io_uring_sqe* NextSqe(io_uring* ring, std::thread::id owner) {
  io_uring_sqe* s = io_uring_get_sqe(ring);
  if (s == nullptr && owner == std::this_thread::get_id()) [[unlikely]] {
    io_uring_submit(ring);
    s = io_uring_get_sqe(ring);
  }
  return s;
}

bool Poller::Receive(Registration* r, std::span<std::byte> into, bool expect_wait) {
  io_uring_sqe* s = NextSqe(&ring_->ring, ring_->owner);
  if (s == nullptr) return false;
  io_uring_prep_recv(s, r->fd, into.data(), into.size(), 0);
  if (expect_wait) s->ioprio |= IORING_RECVSEND_POLL_FIRST;
  io_uring_sqe_set_data64(s, reinterpret_cast<uint64_t>(r) | kReceiveKind);
  ++r->ops;
  return true;
}

bool Poller::WatchHangUp(Registration* r) {
  io_uring_sqe* s = NextSqe(&ring_->ring, ring_->owner);
  if (s == nullptr) return false;
  io_uring_prep_poll_add(s, r->fd, POLLRDHUP);
  io_uring_sqe_set_data64(s, reinterpret_cast<uint64_t>(r) | kHangUpKind);
  ++r->ops;
  return true;
}

std::shared_ptr<Poller::Client> Poller::Remove(Registration* r) {
  if (shut_down_ || r == nullptr || r->removed) return nullptr;
  r->removed = true;
  std::shared_ptr<Client> client = std::move(r->client);
  if (r->ops > 0) r->keep = client;
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
  if (r->completion) {
    // (in no epoll set)
  } else if (own_epoll_ >= 0) {
    epoll_event ev{};
    ::epoll_ctl(own_epoll_, EPOLL_CTL_DEL, r->fd, &ev);
  } else {
    auto* reactor = static_cast<Reactor*>(reactor_);
    reactor->deregister_internal_descriptor(r->fd, r->data);
    reactor->cleanup_descriptor_data(r->data);
  }
  Unlink(live_, r);
  if (r->ops > 0) {
    // The kernel may still write into the client's buffer: it and the client stay until the
    // operations complete, which shutting the socket down makes them do soon (or until the
    // ring closes, at shutdown).
    ::shutdown(r->fd, SHUT_RDWR);
    r->removed = true;
    r->draining = true;
    Push(draining_, r);
    return;
  }
  Dispose(r);
}

void Poller::Dispose(Registration* r) {
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
  if (p.ring_ && p.ring_->owner != std::this_thread::get_id()) {
    // Its receives complete only inside the io_uring_enter of the thread that made it.
    throw std::logic_error(
        "rdmarpc::RunLoop: this io_context's loop receives through an io_uring made by another "
        "thread; run it on that thread (or set RDMARPC_IO_URING=0)");
  }
  struct Running {
    Poller& p;
    explicit Running(Poller& q) : p(q) { p.run_thread_ = std::this_thread::get_id(); }
    ~Running() { p.run_thread_ = std::thread::id(); }
  } running(p);
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

// Hands a batch of the loop's epoll events to their clients (null: the reactor's set).
void Poller::DeliverEvents(const epoll_event* events, int n, bool* run_asio) {
  for (int i = 0; i < n; ++i) {
    auto* r = static_cast<Registration*>(events[i].data.ptr);
    if (r == nullptr) {
      *run_asio = true;
      continue;
    }
    if (r->removed) continue;
    Deliver(r, events[i].events);
  }
}

// Submits what is queued in the ring and, with `sleep`, waits for a completion, in one system
// call (liburing's own submit-and-wait spends ~130 instructions more around it). The submission
// array maps slot i to entry i once and for all (liburing sets it up so), so submitting is
// publishing the tail.
int Poller::Enter(bool sleep) {
  io_uring& ring = ring_->ring;
  io_uring_sq& sq = ring.sq;
  const unsigned tail = sq.sqe_tail;
  if (sq.sqe_head != tail) {
    sq.sqe_head = tail;
    io_uring_smp_store_release(sq.ktail, tail);
  }
  const unsigned submit = tail - *sq.khead;
  unsigned flags = IORING_ENTER_GETEVENTS;  // (runs the deferred task work: the receives)
  io_uring_getevents_arg arg{};
  __kernel_timespec most{.tv_sec = 0, .tv_nsec = 10'000'000};
  const void* extra = nullptr;
  size_t extra_size = 0;
  if (sleep && ring_->bounded_sleep) {
    arg.ts = reinterpret_cast<uint64_t>(&most);
    flags |= IORING_ENTER_EXT_ARG;
    extra = &arg;
    extra_size = sizeof arg;
  }
  const long r = ::syscall(__NR_io_uring_enter, ring.ring_fd, submit, sleep ? 1u : 0u, flags, extra,
                           extra_size);
  return r < 0 ? -errno : static_cast<int>(r);
}

void Poller::ArmSetPolls() {
  io_uring* ring = &ring_->ring;
  if (!ring_->own_set_polled) {
    if (io_uring_sqe* s = NextSqe(ring, ring_->owner)) {
      io_uring_prep_poll_add(s, own_epoll_, POLLIN);
      io_uring_sqe_set_data64(s, kOwnSetPoll);
      ring_->own_set_polled = true;
    }
  }
  if (!ring_->reactor_polled) {
    if (io_uring_sqe* s = NextSqe(ring, ring_->owner)) {
      io_uring_prep_poll_add(s, static_cast<Reactor*>(reactor_)->*Member(ReactorEpoll{}), POLLIN);
      io_uring_sqe_set_data64(s, kReactorPoll);
      ring_->reactor_polled = true;
    }
  }
}

// Hands at most `most` of the ring's completions to their clients; with more left, the next
// turn must not sleep. Each completion leaves the queue before it is handled, so that a
// handler's exception leaves none to be handled twice.
void Poller::Reap(unsigned most, bool* run_asio) {
  io_uring_cq& cq = ring_->ring.cq;
  unsigned head = *cq.khead;
  const unsigned tail = io_uring_smp_load_acquire(cq.ktail);
  const unsigned n = std::min(tail - head, most);
  if (tail - head > n) *run_asio = true;
  for (unsigned i = 0; i < n; ++i, ++head) {
    const io_uring_cqe& c = cq.cqes[head & cq.ring_mask];
    const uint64_t user_data = c.user_data;
    const int result = c.res;
    io_uring_smp_store_release(cq.khead, head + 1);
    Completed(user_data, result, run_asio);
  }
}

void Poller::Bury() {
  while (Registration* r = removed_in_batch_) {
    removed_in_batch_ = r->next;
    ::close(r->fd);
    delete r;
  }
}

inline void Poller::Completed(uint64_t user_data, int result, bool* run_asio) {
  if ((user_data & kKindMask) == kReceiveKind) [[likely]] {
    auto* r = reinterpret_cast<Registration*>(user_data & ~kKindMask);
    if (!r->removed) [[likely]] {
      --r->ops;
      r->client->OnReceived(result);
      return;
    }
  }
  CompletedOther(user_data, result, run_asio);
}

// Completions but a live registration's receive: the loop's polls, hang-up watches, and the
// last operations of removed registrations.
void Poller::CompletedOther(uint64_t user_data, int result, bool* run_asio) {
  if (user_data == kOwnSetPoll) {
    ring_->own_set_polled = false;
    epoll_event events[64];
    const int n = LoopEpollWait(own_epoll_, events, 64, 0);
    if (n > 0) DeliverEvents(events, n, run_asio);
    return;
  }
  if (user_data == kReactorPoll) {
    ring_->reactor_polled = false;
    *run_asio = true;
    return;
  }
  auto* r = reinterpret_cast<Registration*>(user_data & ~kKindMask);
  if (r == nullptr) return;
  --r->ops;
  if (r->removed) {
    if (r->ops == 0 && r->draining) {
      r->draining = false;
      // The last operation of a registration removed meanwhile: off the draining list.
      Unlink(draining_, r);
      Dispose(r);  // (the client goes with it, at the batch's end)
    }
    return;
  }
  r->client->OnHangUp();
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
      if (p->removed_in_batch_ != nullptr) [[unlikely]]
        p->Bury();
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
  // The ring is this thread's (RunOwnLoop checked), or made by it while it runs.
  bool ring_thread = ring_ != nullptr;
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
    // (A handler or an event may have made the ring since the last turn.)
    if (!ring_thread && ring_) ring_thread = ring_->owner == std::this_thread::get_id();
    int n = 0;  // (epoll's events)
    if (ring_thread) {
      if (!ring_->own_set_polled || !ring_->reactor_polled) ArmSetPolls();
      const int e = Enter(!run_asio);
      if (e < 0 && e != -EINTR && e != -EAGAIN && e != -EBUSY && e != -ETIME) {
        throw std::system_error(-e, std::generic_category(), "io_uring_enter");
      }
    } else {
      n = LoopEpollWait(own_epoll_, events, kMaxEvents, run_asio ? 0 : -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw std::system_error(errno, std::generic_category(), "epoll_wait");
      }
    }
    {
      asio::detail::call_stack<asio::detail::thread_context,
                               asio::detail::thread_info_base>::context in_loop(&scheduler,
                                                                                batch_thread);
      in_batch_ = true;
      BatchEnd end{this};
      if (ring_thread) {
        Reap(kMaxEvents, &run_asio);
      } else {
        DeliverEvents(events, n, &run_asio);
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

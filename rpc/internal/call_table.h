// The client channel's bookkeeping of calls, free of I/O (rpc/channel.cc; tested alone in
// test/call_table_test.cc):
//   CallTable  slots reused by index, each with a generation naming one use of it, so that the
//              call id the server echoes (generation << 32 | index) finds its call or nothing
//              (a late reply to an abandoned call, a forged id);
//   WaitList   the calls waiting to be admitted (room under the limits, a connection), first
//              come first served, linked through the calls themselves: no allocation.
// Neither is thread-safe: a channel touches them on its own thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace rdmarpc::internal {

// `Slot` has `uint32_t generation` and `bool active`; the table owns and sets both. Slots do
// not move once made (references stay valid while the table lives); their other fields are
// the channel's.
template <class Slot>
class CallTable {
 public:
  // A slot for a new call, marked active: a free one if any, else a new one.
  uint32_t Alloc() {
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.push_back(std::make_unique<Slot>());
    }
    slots_[index]->active = true;
    return index;
  }
  // Ends the use of slot `index` (active): the call id it had names nothing from now on, and
  // the slot goes to a later call.
  void Free(uint32_t index) {
    Slot& s = *slots_[index];
    s.active = false;
    ++s.generation;
    free_.push_back(index);
  }

  // The wire id of the call in slot `index`.
  uint64_t CallId(uint32_t index) const {
    return (static_cast<uint64_t>(slots_[index]->generation) << 32) | index;
  }
  // The active slot `call_id` names (index in range, same generation), with its index; null
  // for anything else.
  Slot* Find(uint64_t call_id, uint32_t* index) {
    *index = static_cast<uint32_t>(call_id);
    if (*index >= slots_.size()) return nullptr;
    Slot& s = *slots_[*index];
    if (!s.active || s.generation != static_cast<uint32_t>(call_id >> 32)) return nullptr;
    return &s;
  }
  // The slot of `index` and `generation` when it is still that use (active); else null.
  Slot* Find(uint32_t index, uint32_t generation) {
    return const_cast<Slot*>(std::as_const(*this).Find(index, generation));
  }
  const Slot* Find(uint32_t index, uint32_t generation) const {
    if (index >= slots_.size()) return nullptr;
    const Slot& s = *slots_[index];
    return s.active && s.generation == generation ? &s : nullptr;
  }

  Slot& operator[](uint32_t index) { return *slots_[index]; }
  const Slot& operator[](uint32_t index) const { return *slots_[index]; }
  // Every slot ever made, free ones included (index order).
  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }

 private:
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<uint32_t> free_;
};

// `T` has `T* prev`, `T* next` and `bool queued`, which only the list touches.
template <class T>
class WaitList {
 public:
  bool empty() const { return head_ == nullptr; }
  T* front() const { return head_; }
  void PushBack(T* t) {
    t->queued = true;
    t->next = nullptr;
    t->prev = tail_;
    (tail_ ? tail_->next : head_) = t;
    tail_ = t;
  }
  // Takes `t` (queued) out, wherever it is.
  void Remove(T* t) {
    (t->prev ? t->prev->next : head_) = t->next;
    (t->next ? t->next->prev : tail_) = t->prev;
    t->prev = t->next = nullptr;
    t->queued = false;
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
};

}  // namespace rdmarpc::internal

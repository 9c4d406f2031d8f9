// The client channel's call bookkeeping without a network (rpc/internal/call_table.h): call ids
// that name one use of a slot only, slots reused, and the admission queue's order.
#include "rpc/internal/call_table.h"

#include <catch2/catch.hpp>
#include <vector>

using rdmarpc::internal::CallTable;
using rdmarpc::internal::WaitList;

namespace {
struct Slot {
  uint32_t generation = 1;
  bool active = false;
  Slot* prev = nullptr;
  Slot* next = nullptr;
  bool queued = false;
  int tag = 0;
};

std::vector<int> Order(const WaitList<Slot>& list) {
  std::vector<int> tags;
  for (Slot* s = list.front(); s; s = s->next) tags.push_back(s->tag);
  return tags;
}
}  // namespace

TEST_CASE("a call id finds its call, and nothing once the call is over", "[call_table]") {
  CallTable<Slot> t;
  const uint32_t a = t.Alloc(), b = t.Alloc();
  CHECK(a != b);
  const uint64_t id_a = t.CallId(a), id_b = t.CallId(b);
  uint32_t index = 99;
  CHECK(t.Find(id_a, &index) == &t[a]);
  CHECK(index == a);
  CHECK(t.Find(id_b, &index) == &t[b]);

  t.Free(a);
  CHECK(t.Find(id_a, &index) == nullptr);  // a late reply to the finished call
  CHECK(t.Find(a, static_cast<uint32_t>(id_a >> 32)) == nullptr);
  // The slot goes to the next call, under a new id; the old one still finds nothing.
  const uint32_t c = t.Alloc();
  CHECK(c == a);
  CHECK(t.CallId(c) != id_a);
  CHECK(t.Find(id_a, &index) == nullptr);
  CHECK(t.Find(t.CallId(c), &index) == &t[c]);
  CHECK(t.Find(c, static_cast<uint32_t>(t.CallId(c) >> 32)) == &t[c]);
  CHECK(t.size() == 2);  // nothing new was made
}

TEST_CASE("forged call ids find nothing", "[call_table]") {
  CallTable<Slot> t;
  uint32_t index = 0;
  CHECK(t.Find(uint64_t{1} << 32, &index) == nullptr);  // no slot at all
  const uint32_t a = t.Alloc();
  const uint64_t id = t.CallId(a);
  CHECK(t.Find(id + 1, &index) == nullptr);                    // an index never handed out
  CHECK(t.Find(id ^ (uint64_t{7} << 32), &index) == nullptr);  // another generation
  CHECK(t.Find(uint64_t{0xffffffff}, &index) == nullptr);
  CHECK(t.Find(a + 5, 1) == nullptr);
}

TEST_CASE("slots stay where they are while the table grows", "[call_table]") {
  CallTable<Slot> t;
  const uint32_t first = t.Alloc();
  Slot* p = &t[first];
  for (int i = 0; i < 1000; ++i) t.Alloc();
  CHECK(&t[first] == p);
  CHECK(t.size() == 1001);
}

TEST_CASE("the admission queue is first come, first served, and a call may leave it anywhere",
          "[call_table]") {
  Slot s[4];
  for (int i = 0; i < 4; ++i) s[i].tag = i;
  WaitList<Slot> list;
  CHECK(list.empty());
  for (auto& x : s) list.PushBack(&x);
  CHECK(Order(list) == std::vector<int>{0, 1, 2, 3});
  CHECK(s[2].queued);
  list.Remove(&s[2]);  // middle
  CHECK_FALSE(s[2].queued);
  CHECK(Order(list) == std::vector<int>{0, 1, 3});
  list.Remove(&s[0]);  // head
  list.Remove(&s[3]);  // tail
  CHECK(Order(list) == std::vector<int>{1});
  list.PushBack(&s[0]);  // back in, at the end
  CHECK(Order(list) == std::vector<int>{1, 0});
  list.Remove(&s[1]);
  list.Remove(&s[0]);
  CHECK(list.empty());
  CHECK(list.front() == nullptr);
}

// The tracker's tag table: one copy per tag, the thread's cache refilled whenever its tag
// scope, the table or the table's epoch changes, and collection bounded by what records name.
// Then the tracker over it: tags of live allocations and of events stay right through scopes
// that reuse one buffer for thousands of tags, collections, threads, and two trackers.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

#include <vram/adaptor/detail/tracker/tag_table.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/source/host_source.hpp>

namespace {

using vram::detail::tracker::tag_table;

std::string name_of(const std::string* t) { return t == nullptr ? std::string() : *t; }

/// For tables that are never full() here.
void no_collection() { FAIL("a table of a few tags asked for a collection"); }

}  // namespace

TEST_CASE("tag_table: the current tag through nested scopes and a reused buffer", "[adaptor][tracker]") {
  tag_table table;
  CHECK(table.current(no_collection) == nullptr);  // untagged
  char buffer[16] = "layer1";
  const std::string* first = nullptr;
  {
    vram::tag_scope outer(buffer);
    first = table.current(no_collection);
    REQUIRE(first != nullptr);
    CHECK(*first == "layer1");
    CHECK(table.current(no_collection) == first);  // the cache's answer is the same copy
    {
      vram::tag_scope inner("inner");
      CHECK(name_of(table.current(no_collection)) == "inner");
    }
    CHECK(table.current(no_collection) == first);  // back to the outer tag, same copy
  }
  CHECK(table.current(no_collection) == nullptr);
  // The same buffer, other content, in a new scope: a new tag, though the pointer is the same.
  std::snprintf(buffer, sizeof buffer, "layer2");
  {
    vram::tag_scope again(buffer);
    CHECK(name_of(table.current(no_collection)) == "layer2");
  }
  buffer[5] = '1';  // "layer1" again: the first copy, not a second one
  {
    vram::tag_scope again(buffer);
    CHECK(table.current(no_collection) == first);
  }
  CHECK(table.size() == 3);
  CHECK(table.intern("") == nullptr);
  CHECK(table.intern("inner") == table.intern(std::string("inner")));
}

TEST_CASE("tag_table: collection keeps what records name and bounds the table", "[adaptor][tracker]") {
  tag_table table;
  std::vector<const std::string*> kept;  // what "records" name: every 10th tag
  std::size_t largest = 0;
  const auto collect = [&] {
    REQUIRE(table.full());
    table.collect([&](auto&& used) {
      for (const std::string* t : kept) used(t);
    });
  };
  for (int i = 0; i < 20000; ++i) {
    const std::string name = "tag" + std::to_string(i);
    vram::tag_scope scope(name.c_str());
    const std::string* t = table.current(collect);
    REQUIRE(name_of(t) == name);
    if (i % 10 == 0) kept.push_back(t);
    largest = std::max(largest, table.size());
  }
  for (std::size_t k = 0; k < kept.size(); ++k) REQUIRE(*kept[k] == "tag" + std::to_string(k * 10));
  // Twice what is named, plus the first threshold, at most.
  CHECK(largest <= 2 * kept.size() + 1024);
  CHECK(table.size() < 20000);
  // After a collection the thread's cache refills: the answer is a kept copy again.
  const std::string* before = nullptr;
  {
    vram::tag_scope scope("tag0");
    before = table.current(collect);
    CHECK(before == kept[0]);
    table.collect([&](auto&& used) {
      for (const std::string* t : kept) used(t);
    });
    CHECK(table.current(collect) == kept[0]);
  }
}

TEST_CASE("tag_table: two tables on one thread keep their own copies", "[adaptor][tracker]") {
  tag_table a, b;
  vram::tag_scope scope("shared");
  const std::string* in_a = a.current(no_collection);
  const std::string* in_b = b.current(no_collection);
  CHECK(in_a != in_b);
  CHECK(a.current(no_collection) == in_a);  // after b filled the thread's cache
  CHECK(b.current(no_collection) == in_b);
  CHECK(*in_a == "shared");
  CHECK(*in_b == "shared");
}

TEST_CASE("tracker_adaptor: tags of live allocations and events through thousands of scopes, threads and two trackers",
          "[adaptor][tracker]") {
  vram::tracker_options options;
  options.event_capacity = 512;
  vram::tracker_adaptor<vram::host_source> a(vram::host_source{}, options), b(vram::host_source{}, options);
  constexpr int threads = 3, per_thread = 3000;
  struct held {
    void* p;
    std::size_t bytes;
    std::string tag;
    bool in_a;
  };
  std::vector<std::vector<held>> kept(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 7);
      std::string name;  // one buffer for every tag of the thread
      std::vector<held> live;
      for (int i = 0; i < per_thread; ++i) {
        name = "t" + std::to_string(t) + ".op" + std::to_string(i);
        vram::tag_scope scope(name.c_str());
        const bool in_a = rng() % 2 == 0;
        const std::size_t bytes = 16 + rng() % 512;
        void* p = (in_a ? a : b).allocate_sync(bytes);
        live.push_back({p, bytes, name, in_a});
        if (live.size() > 40) {  // free a random one, keep the others
          const std::size_t k = rng() % live.size();
          (live[k].in_a ? a : b).deallocate_sync(live[k].p, live[k].bytes);
          live[k] = live.back();
          live.pop_back();
        }
      }
      kept[t] = live;
    });
  for (auto& th : pool) th.join();

  for (auto* tr : {&a, &b}) {
    std::map<const void*, std::string> want;
    for (const auto& v : kept)
      for (const held& h : v)
        if ((tr == &a) == h.in_a) want[h.p] = h.tag;
    const auto live = tr->live_allocations();
    REQUIRE(live.size() == want.size());
    for (const vram::tracked_allocation& x : live) REQUIRE(x.tag == want.at(x.address));
    // Every event names the tag its block was allocated under (no tag here is longer than
    // max_event_tag): a block's segment_alloc starts it, its alloc and frees repeat it.
    std::map<std::uint64_t, std::string> alloc_tag;
    for (const vram::tracker_event& e : tr->events()) {
      const std::string tag = e.tag.data();
      REQUIRE(tag.rfind('t', 0) == 0);
      if (e.action == vram::tracker_action::segment_alloc) alloc_tag[e.address] = tag;
      else if (auto it = alloc_tag.find(e.address); it != alloc_tag.end()) REQUIRE(tag == it->second);
    }
    tr->check_invariants();
  }
  for (const auto& v : kept)
    for (const held& h : v) (h.in_a ? a : b).deallocate_sync(h.p, h.bytes);
  CHECK(a.live_allocations().empty());
  CHECK(b.live_allocations().empty());
}

TEST_CASE("tracker_adaptor: tags stay whole through collections: live records, the ring, a thread's cached tag",
          "[adaptor][tracker]") {
  vram::tracker_options options;
  options.event_capacity = 4096;  // about 800 pairs: the ring spans collections
  vram::tracker_adaptor<vram::host_source> tr(vram::host_source{}, options);
  void* kept = nullptr;
  {
    vram::tag_scope scope("kept.block");
    kept = tr.allocate_sync(64);
  }
  // A thread whose tag scope outlives collections that drop its tag: its cache must not
  // answer with the dropped copy.
  std::binary_semaphore cached(0), churned(0);
  std::string late_tag;
  std::thread worker([&] {
    vram::tag_scope scope("cached.tag");
    tr.deallocate_sync(tr.allocate_sync(16), 16);
    cached.release();
    churned.acquire();
    void* p = tr.allocate_sync(16);
    for (const vram::tracked_allocation& a : tr.live_allocations())
      if (a.address == p) late_tag = a.tag;
    tr.deallocate_sync(p, 16);
  });
  cached.acquire();
  std::string name;  // one buffer for every tag
  for (int i = 0; i < 6000; ++i) {
    name = "churn." + std::to_string(i);
    vram::tag_scope scope(name.c_str());
    tr.deallocate_sync(tr.allocate_sync(32), 32);
  }
  churned.release();
  worker.join();
  CHECK(late_tag == "cached.tag");

  const auto live = tr.live_allocations();
  REQUIRE(live.size() == 1);
  CHECK(live[0].tag == "kept.block");
  // The ring's oldest entries were written before the last collections: each pair's events
  // carry the tag the pair was made under, whole.
  std::map<std::uint64_t, std::string> open_tag;
  std::size_t churn_events = 0;
  for (const vram::tracker_event& e : tr.events()) {
    const std::string tag = e.tag.data();
    if (e.action == vram::tracker_action::segment_alloc) open_tag[e.address] = tag;
    else if (auto it = open_tag.find(e.address); it != open_tag.end()) REQUIRE(tag == it->second);
    if (tag.rfind("churn.", 0) == 0) ++churn_events;
    else REQUIRE(tag == "cached.tag");
  }
  CHECK(churn_events > 3000);
  tr.deallocate_sync(kept, 64);
  tr.check_invariants();
}

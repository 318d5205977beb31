// budget_slab: size classes and page runs inside a fixed device budget, spill to host,
// pressure callback, return to device, misuse, random sequences and threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <vram/alloc/budget_slab.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

using device_t = vram::test::recording_resource<vram::simulated_device_source>;
using slab_t = vram::budget_slab<device_t, vram::host_source>;

device_t make_device() {
  return device_t(vram::simulated_device_source(
      vram::simulated_device_options{.capacity = 64 * MiB, .granularity = 2 * MiB}));
}

std::vector<std::size_t> state(const slab_t& s) {
  auto st = s.stats();
  return {st.live_bytes, st.requested_bytes, st.reserved_bytes, st.live_allocations, st.total_allocations,
          st.total_deallocations, st.spills, st.spilled_bytes, st.free_bytes, st.free_blocks};
}

/// Every spilled pointer must be host memory: write all of it and read it back.
void touch_host(void* p, std::size_t bytes) {
  std::memset(p, 0x5a, bytes);
  auto* c = static_cast<unsigned char*>(p);
  REQUIRE(c[0] == 0x5a);
  REQUIRE(c[bytes - 1] == 0x5a);
}

}  // namespace

TEST_CASE("budget_slab: the budget is one reservation; size classes and runs come from it", "[budget_slab]") {
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 4 * MiB});
  CHECK(slab.device_budget() == 4 * MiB);
  CHECK(slab.upstream().counters().allocations == 1);
  CHECK(slab.upstream().counters().live_bytes == 4 * MiB);
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t bytes : {1ul, 256ul, 300ul, 4096ul, 5000ul, 32768ul, 32769ul, 65536ul, 200000ul}) {
    void* p = slab.allocate_sync(bytes);
    CHECK(slab.residency(p) == vram::residency::device);
    CHECK(slab.owns(p));
    std::size_t natural = std::min<std::size_t>(std::bit_ceil(std::max<std::size_t>(bytes, 256)), 64 * KiB);
    CHECK(vram::is_aligned(p, natural));  // blocks are aligned to their class, runs to a page
    blocks.emplace_back(p, bytes);
    slab.check_invariants();
  }
  void* aligned = slab.allocate_sync(100, 16 * KiB);
  CHECK(vram::is_aligned(aligned, 16 * KiB));
  CHECK_THROWS_AS(slab.allocate_sync(100, 128 * KiB), vram::invalid_argument);
  auto st = slab.stats();
  CHECK(st.live_allocations == blocks.size() + 1);
  CHECK(st.spills == 0);
  CHECK(st.live_bytes == 256 + 256 + 512 + 4096 + 8192 + 32768 + 65536 + 65536 + 4 * 65536 + 16384);
  CHECK(st.live_bytes + st.free_bytes == st.reserved_bytes);
  slab.deallocate_sync(aligned, 100, 16 * KiB);
  for (auto [p, bytes] : blocks) slab.deallocate_sync(p, bytes);
  slab.check_invariants();
  CHECK(slab.stats().live_bytes == 0);
  CHECK(slab.upstream().counters().allocations == 1);  // nothing beyond the reservation, ever
}

TEST_CASE("budget_slab: a full budget spills to host memory, and freed device memory is used again",
          "[budget_slab]") {
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 1 * MiB});
  std::vector<void*> device_blocks;
  for (int i = 0; i < 4; ++i) device_blocks.push_back(slab.allocate_sync(256 * KiB));  // the whole budget
  CHECK(slab.stats().free_bytes == 0);
  void* spilled = slab.allocate_sync(100 * KiB);
  CHECK(slab.residency(spilled) == vram::residency::host);
  touch_host(spilled, 100 * KiB);
  void* small = slab.allocate_sync(300);  // no page left for a slab either
  CHECK(slab.residency(small) == vram::residency::host);
  touch_host(small, 300);
  auto st = slab.stats();
  CHECK(st.spills == 2);
  CHECK(st.spilled_bytes == 100 * KiB + 300);
  CHECK(st.peak_spilled_bytes == st.spilled_bytes);
  CHECK(st.reserved_bytes == 1 * MiB + st.spilled_bytes);
  slab.check_invariants();

  slab.deallocate_sync(device_blocks.back(), 256 * KiB);
  device_blocks.pop_back();
  void* back = slab.allocate_sync(150 * KiB);  // three of the four freed pages
  CHECK(slab.residency(back) == vram::residency::device);  // the device again
  void* back_small = slab.allocate_sync(300);
  CHECK(slab.residency(back_small) == vram::residency::device);
  slab.deallocate_sync(spilled, 100 * KiB);
  slab.deallocate_sync(small, 300);
  CHECK(slab.stats().spilled_bytes == 0);
  CHECK(slab.stats().peak_spilled_bytes == 100 * KiB + 300);
  CHECK(slab.spill_upstream().live_allocations() == 0);
  slab.deallocate_sync(back, 150 * KiB);
  slab.deallocate_sync(back_small, 300);
  for (void* p : device_blocks) slab.deallocate_sync(p, 256 * KiB);
  slab.check_invariants();
}

TEST_CASE("budget_slab: the pressure callback runs before spilling and may make room", "[budget_slab]") {
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 512 * KiB});
  void* cold = slab.allocate_sync(256 * KiB);
  void* hot = slab.allocate_sync(256 * KiB);
  int calls = 0;
  slab.set_pressure_callback([&](std::size_t bytes) {
    ++calls;
    CHECK(bytes == 128 * KiB);
    if (cold == nullptr) return false;
    slab.deallocate_sync(cold, 256 * KiB);  // evict: re-entering the slab from the callback is fine
    cold = nullptr;
    return true;
  });
  void* p = slab.allocate_sync(128 * KiB);
  CHECK(calls == 1);
  CHECK(slab.residency(p) == vram::residency::device);
  CHECK(slab.stats().spills == 0);
  void* q = slab.allocate_sync(128 * KiB);  // fits in the rest of the evicted space
  CHECK(calls == 1);
  void* r = slab.allocate_sync(128 * KiB);  // nothing left to evict: spills
  CHECK(calls == 2);
  CHECK(slab.residency(r) == vram::residency::host);
  for (void* x : {p, q, r}) slab.deallocate_sync(x, 128 * KiB);
  slab.deallocate_sync(hot, 256 * KiB);
  slab.check_invariants();
}

TEST_CASE("budget_slab: beyond both budgets is out_of_memory naming both, and nothing changes", "[budget_slab]") {
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 256 * KiB, .spill_budget = 100 * KiB});
  void* d = slab.allocate_sync(256 * KiB);
  void* h = slab.allocate_sync(60 * KiB);
  CHECK(slab.residency(h) == vram::residency::host);
  auto before = state(slab);
  try {
    (void)slab.allocate_sync(50 * KiB);
    FAIL("expected out_of_memory");
  } catch (const vram::out_of_memory& e) {
    std::string what = e.what();
    INFO(what);
    CHECK(e.bytes() == 50 * KiB);
    CHECK(what.find("device budget 262144") != std::string::npos);
    CHECK(what.find("spill budget 102400") != std::string::npos);
    CHECK(e.stats().spilled_bytes == 60 * KiB);
  }
  CHECK(state(slab) == before);
  CHECK(slab.stats().ooms == 1);
  CHECK(slab.spill_upstream().live_allocations() == 1);
  // Unlimited spill, failing spill source: still out_of_memory, saying the spill source failed.
  slab.set_spill_budget(~std::size_t{0});
  CHECK_THROWS_AS(slab.allocate_sync(std::size_t{1} << 52), vram::out_of_memory);
  CHECK(state(slab) == before);
  slab.deallocate_sync(h, 60 * KiB);
  slab.deallocate_sync(d, 256 * KiB);
  slab.check_invariants();
}

TEST_CASE("budget_slab: freed single pages are cached, and merged again when a larger run needs them",
          "[budget_slab]") {
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 1 * MiB});  // 16 pages
  std::vector<void*> pages;
  for (int i = 0; i < 16; ++i) pages.push_back(slab.allocate_sync(64 * KiB));  // one-page runs
  CHECK(slab.stats().free_bytes == 0);
  // Freed in a scattered order: every page goes to the single-page cache, not merged yet.
  std::mt19937_64 rng(11);
  std::shuffle(pages.begin(), pages.end(), rng);
  for (void* p : pages) {
    slab.deallocate_sync(p, 64 * KiB);
    slab.check_invariants();
  }
  CHECK(slab.stats().free_bytes == 1 * MiB);
  // A one-page request is served from the cache (the most recently freed page).
  void* again = slab.allocate_sync(64 * KiB);
  CHECK(again == pages.back());
  slab.deallocate_sync(again, 64 * KiB);
  // The whole budget as one run: found after the cache is flushed and merged, on the device.
  void* all = slab.allocate_sync(1 * MiB);
  CHECK(slab.residency(all) == vram::residency::device);
  CHECK(slab.stats().spills == 0);
  CHECK(slab.stats().free_bytes == 0);
  slab.check_invariants();
  slab.deallocate_sync(all, 1 * MiB);
  slab.check_invariants();
  // Slabs of size classes take and give single pages through the cache too.
  std::vector<void*> small;
  for (int i = 0; i < 16 * 64; ++i) small.push_back(slab.allocate_sync(1 * KiB));  // 64 per page: all 16 pages
  CHECK(slab.stats().free_bytes == 0);
  CHECK(slab.stats().spills == 0);
  for (void* p : small) slab.deallocate_sync(p, 1 * KiB);
  slab.check_invariants();
  void* half = slab.allocate_sync(512 * KiB);
  void* other_half = slab.allocate_sync(512 * KiB - 64 * KiB);  // one page stays a slab of the class
  CHECK(slab.residency(half) == vram::residency::device);
  CHECK(slab.residency(other_half) == vram::residency::device);
  CHECK(slab.stats().spills == 0);
  slab.deallocate_sync(half, 512 * KiB);
  slab.deallocate_sync(other_half, 512 * KiB - 64 * KiB);
  slab.check_invariants();
  CHECK(slab.stats().live_bytes == 0);
}

TEST_CASE("budget_slab: misuse is reported and changes nothing", "[budget_slab]") {
  vram::test::misuse_capture capture;
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 256 * KiB, .spill_budget = 1 * MiB});
  void* small = slab.allocate_sync(1000);         // class 1 KiB
  void* run = slab.allocate_sync(100 * KiB);      // a run of two pages
  void* spilled = slab.allocate_sync(200 * KiB);  // beyond the budget
  REQUIRE(slab.residency(spilled) == vram::residency::host);
  void* other = slab.allocate_sync(1000);
  slab.deallocate_sync(other, 1000);
  auto before = state(slab);

  alignas(256) static char foreign[1024];
  slab.deallocate_sync(foreign, 1024);
  CHECK(capture.count(vram::misuse::foreign_pointer) == 1);
  slab.deallocate_sync(static_cast<char*>(small) + 256, 768);  // not a block start
  CHECK(capture.count(vram::misuse::foreign_pointer) == 2);
  slab.deallocate_sync(static_cast<char*>(run) + 64 * KiB, 36 * KiB);  // inside a run
  CHECK(capture.count(vram::misuse::foreign_pointer) == 3);
  slab.deallocate_sync(small, 5000);  // another class
  slab.deallocate_sync(run, 99 * KiB);
  slab.deallocate_sync(spilled, 1);
  CHECK(capture.count(vram::misuse::wrong_size) == 3);
  slab.deallocate_sync(other, 1000);  // a freed block of a live slab
  CHECK(capture.count(vram::misuse::double_free) == 1);
  CHECK(state(slab) == before);
  slab.check_invariants();

  // A spilled pointer freed after the budgets changed (device room freed, spill budget lowered)
  // still goes back to the spill side; freeing it again is reported.
  slab.deallocate_sync(run, 100 * KiB);
  slab.set_spill_budget(0);
  slab.deallocate_sync(spilled, 200 * KiB);
  CHECK(slab.stats().spilled_bytes == 0);
  CHECK(slab.spill_upstream().live_allocations() == 0);
  auto after = state(slab);
  slab.deallocate_sync(spilled, 200 * KiB);
  slab.deallocate_sync(run, 100 * KiB);
  CHECK(capture.count(vram::misuse::foreign_pointer) == 4);
  CHECK(capture.count(vram::misuse::double_free) == 2);
  CHECK(state(slab) == after);
  slab.deallocate_sync(small, 1000);
  slab.check_invariants();
  CHECK(capture.count() == 9);
}

TEST_CASE("budget_slab: random operations agree with a reference model", "[budget_slab][property]") {
  std::mt19937_64 rng(GENERATE(11u, 12u, 13u));
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 2 * MiB, .spill_budget = 4 * MiB});
  std::map<char*, std::size_t> device, host;  // the model: live blocks by side
  std::vector<std::pair<char*, std::size_t>> live;
  std::size_t spill_fail = 0;
  for (int op = 0; op < 4000; ++op) {
    if (rng() % 100 < 55 || live.empty()) {
      std::size_t bytes = rng() % 10 == 0 ? 1 + rng() % (300 * KiB) : 1 + rng() % (16 * KiB);
      char* p = nullptr;
      try {
        p = static_cast<char*>(slab.allocate_sync(bytes));
      } catch (const vram::out_of_memory&) {
        ++spill_fail;
        continue;
      }
      auto& side = slab.residency(p) == vram::residency::device ? device : host;
      REQUIRE(slab.residency(p) != vram::residency::none);
      auto it = side.lower_bound(p);
      if (it != side.end()) REQUIRE(p + bytes <= it->first);
      if (it != side.begin()) REQUIRE(std::prev(it)->first + std::prev(it)->second <= p);
      if (&side == &host) touch_host(p, bytes);
      side.emplace(p, bytes);
      live.emplace_back(p, bytes);
    } else {
      std::size_t i = rng() % live.size();
      auto [p, bytes] = live[i];
      (device.contains(p) ? device : host).erase(p);
      slab.deallocate_sync(p, bytes);
      live[i] = live.back();
      live.pop_back();
    }
    slab.check_invariants();
    auto st = slab.stats();
    REQUIRE(st.live_allocations == live.size());
    REQUIRE(st.live_bytes - st.spilled_bytes <= slab.device_budget());
    REQUIRE(st.spilled_bytes <= 4 * MiB);
    std::size_t host_bytes = 0;
    for (auto& [p, b] : host) host_bytes += b;
    REQUIRE(st.spilled_bytes == host_bytes);
  }
  CHECK(slab.stats().spills > 0);  // the sequence did reach the spill side
  for (auto [p, bytes] : live) slab.deallocate_sync(p, bytes);
  slab.check_invariants();
  CHECK(slab.upstream().counters().allocations == 1);
}

TEST_CASE("budget_slab: several threads never exceed the budget or overlap", "[budget_slab][threads]") {
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 1 * MiB, .spill_budget = 2 * MiB});
  std::mutex model_mutex;
  std::map<char*, std::size_t> device_live;  // every live device block, all threads
  std::atomic<int> errors{0};
  std::atomic<std::size_t> spills{0};
  auto worker = [&](unsigned seed) {
    std::mt19937_64 rng(seed);
    vram::host_stream stream;
    std::vector<std::pair<char*, std::size_t>> mine;
    for (int op = 0; op < 3000; ++op) {
      if (rng() % 2 == 0 || mine.empty()) {
        std::size_t bytes = rng() % 8 == 0 ? 1 + rng() % (200 * KiB) : 1 + rng() % (8 * KiB);
        char* p;
        try {
          p = static_cast<char*>(slab.allocate(stream, bytes));
        } catch (const vram::out_of_memory&) {
          continue;
        }
        if (slab.residency(p) == vram::residency::host) {
          std::memset(p, static_cast<int>(seed), bytes);
          ++spills;
        } else {
          std::lock_guard lock(model_mutex);
          auto it = device_live.lower_bound(p);
          if (it != device_live.end() && p + bytes > it->first) ++errors;
          if (it != device_live.begin() && std::prev(it)->first + std::prev(it)->second > p) ++errors;
          device_live.emplace(p, bytes);
        }
        mine.emplace_back(p, bytes);
      } else {
        std::size_t i = rng() % mine.size();
        auto [p, bytes] = mine[i];
        if (slab.residency(p) == vram::residency::device) {
          std::lock_guard lock(model_mutex);
          device_live.erase(p);
        }
        slab.deallocate(stream, p, bytes);
        mine[i] = mine.back();
        mine.pop_back();
      }
      auto st = slab.stats();
      if (st.live_bytes - st.spilled_bytes > slab.device_budget() || st.spilled_bytes > 2 * MiB) ++errors;
    }
    for (auto [p, bytes] : mine) {
      if (slab.residency(p) == vram::residency::device) {
        std::lock_guard lock(model_mutex);
        device_live.erase(p);
      }
      slab.deallocate_sync(p, bytes);
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) threads.emplace_back(worker, 100 + t);
  for (auto& t : threads) t.join();
  CHECK(errors == 0);
  CHECK(spills > 0);
  slab.check_invariants();
  CHECK(slab.stats().live_bytes == 0);
  CHECK(slab.upstream().counters().allocations == 1);
  CHECK(slab.upstream().counters().peak_live_bytes == 1 * MiB);
  CHECK(slab.spill_upstream().live_allocations() == 0);
}

TEST_CASE("budget_slab: thread caches reuse a freed block, keep stats exact and misuse caught", "[budget_slab][threads]") {
  vram::test::misuse_capture capture;
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 128 * KiB});
  void* p = slab.allocate_sync(300);  // class 512 B
  slab.deallocate_sync(p, 300);       // into this thread's cache
  auto st = slab.stats();
  CHECK(st.live_bytes == 0);
  CHECK(st.requested_bytes == 0);
  CHECK(st.live_allocations == 0);
  CHECK(st.total_allocations == 1);
  CHECK(st.total_deallocations == 1);
  CHECK_FALSE(slab.owns(p));
  slab.check_invariants();

  void* q = slab.allocate_sync(400);  // the same class: the cached block comes back
  CHECK(q == p);
  CHECK(slab.owns(q));
  CHECK(slab.stats().live_bytes == 512);
  CHECK(slab.stats().requested_bytes == 400);
  slab.deallocate_sync(q, 400);
  auto before = state(slab);

  slab.deallocate_sync(q, 400);  // a second free of a cached block, on this thread ...
  std::thread other([&] { slab.deallocate_sync(q, 400); });  // ... and on another one
  other.join();
  CHECK(capture.count(vram::misuse::double_free) == 2);
  CHECK(state(slab) == before);
  slab.check_invariants();

  // Before spilling, this thread's cache goes back to the slabs (free_blocks counts the
  // slabs' free blocks, not the cached ones): the 128 KiB run still cannot be served (the
  // slab stays, the last of its class) but the cached block is free again.
  const std::size_t free_blocks = slab.stats().free_blocks;
  void* big = slab.allocate_sync(128 * KiB);
  CHECK(slab.residency(big) == vram::residency::host);
  CHECK(slab.stats().free_blocks == free_blocks + 1);
  slab.deallocate_sync(big, 128 * KiB);
  slab.check_invariants();
  CHECK(capture.count() == 2);
}

TEST_CASE("budget_slab: a thread's cache goes back to the slabs when it exits", "[budget_slab][threads]") {
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 64 * KiB});  // one page
  std::thread t([&] {
    void* a = slab.allocate_sync(32 * KiB);  // the page becomes a slab of two 32 KiB blocks
    void* b = slab.allocate_sync(32 * KiB);
    CHECK(slab.residency(b) == vram::residency::device);
    slab.deallocate_sync(a, 32 * KiB);  // both into t's cache (two blocks of 32 KiB fit)
    slab.deallocate_sync(b, 32 * KiB);
  });
  t.join();
  slab.check_invariants();
  CHECK(slab.stats().live_bytes == 0);
  CHECK(slab.stats().free_blocks == 2);  // flushed at t's exit: both free in the slab again
  void* a = slab.allocate_sync(32 * KiB);
  void* b = slab.allocate_sync(32 * KiB);
  CHECK(slab.residency(a) == vram::residency::device);  // not spilled: nothing held by t
  CHECK(slab.residency(b) == vram::residency::device);
  CHECK(slab.stats().spills == 0);
  slab.deallocate_sync(a, 32 * KiB);
  slab.deallocate_sync(b, 32 * KiB);
  slab.check_invariants();
}

namespace {

/// A Spill source whose frees wait at a gate (as a slow cudaFreeHost does), holding its memory
/// until they return; it records the most it ever held at once.
struct gated_spill {
  struct gate {
    std::mutex m;
    std::condition_variable cv;
    bool closed = false;
    std::size_t waiting = 0;
    std::size_t held = 0, peak = 0;
  };
  std::shared_ptr<gate> g = std::make_shared<gate>();
  vram::host_source host;
  std::chrono::microseconds free_time{0};  // how long a free holds the memory once past the gate

  void* allocate_sync(std::size_t bytes, std::size_t align = vram::default_alignment) {
    void* p = host.allocate_sync(bytes, align);
    std::lock_guard lock(g->m);
    g->held += bytes;
    g->peak = std::max(g->peak, g->held);
    return p;
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = vram::default_alignment) noexcept {
    std::unique_lock lock(g->m);
    ++g->waiting;
    g->cv.notify_all();
    g->cv.wait(lock, [&] { return !g->closed; });
    --g->waiting;
    lock.unlock();
    std::this_thread::sleep_for(free_time);  // still held: a slow free
    lock.lock();
    host.deallocate_sync(p, bytes, align);
    g->held -= bytes;
  }
  void* allocate(vram::stream_ref, std::size_t bytes, std::size_t align = vram::default_alignment) {
    return allocate_sync(bytes, align);
  }
  void deallocate(vram::stream_ref, void* p, std::size_t bytes, std::size_t align = vram::default_alignment) noexcept {
    deallocate_sync(p, bytes, align);
  }
  void close() {
    std::lock_guard lock(g->m);
    g->closed = true;
  }
  void open() {
    {
      std::lock_guard lock(g->m);
      g->closed = false;
    }
    g->cv.notify_all();
  }
  void wait_for_a_free() {
    std::unique_lock lock(g->m);
    g->cv.wait(lock, [&] { return g->waiting != 0; });
  }
  [[nodiscard]] std::size_t peak() const {
    std::lock_guard lock(g->m);
    return g->peak;
  }
  friend bool operator==(const gated_spill& a, const gated_spill& b) noexcept { return a.g == b.g; }
};

/// A Device that refuses alignments above 256 B (as cuda_device_source does) and hands out
/// bases 256 B past a 64 KiB boundary.
struct misaligned_device {
  static constexpr std::size_t page = 64 * KiB;
  std::shared_ptr<std::atomic<std::size_t>> live = std::make_shared<std::atomic<std::size_t>>(0);

  void* allocate_sync(std::size_t bytes, std::size_t align = vram::default_alignment) {
    if (align > vram::default_alignment) vram::detail::throw_invalid_argument("misaligned_device", "alignment above 256 B");
    auto* base = static_cast<char*>(::operator new(bytes + page, std::align_val_t{page}));
    live->fetch_add(1);
    return base + vram::default_alignment;
  }
  void deallocate_sync(void* p, std::size_t, std::size_t = vram::default_alignment) noexcept {
    ::operator delete(static_cast<char*>(p) - vram::default_alignment, std::align_val_t{page});
    live->fetch_sub(1);
  }
  void* allocate(vram::stream_ref, std::size_t bytes, std::size_t align = vram::default_alignment) {
    return allocate_sync(bytes, align);
  }
  void deallocate(vram::stream_ref, void* p, std::size_t bytes, std::size_t align = vram::default_alignment) noexcept {
    deallocate_sync(p, bytes, align);
  }
  friend bool operator==(const misaligned_device& a, const misaligned_device& b) noexcept { return a.live == b.live; }
};

}  // namespace

TEST_CASE("budget_slab: the spill budget holds while Spill is still freeing", "[budget_slab][threads]") {
  gated_spill spill;
  vram::budget_slab<vram::host_source, gated_spill> slab(vram::host_source{}, spill,
                                                         {.device_budget = 1 * MiB, .spill_budget = 8 * MiB});
  void* a = slab.allocate_sync(8 * MiB);  // beyond the device budget: the whole spill budget
  REQUIRE(slab.residency(a) == vram::residency::host);
  spill.close();
  std::thread freeing([&] { slab.deallocate_sync(a, 8 * MiB); });
  spill.wait_for_a_free();
  // a's memory is not back in Spill yet: a spill now would make Spill hold twice the budget.
  auto before = slab.stats();
  CHECK_THROWS_AS(slab.allocate_sync(8 * MiB), vram::out_of_memory);
  CHECK(slab.stats().live_bytes == before.live_bytes);  // nothing changed but the OOM count
  CHECK(slab.stats().ooms == before.ooms + 1);
  spill.open();
  freeing.join();
  void* b = slab.allocate_sync(8 * MiB);  // back in Spill: the budget is free again
  CHECK(slab.residency(b) == vram::residency::host);
  slab.deallocate_sync(b, 8 * MiB);
  CHECK(spill.peak() == 8 * MiB);
  slab.check_invariants();
}

TEST_CASE("budget_slab: racing spills and slow spill frees never make Spill hold more than the budget",
          "[budget_slab][threads]") {
  gated_spill spill;  // open, but each free holds its memory a while
  spill.free_time = std::chrono::microseconds(100);
  constexpr std::size_t budget = 4 * MiB, block = 2 * MiB;  // two live at once, four threads
  vram::budget_slab<vram::host_source, gated_spill> slab(vram::host_source{}, spill,
                                                         {.device_budget = 64 * KiB, .spill_budget = budget});
  std::atomic<std::size_t> served{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        try {
          void* p = slab.allocate_sync(block);
          served.fetch_add(1);
          std::this_thread::yield();
          slab.deallocate_sync(p, block);
        } catch (const vram::out_of_memory&) {
          refused.fetch_add(1);
        }
      }
    });
  for (auto& t : threads) t.join();
  CHECK(served.load() > 0);
  CHECK(spill.peak() <= budget);  // the source's own record of what it held at every instant
  CHECK(slab.stats().spilled_bytes == 0);
  slab.check_invariants();
}

TEST_CASE("budget_slab: a free with another size of the block's class keeps requested_bytes exact",
          "[budget_slab][threads]") {
  vram::test::misuse_capture capture;
  slab_t slab(make_device(), vram::host_source{}, {.device_budget = 1 * MiB});
  void* p = slab.allocate_sync(300);  // class 512, from the slab
  slab.deallocate_sync(p, 500);       // class 512 too: accepted, into this thread's cache
  CHECK(slab.stats().requested_bytes == 0);
  slab.check_invariants();
  void* q = slab.allocate_sync(400);  // the cached block again, for 400
  CHECK(q == p);
  CHECK(slab.stats().requested_bytes == 400);
  slab.deallocate_sync(q, 257);
  CHECK(slab.stats().requested_bytes == 0);
  slab.check_invariants();
  // A block served by another thread's cache with another size, that thread then exiting (its
  // cache flushed and folded), the block freed here.
  void* r = nullptr;
  std::thread([&] {
    void* x = slab.allocate_sync(300);
    slab.deallocate_sync(x, 500);
    r = slab.allocate_sync(480);  // from this thread's cache
  }).join();
  CHECK(slab.stats().requested_bytes == 480);
  slab.check_invariants();
  slab.deallocate_sync(r, 300);
  CHECK(slab.stats().requested_bytes == 0);
  CHECK(slab.stats().peak_requested_bytes >= 480);
  slab.check_invariants();
  CHECK(capture.count() == 0);
}

TEST_CASE("budget_slab: every page of the budget is usable; a Device that cannot align costs one page",
          "[budget_slab]") {
  for (std::size_t pages : {1u, 2u, 16u}) {
    vram::budget_slab<vram::host_source, vram::host_source> slab(vram::host_source{}, vram::host_source{},
                                                                 {.device_budget = pages * 64 * KiB});
    CHECK(slab.device_budget() == pages * 64 * KiB);
    void* p = slab.allocate_sync(256);
    CHECK(slab.residency(p) == vram::residency::device);
    slab.deallocate_sync(p, 256);
    slab.check_invariants();
  }
  misaligned_device device;
  {
    vram::budget_slab<misaligned_device, vram::host_source> slab(device, vram::host_source{},
                                                                 {.device_budget = 16 * 64 * KiB});
    CHECK(slab.device_budget() == 15 * 64 * KiB);
    void* p = slab.allocate_sync(256);
    CHECK(slab.residency(p) == vram::residency::device);
    slab.deallocate_sync(p, 256);
    slab.check_invariants();
  }
  CHECK(device.live->load() == 0);
  CHECK_THROWS_AS((vram::budget_slab<misaligned_device, vram::host_source>(device, vram::host_source{},
                                                                            {.device_budget = 64 * KiB})),
                  vram::invalid_argument);
  CHECK(device.live->load() == 0);  // the refused reservation went back
}

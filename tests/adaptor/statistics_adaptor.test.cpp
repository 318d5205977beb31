#include <catch2/catch.hpp>

#include <atomic>
#include <barrier>
#include <map>
#include <mutex>
#include <semaphore>
#include <random>
#include <thread>
#include <vector>

#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>

#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"

using upstream_t = vram::test::recording_resource<vram::host_source>;

TEST_CASE("statistics_adaptor: counters match a reference model under random sequences", "[adaptor][statistics]") {
  auto& reg = *vram::tenant_registry::global();
  vram::tenant tenants[] = {vram::tenant::none(), reg.create("stats.a"), reg.create("stats.b")};
  upstream_t up;
  {
    vram::statistics_adaptor<upstream_t> r(up);
    struct live_block {
      void* p;
      std::size_t bytes;
      vram::tenant t;
    };
    std::vector<live_block> live;
    std::map<std::uint32_t, std::int64_t> ref_live;
    std::map<std::uint32_t, std::size_t> ref_allocs;
    std::int64_t total = 0, peak = 0;
    std::size_t allocs = 0, frees = 0;
    std::mt19937 rng(42);
    for (int i = 0; i < 3000; ++i) {
      bool alloc = live.empty() || rng() % 3 != 0;
      if (alloc) {
        std::size_t bytes = 1 + rng() % 100000;
        vram::tenant t = tenants[rng() % 3];
        void* p;
        if (rng() % 2) {
          vram::tenant_scope scope(t);
          p = r.allocate_sync(bytes);
        } else {
          p = r.allocate(vram::stream_ref{}, bytes, 256, t);
        }
        live.push_back({p, bytes, t});
        total += static_cast<std::int64_t>(bytes);
        peak = std::max(peak, total);
        ref_live[t.id] += static_cast<std::int64_t>(bytes);
        ++ref_allocs[t.id];
        ++allocs;
      } else {
        std::size_t k = rng() % live.size();
        auto b = live[k];
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        vram::tenant_scope scope(b.t);
        r.deallocate_sync(b.p, b.bytes);
        total -= static_cast<std::int64_t>(b.bytes);
        ref_live[b.t.id] -= static_cast<std::int64_t>(b.bytes);
        ++frees;
      }
      if (i % 97 == 0) {
        auto s = r.stats();
        REQUIRE(s.live_bytes == static_cast<std::size_t>(total));
        REQUIRE(s.peak_live_bytes == static_cast<std::size_t>(peak));
        REQUIRE(s.total_allocations == allocs);
        REQUIRE(s.total_deallocations == frees);
        REQUIRE(s.live_allocations == live.size());
        for (auto t : tenants) {
          REQUIRE(r.stats(t).live_bytes == ref_live[t.id]);
          REQUIRE(r.stats(t).allocations == ref_allocs[t.id]);
        }
        r.check_invariants();
      }
    }
    CHECK(up.counters().live_bytes == static_cast<std::size_t>(total));
    for (auto& b : live) {
      vram::tenant_scope scope(b.t);
      r.deallocate_sync(b.p, b.bytes);
    }
    CHECK(r.stats().live_bytes == 0);
    r.reset_peak();
    CHECK(r.stats().peak_live_bytes == 0);
  }
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("statistics_adaptor: OOM is counted and changes nothing else", "[adaptor][statistics]") {
  upstream_t up;
  vram::statistics_adaptor<upstream_t> r(up);
  void* p = r.allocate_sync(1000);
  CHECK_THROWS_AS(r.allocate_sync(std::size_t{1} << 52), vram::out_of_memory);
  auto s = r.stats();
  CHECK(s.ooms == 1);
  CHECK(s.live_bytes == 1000);
  CHECK(s.total_allocations == 1);
  r.deallocate_sync(p, 1000);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("statistics_adaptor: a foreign pointer is not counted (upstream has owns)", "[adaptor][statistics]") {
  vram::test::misuse_capture capture;
  vram::statistics_adaptor<vram::host_source> r;
  alignas(256) static char foreign[512];
  r.deallocate_sync(foreign, 512);
  CHECK(capture.count() == 1);
  CHECK(r.stats().total_deallocations == 0);
  CHECK(r.stats().live_bytes == 0);
}

TEST_CASE("statistics_adaptor: exact totals from several threads", "[adaptor][statistics]") {
  upstream_t up;
  vram::statistics_adaptor<upstream_t> r(up);
  auto& reg = *vram::tenant_registry::global();
  vram::tenant ts[4] = {reg.create("stats.t0"), reg.create("stats.t1"), reg.create("stats.t2"), reg.create("stats.t3")};
  std::vector<std::thread> threads;
  std::vector<void*> kept[4];
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      vram::tenant_scope scope(ts[t]);
      auto& mine = kept[t];
      for (int i = 0; i < 500; ++i) mine.push_back(r.allocate_sync(1024));
      for (int i = 0; i < 250; ++i) r.deallocate_sync(mine[static_cast<std::size_t>(i)], 1024);
      mine.erase(mine.begin(), mine.begin() + 250);
    });
  for (auto& t : threads) t.join();
  CHECK(r.stats().live_bytes == 4 * 250 * 1024);
  CHECK(r.stats().total_allocations == 2000);
  for (auto t : ts) CHECK(r.stats(t).live_bytes == 250 * 1024);
  r.check_invariants();
  CHECK(up.counters().live_allocations() == 1000);
  for (int t = 0; t < 4; ++t)
    for (void* p : kept[t]) r.deallocate(vram::stream_ref{}, p, 1024, 256, ts[t]);
  CHECK(up.counters().live_allocations() == 0);
  CHECK(r.stats().live_bytes == 0);
}

// The peak across threads (statistics_adaptor.hpp): never above the true peak, exact with
// one allocating thread, below the true peak by less than 64 KiB per other allocating thread.
TEST_CASE("statistics_adaptor: the peak with one allocating thread is exact while a sampler reads", "[adaptor][statistics]") {
  vram::statistics_adaptor<vram::host_source> r;
  std::atomic<bool> done{false};
  std::atomic<std::size_t> samples{0}, most_seen{0};
  std::thread sampler([&] {  // a read racing one writer never counts a byte twice
    while (!done.load()) {
      most_seen.store(std::max(most_seen.load(), r.stats().live_bytes));
      samples.fetch_add(1);
    }
  });
  std::mt19937 rng(7);
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t total = 0, peak = 0;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 5 < 3) {
      std::size_t bytes = 256 + rng() % 40000;  // shares published now and then, mostly not
      live.emplace_back(r.allocate_sync(bytes), bytes);
      total += bytes;
      peak = std::max(peak, total);
    } else {
      std::size_t k = rng() % live.size();
      r.deallocate_sync(live[k].first, live[k].second);
      total -= live[k].second;
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 1000 == 0) {
      CHECK(r.stats().live_bytes == total);
      CHECK(r.stats().peak_live_bytes == peak);
    }
  }
  while (samples.load() < 100) std::this_thread::yield();
  done = true;
  sampler.join();
  CHECK(most_seen.load() <= peak);
  CHECK(r.stats().peak_live_bytes == peak);
  for (auto [p, n] : live) r.deallocate_sync(p, n);
  CHECK(r.stats().live_bytes == 0);
  CHECK(r.stats().peak_live_bytes == peak);
  r.check_invariants();
}

TEST_CASE("statistics_adaptor: the peak of several threads is within 64 KiB per other thread, never above", "[adaptor][statistics]") {
  constexpr int threads = 4;
  constexpr std::size_t block = 4096, blocks = 256;  // 1 MiB per thread: shares published 16 times
  vram::statistics_adaptor<vram::host_source> r;
  for (int round = 0; round < 20; ++round) {
    std::barrier all_held(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&] {
        std::vector<void*> mine;
        for (std::size_t i = 0; i < blocks; ++i) mine.push_back(r.allocate_sync(block));
        all_held.arrive_and_wait();  // the true peak: every thread holds its blocks
        for (void* p : mine) r.deallocate_sync(p, block);
      });
    for (auto& t : ts) t.join();
    auto s = r.stats();
    constexpr std::size_t true_peak = threads * blocks * block;
    CHECK(s.live_bytes == 0);
    CHECK(s.peak_live_bytes <= true_peak);
    CHECK(s.peak_live_bytes + (threads - 1) * std::size_t{64 << 10} > true_peak);
    r.check_invariants();
    r.reset_peak();
    CHECK(r.stats().peak_live_bytes == 0);
  }
}

TEST_CASE("statistics_adaptor: frees on other threads never lift the peak above the true one", "[adaptor][statistics]") {
  // At most `tokens` blocks are live at any instant (a token is taken before each allocation
  // and returned after its free), so the true peak is at most tokens x block. Blocks are freed
  // by another thread than the one that allocated them, so shares go below zero and publish.
  constexpr std::ptrdiff_t tokens = 48;
  constexpr std::size_t block = 3000;
  vram::statistics_adaptor<vram::host_source> r;
  std::counting_semaphore<tokens> room(tokens);
  std::mutex m;
  std::vector<void*> handed;
  std::atomic<int> producers_left{3};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t)
    ts.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < 20000; ++i) {
        room.acquire();
        void* p = r.allocate_sync(block);
        std::lock_guard lock(m);
        handed.push_back(p);
      }
      producers_left.fetch_sub(1);
    });
  for (int t = 0; t < 2; ++t)
    ts.emplace_back([&] {
      for (;;) {
        void* p = nullptr;
        {
          std::lock_guard lock(m);
          if (!handed.empty()) {
            p = handed.back();
            handed.pop_back();
          }
        }
        if (p == nullptr) {
          if (producers_left.load() == 0) {
            std::lock_guard lock(m);
            if (handed.empty()) return;
          }
          std::this_thread::yield();
          continue;
        }
        r.deallocate_sync(p, block);
        room.release();
      }
    });
  for (auto& t : ts) t.join();
  auto s = r.stats();
  CHECK(s.live_bytes == 0);
  CHECK(s.total_allocations == 60000);
  CHECK(s.total_deallocations == 60000);
  CHECK(s.peak_live_bytes <= tokens * block);
  CHECK(s.peak_live_bytes >= block);
  r.check_invariants();
}

#include <vram/adaptor/statistics_observer.hpp>
#include <vram/alloc/stream_pool.hpp>

TEST_CASE("statistics_observer: counts inside an allocator, per tenant, with reserved bytes",
          "[adaptor][statistics]") {
  upstream_t up;
  vram::statistics_observer obs;
  auto t = vram::tenant_registry::global()->create("stats.observer");
  {
    vram::stream_pool<upstream_t, vram::statistics_observer> pool(
        up, vram::stream_pool_options{.growth_step = std::size_t{4} << 20}, obs);
    std::vector<std::pair<void*, std::size_t>> live;
    {
      vram::tenant_scope scope(t);
      for (std::size_t i = 1; i <= 50; ++i) live.emplace_back(pool.allocate_sync(i * 1000), i * 1000);
    }
    auto s = obs.stats();
    CHECK(s.total_allocations == 50);
    CHECK(s.live_allocations == 50);
    CHECK(s.live_bytes >= 1275000);  // the pool may report rounded sizes
    CHECK(obs.stats(t).allocations == 50);
    CHECK(s.reserved_bytes == up.counters().live_bytes);
    CHECK(s.upstream_allocations == up.counters().allocations);
    {
      vram::tenant_scope scope(t);
      for (auto [p, n] : live) pool.deallocate_sync(p, n);
    }
    CHECK(obs.stats().live_bytes == 0);
    CHECK(obs.stats(t).live_bytes == 0);
    CHECK(obs.stats().peak_live_bytes >= 1275000);
  }
  CHECK(obs.stats().reserved_bytes == 0);  // the pool gave everything back, and said so
  CHECK(up.counters().live_allocations() == 0);
}

namespace {
/// A pool held by reference, forwarding owns() as the pool answers it (a pool cannot move into
/// the adaptor): what statistics_adaptor trusts before it counts a free.
struct pool_by_reference {
  vram::stream_pool<vram::host_source>* pool;
  void* allocate(vram::stream_ref s, std::size_t b, std::size_t a = vram::default_alignment) { return pool->allocate(s, b, a); }
  void deallocate(vram::stream_ref s, void* p, std::size_t b, std::size_t a = vram::default_alignment) noexcept {
    pool->deallocate(s, p, b, a);
  }
  void* allocate_sync(std::size_t b, std::size_t a = vram::default_alignment) { return pool->allocate_sync(b, a); }
  void deallocate_sync(void* p, std::size_t b, std::size_t a = vram::default_alignment) noexcept {
    pool->deallocate_sync(p, b, a);
  }
  [[nodiscard]] bool owns(const void* p) const { return pool->owns(p); }
  friend bool operator==(const pool_by_reference& x, const pool_by_reference& y) noexcept { return x.pool == y.pool; }
};
}  // namespace

TEST_CASE("statistics_adaptor: over a stream_pool, the frees on every stream are counted", "[adaptor][statistics]") {
  vram::test::misuse_capture capture;
  vram::stream_pool<vram::host_source> pool;
  vram::statistics_adaptor<pool_by_reference> r(pool_by_reference{&pool});
  vram::host_stream a, b;
  for (int i = 0; i < 10; ++i) {
    void* p = r.allocate(a, 1000);
    void* q = r.allocate(b, 1000);
    r.deallocate(a, p, 1000);  // a's lane is not the newest
    r.deallocate(b, q, 1000);
  }
  CHECK(r.stats().live_allocations == 0);
  CHECK(r.stats().live_bytes == 0);
  CHECK(r.stats().total_deallocations == 20);
  CHECK(capture.count() == 0);
  r.check_invariants();
  pool.check_invariants();
  a.synchronize();
  b.synchronize();
}

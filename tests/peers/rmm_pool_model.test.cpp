// The RMM pool model that vram-replay measures beside vram's allocators: RMM's placement
// (best fit over address-ordered lists, merging but never across upstream allocations), its
// stream order of search, its doubling growth, and typed errors that change nothing.

#include <catch2/catch.hpp>

#include <random>
#include <thread>
#include <vector>

#include <vram/core/host_stream.hpp>
#include <vram/source/simulated_device_source.hpp>
#include <peers/rmm_pool_model.hpp>

namespace {

using model = vram::peers::rmm_pool_model<vram::simulated_device_source>;
constexpr std::size_t page = 4096;

vram::simulated_device_source device(std::size_t capacity) {
  return vram::simulated_device_source({.capacity = capacity, .granularity = page, .contiguous = false});
}

char* at(void* p) { return static_cast<char*>(p); }

/// Counts misuse reports and restores the previous handler on destruction.
struct misuse_counter {
  static inline int count = 0;
  static inline vram::misuse last{};
  vram::error_handler previous;
  misuse_counter() : previous(vram::set_error_handler([](const vram::misuse_report& r) noexcept {
                       ++count;
                       last = r.kind;
                     })) {
    count = 0;
  }
  ~misuse_counter() { vram::set_error_handler(previous); }
};

}  // namespace

TEST_CASE("best fit, split and merge within one upstream allocation") {
  model pool(device(std::size_t{1} << 20), 64 * 1024);
  char* a = at(pool.allocate({}, 1000));  // rounded to 1024
  char* b = at(pool.allocate({}, 2048));
  char* c = at(pool.allocate({}, 512));
  CHECK(b == a + 1024);
  CHECK(c == b + 2048);
  char* d = at(pool.allocate({}, 1024));
  char* e = at(pool.allocate({}, 256));
  CHECK(e == d + 1024);
  CHECK(pool.stats().requested_bytes == 1000 + 2048 + 512 + 1024 + 256);
  CHECK(pool.stats().live_bytes == 1024 + 2048 + 512 + 1024 + 256);
  pool.deallocate({}, b, 2048);
  pool.deallocate({}, a, 1024);  // rounds as 1000 did, so accepted; merges with b: 3 KiB at a
  pool.deallocate({}, d, 1024);  // a 1-KiB hole after c
  pool.check_invariants();
  CHECK(pool.stats().free_blocks == 3);
  // Best fit: the 1-KiB hole at d, not the first (3 KiB at a) nor the remainder after e.
  CHECK(at(pool.allocate({}, 1024)) == d);
  // Then the 3-KiB hole, not the large remainder.
  CHECK(at(pool.allocate({}, 2048)) == a);
  CHECK(at(pool.allocate({}, 1024)) == a + 2048);
  pool.deallocate({}, a, 2048);
  pool.deallocate({}, a + 2048, 1024);
  pool.deallocate({}, c, 512);
  pool.deallocate({}, d, 1024);
  pool.deallocate({}, e, 256);
  pool.check_invariants();
  auto st = pool.stats();
  CHECK(st.free_blocks == 1);
  CHECK(st.largest_free_block == 64 * 1024);
  CHECK(st.live_bytes == 0);
  CHECK(st.requested_bytes == 0);
  CHECK(st.peak_requested_bytes == 512 + 256 + 1024 + 2048 + 1024);  // c, e and the three reuses
  CHECK(st.upstream_allocations == 1);
}

TEST_CASE("growth doubles the pool, and upstream allocations never merge") {
  model pool(device(std::size_t{1} << 20), page);
  void* x = pool.allocate({}, page);
  void* y = pool.allocate({}, page);  // grows by max(4 KiB, pool 4 KiB)
  CHECK(pool.stats().reserved_bytes == 2 * page);
  void* z = pool.allocate({}, 256);  // grows by max(256, pool 8 KiB)
  CHECK(pool.stats().reserved_bytes == 4 * page);
  CHECK(pool.stats().upstream_allocations == 3);
  pool.deallocate({}, x, page);
  pool.deallocate({}, y, page);
  pool.deallocate({}, z, 256);
  pool.check_invariants();
  // The device places the three next to each other, yet they stay three blocks.
  auto st = pool.stats();
  CHECK(st.free_blocks == 3);
  CHECK(st.largest_free_block == 2 * page);
  CHECK(st.free_bytes == 4 * page);
}

TEST_CASE("another stream's free block is taken before the pool grows; lists merge to make a fit") {
  vram::host_stream s1, s2, s3;
  model pool(device(std::size_t{1} << 20), page);
  void* x = pool.allocate({}, page / 2);
  void* y = pool.allocate({}, page / 2);
  pool.deallocate(s1, x, page / 2);
  CHECK(pool.allocate(s2, page / 2) == x);  // from s1's list, no growth
  pool.deallocate(s2, x, page / 2);
  pool.deallocate(s3, y, page / 2);
  // Neither list alone holds a page; merged (x on s2 + y on s3) they do.
  void* whole = pool.allocate(s1, page);
  CHECK(whole == x);
  CHECK(pool.stats().upstream_allocations == 1);
  pool.check_invariants();
  pool.deallocate(s1, whole, page);
  pool.check_invariants();
}

TEST_CASE("bad input is a typed error or a report, and changes nothing") {
  model pool(device(16 * 1024));
  void* p = pool.allocate({}, 12 * 1024);
  auto before = pool.stats();
  // 8 KiB: the attempts (12 KiB, then 8 KiB) are both refused by the 4 KiB left.
  try {
    (void)pool.allocate({}, 8 * 1024);
    FAIL("no out_of_memory");
  } catch (const vram::out_of_memory& e) {
    CHECK(e.bytes() == 8 * 1024);
    CHECK(e.stats().reserved_bytes == before.reserved_bytes);  // the snapshot is the pool's
    CHECK(e.stats().live_bytes == before.live_bytes);
  }
  CHECK_THROWS_AS(pool.allocate({}, 256, 512), vram::invalid_argument);
  CHECK_THROWS_AS(pool.allocate({}, vram::max_request_bytes + 1), vram::invalid_argument);
  CHECK(pool.allocate({}, 0) == nullptr);
  {
    misuse_counter counter;
    char foreign[256];
    pool.deallocate({}, foreign, 256);
    CHECK(misuse_counter::last == vram::misuse::foreign_pointer);
    pool.deallocate({}, p, 4096);
    CHECK(misuse_counter::last == vram::misuse::wrong_size);
    CHECK(misuse_counter::count == 2);
  }
  auto after = pool.stats();
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(after.free_blocks == before.free_blocks);
  pool.check_invariants();
  // After the refusal the last 4 KiB are still there to take (attempts halve down to it).
  void* q = pool.allocate({}, 4096);
  CHECK(q != nullptr);
  pool.deallocate({}, q, 4096);
  pool.deallocate({}, p, 12 * 1024);
  {
    misuse_counter counter;
    pool.deallocate({}, p, 12 * 1024);  // a second free
    CHECK(misuse_counter::count == 1);
  }
  pool.check_invariants();
  CHECK(pool.stats().live_bytes == 0);
}

TEST_CASE("random operations on four streams keep the invariants") {
  for (std::uint64_t seed : {1, 2, 3}) {
    std::mt19937_64 rng(seed);
    vram::host_stream streams[4];
    model pool(device(std::size_t{1} << 30));
    struct live {
      void* p;
      std::size_t bytes;
    };
    std::vector<live> held;
    std::uniform_int_distribution<std::size_t> size(1, 200000), pick(0, 3);
    for (int i = 0; i < 2000; ++i) {
      vram::stream_ref s = streams[pick(rng)];
      if (held.empty() || rng() % 5 < 3) {
        std::size_t bytes = size(rng);
        held.push_back({pool.allocate(s, bytes), bytes});
      } else {
        std::size_t k = rng() % held.size();
        pool.deallocate(s, held[k].p, held[k].bytes);
        held[k] = held.back();
        held.pop_back();
      }
      pool.check_invariants();
    }
    for (auto& h : held) pool.deallocate({}, h.p, h.bytes);
    pool.check_invariants();
    CHECK(pool.stats().live_bytes == 0);
  }
}

TEST_CASE("threads on their own streams") {
  model pool(device(std::size_t{1} << 30));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&pool, t] {
      vram::host_stream s;
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      std::vector<std::pair<void*, std::size_t>> held;
      for (int i = 0; i < 500; ++i) {
        std::size_t bytes = 256 + rng() % 65536;
        held.emplace_back(pool.allocate(s, bytes), bytes);
        if (held.size() > 8) {
          pool.deallocate(s, held.front().first, held.front().second);
          held.erase(held.begin());
        }
      }
      for (auto& [p, bytes] : held) pool.deallocate(s, p, bytes);
    });
  for (auto& t : threads) t.join();
  pool.check_invariants();
  CHECK(pool.stats().live_bytes == 0);
}

// The PyTorch caching allocator model that vram-replay measures beside vram's allocators: each
// rule of c10/cuda/CUDACachingAllocator.cpp from first principles (rounding, the three segment
// sizes, the two pools' split thresholds, merging within a segment, streams apart, best fit,
// the OOM path's release of cached segments), random operations against an independent check
// of the live ranges, and PyTorch's own snapshots replayed against what PyTorch reserved.

#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include <vram/core/host_stream.hpp>
#include <vram/source/simulated_device_source.hpp>
#include <vram/trace/replay.hpp>
#include <vram/trace/workloads.hpp>
#include <vram-replay/lineup.hpp>
#include <peers/torch_caching_model.hpp>

#include "support/misuse_capture.hpp"
#include "support/real_traces.hpp"

namespace {

using model = vram::peers::torch_caching_model<vram::simulated_device_source>;
constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

/// cudaMalloc-like: separate allocations on 2 MiB pages.
vram::simulated_device_source device(std::size_t capacity = std::size_t{1} << 36) {
  return vram::simulated_device_source({.capacity = capacity, .granularity = 2 * MiB, .contiguous = false});
}

char* at(void* p) { return static_cast<char*>(p); }

}  // namespace

TEST_CASE("requests round up to 512 B; segments are 2 MiB, 20 MiB or the request in 2 MiB pages") {
  STATIC_REQUIRE(model::round_size(1) == 512);
  STATIC_REQUIRE(model::round_size(512) == 512);
  STATIC_REQUIRE(model::round_size(513) == 1024);
  STATIC_REQUIRE(model::allocation_size(512) == 2 * MiB);
  STATIC_REQUIRE(model::allocation_size(1 * MiB) == 2 * MiB);              // ≤ kSmallSize: small pool
  STATIC_REQUIRE(model::allocation_size(1 * MiB + 512) == 20 * MiB);       // above it: large pool
  STATIC_REQUIRE(model::allocation_size(10 * MiB - 512) == 20 * MiB);      // below kMinLargeAlloc
  STATIC_REQUIRE(model::allocation_size(10 * MiB) == 10 * MiB);            // from it on: its own size
  STATIC_REQUIRE(model::allocation_size(10 * MiB + 512) == 12 * MiB);      // in 2 MiB pages

  model pool(device());
  void* a = pool.allocate({}, 1000);
  CHECK(pool.stats().reserved_bytes == 2 * MiB);
  CHECK(pool.stats().live_bytes == 1024);  // the rounded block
  CHECK(pool.stats().requested_bytes == 1000);
  void* b = pool.allocate({}, 1 * MiB + 1);
  CHECK(pool.stats().reserved_bytes == 22 * MiB);
  void* c = pool.allocate({}, 20 * MiB + 1);  // b's free 19 MiB too small: a 22 MiB segment
  CHECK(pool.stats().reserved_bytes == 44 * MiB);
  CHECK(pool.stats().upstream_allocations == 3);
  pool.check_invariants();
  // A small request never uses the large pool's free 18.99 MiB, nor a large one the small's.
  void* d = pool.allocate({}, 4 * KiB);
  CHECK(at(d) == at(a) + 1024);
  void* e = pool.allocate({}, 2 * MiB);
  CHECK(at(e) == at(b) + 1 * MiB + 512);
  CHECK(pool.stats().upstream_allocations == 3);
  for (auto [p, n] : {std::pair{a, 1000ul}, {b, 1 * MiB + 1}, {c, 20 * MiB + 1}, {d, 4 * KiB}, {e, 2 * MiB}})
    pool.deallocate({}, p, n);
  pool.check_invariants();
  CHECK(pool.stats().free_blocks == 3);  // one whole block per segment
  CHECK(pool.stats().reserved_bytes == 44 * MiB);  // cached, not returned
}

TEST_CASE("the small pool splits when 512 B remain; the large pool only when more than 1 MiB remains") {
  model pool(device());
  SECTION("small pool: the last 512 B split off") {
    void* a = pool.allocate({}, 1 * MiB);
    void* b = pool.allocate({}, 1 * MiB - 512);  // 512 B remain: split
    CHECK(at(b) == at(a) + 1 * MiB);
    CHECK(pool.stats().live_bytes == 2 * MiB - 512);
    void* c = pool.allocate({}, 100);  // the 512 B remainder
    CHECK(at(c) == at(b) + 1 * MiB - 512);
    CHECK(pool.stats().upstream_allocations == 1);
    CHECK(pool.stats().free_blocks == 0);
    pool.check_invariants();
  }
  SECTION("large pool: 1 MiB left is not split off, 1 MiB + 512 B is") {
    void* a = pool.allocate({}, 19 * MiB);  // segment 20 MiB, 1 MiB left: the block is 20 MiB
    CHECK(pool.stats().live_bytes == 20 * MiB);
    CHECK(pool.stats().free_blocks == 0);
    void* b = pool.allocate({}, 19 * MiB - 512);  // 1 MiB + 512 B left: split
    CHECK(pool.stats().live_bytes == 20 * MiB + 19 * MiB - 512);
    CHECK(pool.stats().free_blocks == 1);
    CHECK(pool.stats().largest_free_block == 1 * MiB + 512);
    void* c = pool.allocate({}, 1 * MiB + 512);  // fits the remainder exactly
    CHECK(at(c) == at(b) + 19 * MiB - 512);
    CHECK(pool.stats().upstream_allocations == 2);
    pool.check_invariants();
    // 1–10 MiB requests carve a 20 MiB segment.
    void* d = pool.allocate({}, 2 * MiB);
    void* e = pool.allocate({}, 2 * MiB);
    CHECK(at(e) == at(d) + 2 * MiB);
    CHECK(pool.stats().reserved_bytes == 60 * MiB);
    (void)a;
  }
}

TEST_CASE("a freed block merges with its free neighbours in its segment, never across segments") {
  model pool(device());
  void* a = pool.allocate({}, 2 * MiB);
  void* b = pool.allocate({}, 2 * MiB);
  void* c = pool.allocate({}, 2 * MiB);
  pool.deallocate({}, a, 2 * MiB);
  pool.deallocate({}, c, 2 * MiB);  // merges with the 14 MiB after it
  CHECK(pool.stats().free_blocks == 2);
  CHECK(pool.stats().largest_free_block == 16 * MiB);
  pool.check_invariants();
  pool.deallocate({}, b, 2 * MiB);  // joins both
  CHECK(pool.stats().free_blocks == 1);
  CHECK(pool.stats().largest_free_block == 20 * MiB);
  // Two segments side by side on the device stay two blocks.
  void* x = pool.allocate({}, 12 * MiB);
  void* y = pool.allocate({}, 12 * MiB);  // x split the 20 MiB block: 8 MiB left, a new segment
  void* z = pool.allocate({}, 12 * MiB);
  pool.deallocate({}, x, 12 * MiB);
  pool.deallocate({}, y, 12 * MiB);
  pool.deallocate({}, z, 12 * MiB);
  pool.check_invariants();
  auto st = pool.stats();
  CHECK(st.upstream_allocations == 3);  // 20 MiB, then 12 MiB twice
  CHECK(st.free_blocks == 3);
  CHECK(st.largest_free_block == 20 * MiB);
  pool.release_cached_segments();  // empty_cache: every whole free segment goes back
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.stats().upstream_deallocations == 3);
  pool.check_invariants();
}

TEST_CASE("a block is reused only on the stream it was allocated on, whichever stream frees it") {
  vram::host_stream s1, s2;
  model pool(device());
  void* x = pool.allocate(s1, 4 * KiB);
  pool.deallocate(s2, x, 4 * KiB);  // back to s1's blocks
  void* y = pool.allocate(s2, 4 * KiB);
  CHECK(y != x);
  CHECK(pool.stats().reserved_bytes == 4 * MiB);  // s2 got its own small segment
  void* z = pool.allocate(s1, 4 * KiB);
  CHECK(z == x);
  pool.deallocate(s2, y, 4 * KiB);
  pool.deallocate(s1, z, 4 * KiB);
  pool.check_invariants();
  CHECK(pool.stats().free_blocks == 2);
}

TEST_CASE("best fit: the smallest free block of the stream that fits, the lowest address of equals") {
  model pool(device());
  void* a = pool.allocate({}, 4 * MiB);
  void* g1 = pool.allocate({}, 2 * MiB);
  void* b = pool.allocate({}, 3 * MiB);
  void* g2 = pool.allocate({}, 2 * MiB);
  void* c = pool.allocate({}, 3 * MiB);
  void* g3 = pool.allocate({}, 2 * MiB);  // 4 MiB of the segment left at the end
  pool.deallocate({}, a, 4 * MiB);
  pool.deallocate({}, c, 3 * MiB);
  pool.deallocate({}, b, 3 * MiB);
  pool.check_invariants();
  CHECK(pool.stats().free_blocks == 4);  // 4 MiB at a, 3 at b, 3 at c, 4 at the end
  CHECK(pool.allocate({}, 3 * MiB) == b);  // of the two 3 MiB holes, the lower
  CHECK(pool.allocate({}, 3 * MiB) == c);
  CHECK(pool.allocate({}, 2 * MiB + 512 * KiB) == a);  // the lower 4 MiB hole, split (1.5 MiB left)
  CHECK(pool.stats().upstream_allocations == 1);
  pool.check_invariants();
  (void)g1, (void)g2, (void)g3;
}

TEST_CASE("a refused segment frees the cached whole segments and retries; split ones stay") {
  model pool(device(40 * MiB));
  void* x = pool.allocate({}, 12 * MiB);
  pool.deallocate({}, x, 12 * MiB);  // a cached, whole 12 MiB segment
  void* big = pool.allocate({}, 30 * MiB);  // 28 MiB left on the device: x's segment is released
  CHECK(big != nullptr);
  auto st = pool.stats();
  CHECK(st.reserved_bytes == 30 * MiB);
  CHECK(st.peak_reserved_bytes == 30 * MiB);  // 12, then 0, then 30
  CHECK(st.upstream_deallocations == 1);
  void* s1 = pool.allocate({}, 1 * KiB);
  void* s2 = pool.allocate({}, 1 * KiB);
  pool.deallocate({}, s1, 1 * KiB);  // its segment stays split: s2 is live
  pool.check_invariants();
  auto before = pool.stats();
  try {
    (void)pool.allocate({}, 10 * MiB);  // 8 MiB left, nothing whole to release
    FAIL("no out_of_memory");
  } catch (const vram::out_of_memory& e) {
    CHECK(e.bytes() == 10 * MiB);
  }
  auto after = pool.stats();
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(after.ooms == 1);
  CHECK(after.upstream_deallocations == 1);
  pool.check_invariants();
  pool.deallocate({}, s2, 1 * KiB);
  pool.deallocate({}, big, 30 * MiB);
  pool.check_invariants();
}

TEST_CASE("max_split_size: no oversize block for a smaller request, none wasting 20 MiB, oversize released first") {
  CHECK_THROWS_AS(model(device(), 20 * MiB), vram::invalid_argument);
  {
    model pool(device(), 32 * MiB);
    void* big = pool.allocate({}, 60 * MiB);
    pool.deallocate({}, big, 60 * MiB);
    void* small = pool.allocate({}, 4 * MiB);  // must not take the 60 MiB block: a 20 MiB segment
    CHECK(small != big);
    CHECK(pool.stats().reserved_bytes == 80 * MiB);
    void* near = pool.allocate({}, 45 * MiB);  // takes it (15 MiB wasted < 20 MiB), unsplit (≥ 32 MiB)
    CHECK(near == big);
    CHECK(pool.stats().live_bytes == 4 * MiB + 60 * MiB);
    pool.deallocate({}, near, 45 * MiB);
    void* far = pool.allocate({}, 33 * MiB);  // 60 ≥ 33 + 20: not taken, a 34 MiB segment
    CHECK(far != big);
    CHECK(pool.stats().reserved_bytes == 114 * MiB);
    pool.deallocate({}, far, 33 * MiB);
    pool.deallocate({}, small, 4 * MiB);
    pool.check_invariants();
  }
  {
    model pool(device(80 * MiB), 32 * MiB);
    void* big = pool.allocate({}, 60 * MiB);
    pool.deallocate({}, big, 60 * MiB);
    void* p = pool.allocate({}, 25 * MiB);  // 20 MiB left on the device: the oversize 60 MiB goes
    auto st = pool.stats();
    CHECK(st.reserved_bytes == 26 * MiB);
    CHECK(st.upstream_deallocations == 1);
    pool.deallocate({}, p, 25 * MiB);
    pool.check_invariants();
  }
}

TEST_CASE("bad input is a typed error or a report, and changes nothing") {
  model pool(device());
  void* p = pool.allocate({}, 3000);
  auto before = pool.stats();
  CHECK_THROWS_AS(pool.allocate({}, 256, 1024), vram::invalid_argument);
  CHECK_THROWS_AS(pool.allocate({}, vram::max_request_bytes + 1), vram::invalid_argument);
  CHECK(pool.allocate({}, 0) == nullptr);
  {
    vram::test::misuse_capture capture;
    char foreign[256];
    pool.deallocate({}, foreign, 256);
    CHECK(capture.last().kind == vram::misuse::foreign_pointer);
    pool.deallocate({}, p, 4096);
    CHECK(capture.last().kind == vram::misuse::wrong_size);
    CHECK(capture.last().expected_bytes == 3072);
    pool.deallocate({}, p, 2900);  // rounds as 3000 does: accepted
    pool.deallocate({}, p, 3000);
    CHECK(capture.last().kind == vram::misuse::double_free);
    CHECK(capture.count() == 3);
  }
  auto after = pool.stats();
  CHECK(after.live_bytes == 0);
  CHECK(after.reserved_bytes == before.reserved_bytes);
  pool.check_invariants();
}

TEST_CASE("random operations on four streams: live ranges disjoint, invariants kept, reserved ≥ live") {
  for (std::uint64_t seed : {1, 2, 3}) {
    for (std::size_t capacity : {std::size_t{1} << 34, std::size_t{256} * MiB}) {
      INFO("seed " << seed << ", capacity " << capacity);
      std::mt19937_64 rng(seed);
      vram::host_stream streams[4];
      model pool(device(capacity));
      struct live {
        void* p;
        std::size_t bytes;
        vram::stream_ref s;
      };
      std::vector<live> held;
      std::map<char*, char*> ranges;  // live [begin, end), checked independently of the model
      std::size_t bad = 0, ooms = 0;
      auto size = [&] {
        switch (rng() % 3) {
          case 0: return 1 + rng() % MiB;                  // small pool
          case 1: return MiB + 1 + rng() % (9 * MiB);      // 20 MiB segments
          default: return 10 * MiB + rng() % (40 * MiB);   // their own segments
        }
      };
      for (int i = 0; i < 1500; ++i) {
        vram::stream_ref s = streams[rng() % 4];
        if (held.empty() || rng() % 5 < 3) {
          std::size_t bytes = size();
          void* p = nullptr;
          try {
            p = pool.allocate(s, bytes);
          } catch (const vram::out_of_memory&) {
            ++ooms;
            continue;
          }
          char* b = at(p);
          char* e = b + model::round_size(bytes);
          auto next = ranges.lower_bound(b);
          bad += next != ranges.end() && next->first < e;
          bad += next != ranges.begin() && std::prev(next)->second > b;
          bad += reinterpret_cast<std::uintptr_t>(b) % model::alignment != 0;
          ranges.emplace(b, e);
          held.push_back({p, bytes, s});
        } else {
          std::size_t k = rng() % held.size();
          pool.deallocate(streams[rng() % 4], held[k].p, held[k].bytes);  // any stream may free
          ranges.erase(at(held[k].p));
          held[k] = held.back();
          held.pop_back();
        }
        auto st = pool.stats();
        bad += st.reserved_bytes < st.live_bytes || st.live_bytes < st.requested_bytes;
        bad += st.reserved_bytes > capacity;
        pool.check_invariants();
      }
      CHECK(bad == 0);
      if (capacity < (std::size_t{1} << 30)) CHECK(ooms > 0);  // the OOM path ran
      else CHECK(ooms == 0);
      for (auto& h : held) pool.deallocate(h.s, h.p, h.bytes);
      pool.check_invariants();
      CHECK(pool.stats().live_bytes == 0);
    }
  }
}

TEST_CASE("vram-replay's torch-caching-model replays the built-in workloads on their streams") {
  const auto config = vram_replay::find_allocator(vram_replay::all_allocators(), "torch-caching-model");
  vram::trace::replay_options o;
  o.time_operations = false;
  for (const auto& t : vram::trace::builtin_workloads()) {
    INFO(t.name);
    auto r = config.run(t, o);
    CHECK(r.allocator == "torch-caching-model");
    CHECK(r.ooms == 0);
    CHECK(r.peak_live_bytes == t.peak_live_bytes());
    CHECK(r.peak_reserved_bytes >= r.peak_live_bytes);
  }
}

// Every shared PyTorch snapshot records its segments (its `segments` list, all on stream 0,
// recorded with the default options: max_split_size -1, expandable_segments off, no
// roundup_power2_divisions), and the reader takes PyTorch's reserved bytes from them and from
// the segment events. Where the window holds the whole run (no block live when it opens), the
// model must reserve exactly what PyTorch did. Where it opens mid-run, the blocks then live are
// placed afresh in the model, not where PyTorch had put them, so the fragmentation made before
// the window is not reproduced: 1% of the recorded figure, 5% for the window that opens with
// the most blocks live (1169, in segments with 21.8 GiB more than was allocated at its end).
TEST_CASE("PyTorch's snapshots replayed: the model reserves what PyTorch reserved", "[traces]") {
  vram::trace::replay_options o;
  o.time_operations = false;
  struct expected {
    const char* file;
    double tolerance;  // of the recorded peak reserved
  };
  for (auto [file, tolerance] : {expected{"memory.pickle", 0.0},
                                 {"NiuHuangxiaozi__forward_and_backward_memory_snapshot_200.pickle", 0.0},
                                 {"NiuHuangxiaozi__forward_and_backward_memory_snapshot_200_mixed_precision.pickle", 0.0},
                                 {"medium_1024_training_memory_snapshot.pickle", 0.01},
                                 {"sidsoc12__mem_snapshot_ctx128_fp32_train.pickle", 0.01},
                                 {"CliffKai__memory_snapshot_large_bwd.pickle", 0.01},
                                 {"LINYUNLinYun__xl_ctx512_full_step_bf16.pickle", 0.05}}) {
    const auto& t = vram::test::real(file);
    REQUIRE(t.recorded_peak_reserved.has_value());
    CHECK((tolerance == 0.0) == (t.initial_live == 0));
    model pool(device(std::size_t{1} << 40));
    auto r = vram::trace::replay(t, pool, [&] { return pool.stats(); }, {}, o);
    const double recorded = double(*t.recorded_peak_reserved), error = double(r.peak_reserved_bytes) / recorded - 1;
    INFO(file << ": model " << r.peak_reserved_bytes << " B, recorded " << *t.recorded_peak_reserved << " B, error "
              << 100 * error << "%");
    CHECK(r.ooms == 0);
    CHECK(r.peak_live_bytes == t.peak_live_bytes());
    CHECK(r.peak_reserved_bytes >= r.peak_live_bytes);
    CHECK(std::abs(error) <= tolerance);
  }
}

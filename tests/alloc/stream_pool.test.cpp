// stream_pool's own behaviour: splitting and coalescing, growth and release, capped pools,
// out of memory, misuse, a property test against a reference model, stream hazards and threads.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * 1024;

using host_pool = vram::stream_pool<vram::host_source>;
using sim_pool = vram::stream_pool<vram::simulated_device_source>;
using recorded_sim = vram::test::recording_resource<vram::simulated_device_source>;
using recorded_pool = vram::stream_pool<recorded_sim>;

vram::simulated_device_source contiguous_device(std::size_t capacity = 1ull << 30, std::size_t granularity = 64 * KiB) {
  return vram::simulated_device_source(
      vram::simulated_device_options{.capacity = capacity, .granularity = granularity, .contiguous = true});
}
vram::simulated_device_source separate_device(std::size_t capacity = 1ull << 30, std::size_t granularity = 64 * KiB) {
  return vram::simulated_device_source(
      vram::simulated_device_options{.capacity = capacity, .granularity = granularity, .contiguous = false});
}

char* at(void* p) { return static_cast<char*>(p); }

}  // namespace

TEST_CASE("stream_pool: blocks split from one chunk and coalesce when freed", "[stream_pool]") {
  host_pool pool(vram::host_source{}, {.growth_step = 1 * MiB, .small_max = 0});
  void* a = pool.allocate_sync(256 * KiB);
  void* b = pool.allocate_sync(256 * KiB);
  void* c = pool.allocate_sync(256 * KiB);
  CHECK(at(a) + 256 * KiB == at(b));  // best fit at the lowest address: carved in order
  CHECK(at(b) + 256 * KiB == at(c));
  auto st = pool.stats();
  CHECK(st.reserved_bytes == 1 * MiB);
  CHECK(st.upstream_allocations == 1);
  CHECK(st.free_blocks == 1);
  CHECK(st.free_bytes == 256 * KiB);
  pool.deallocate_sync(b, 256 * KiB);
  CHECK(pool.stats().free_blocks == 2);
  pool.deallocate_sync(a, 256 * KiB);  // merges with b
  st = pool.stats();
  CHECK(st.free_blocks == 2);
  CHECK(st.largest_free_block == 512 * KiB);
  CHECK(st.fragmentation() == Approx(1.0 - 512.0 / 768.0));
  // Best fit: a 300 KiB request takes the 512 KiB hole, not the 256 KiB tail.
  void* d = pool.allocate_sync(300 * KiB);
  CHECK(d == a);
  pool.check_invariants();
  pool.deallocate_sync(d, 300 * KiB);
  pool.deallocate_sync(c, 256 * KiB);
  st = pool.stats();
  CHECK(st.free_blocks == 1);
  CHECK(st.largest_free_block == 1 * MiB);
  CHECK(st.live_bytes == 0);
  pool.check_invariants();
}

TEST_CASE("stream_pool: small sizes round to classes and are reused from the bin", "[stream_pool]") {
  host_pool pool;
  void* a = pool.allocate_sync(100);
  auto st = pool.stats();
  CHECK(st.live_bytes == 256);
  CHECK(st.requested_bytes == 100);
  pool.deallocate_sync(a, 100);
  CHECK(pool.allocate_sync(200) == a);  // same class (256 B): LIFO bin pop
  pool.deallocate_sync(a, 200);
  void* b = pool.allocate_sync(5000);
  CHECK(pool.stats().live_bytes == 5120);  // 4096 + 512 steps above 4 KiB... 5000 -> 5120
  pool.deallocate_sync(b, 5000);
  st = pool.stats();
  CHECK(st.live_bytes == 0);
  CHECK(st.total_allocations == 3);
  CHECK(st.total_deallocations == 3);
  CHECK(st.live_bytes + st.free_bytes == st.reserved_bytes);
  pool.check_invariants();
}

TEST_CASE("stream_pool: a cached block left alone inside large free space leaves its bin", "[stream_pool]") {
  // On a contiguous device, in address order: [h][a][s 8 KiB][b][g][top], and optionally a
  // free 32 KiB hole x below h. s is freed into its bin; a is freed (s still has a live
  // neighbour, b); then b's free leaves s alone between free blocks.
  struct layout {
    std::size_t sides;   // a's and b's size
    bool small_hole;     // x below h: a hole under large_free that can hold s's size
  };
  for (layout c : {layout{2 * MiB, true}, layout{2 * MiB, false}, layout{1 * MiB, false}}) {
    CAPTURE(c.sides, c.small_hole);
    sim_pool pool(contiguous_device(), {});
    void* x = c.small_hole ? pool.allocate_sync(32 * KiB) : nullptr;  // above small_max: a heap block
    void* h = pool.allocate_sync(1 * MiB);
    void* a = pool.allocate_sync(c.sides);
    void* s = pool.allocate_sync(8 * KiB);
    void* b = pool.allocate_sync(c.sides);
    void* g = pool.allocate_sync(1 * MiB);  // keeps b's hole apart from the top
    REQUIRE(at(h) + 1 * MiB == at(a));
    REQUIRE(at(a) + c.sides == at(s));
    REQUIRE(at(s) + 8 * KiB == at(b));
    REQUIRE(at(b) + c.sides == at(g));
    if (x != nullptr) pool.deallocate_sync(x, 32 * KiB);
    pool.deallocate_sync(s, 8 * KiB);       // into its bin
    pool.deallocate_sync(a, c.sides);       // b is live: s stays cached
    pool.check_invariants();
    pool.deallocate_sync(b, c.sides);       // s is alone between free blocks
    pool.check_invariants();
    auto st = pool.stats();
    CHECK(st.live_bytes == 2 * MiB);
    void* t = pool.allocate_sync(8 * KiB);
    if (c.sides * 2 < 4 * MiB) {
      CHECK(t == s);  // small free space around it: s stays in its bin and is reused
      CHECK(st.largest_free_block == c.sides);
    } else {
      // 4 MiB or more around it: s coalesced with both sides
      CHECK(st.largest_free_block == 2 * c.sides + 8 * KiB);
      // and the next request of its size goes where best fit puts it: in the small hole,
      // through the bin that got a block there in s's place; else at the lowest address of
      // the joined free space (the top is taken last)
      CHECK(t == (c.small_hole ? x : a));
    }
    pool.deallocate_sync(t, 8 * KiB);
    pool.deallocate_sync(h, 1 * MiB);
    pool.deallocate_sync(g, 1 * MiB);
    pool.check_invariants();
    CHECK(pool.stats().live_bytes == 0);
  }
}

TEST_CASE("stream_pool: growth from a separate-chunk upstream and release of whole chunks", "[stream_pool]") {
  recorded_pool pool(recorded_sim(separate_device()), {.growth_step = 1 * MiB, .small_max = 0});
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(pool.allocate_sync(600 * KiB));
  auto st = pool.stats();
  CHECK(st.upstream_allocations == 3);
  CHECK(st.reserved_bytes == 3 * MiB);
  CHECK(pool.release() == 0);  // nothing is wholly free
  pool.deallocate_sync(blocks[1], 600 * KiB);
  CHECK(pool.release() == 1 * MiB);
  CHECK(pool.stats().reserved_bytes == 2 * MiB);
  CHECK(pool.upstream().counters().live_allocations() == 2);
  pool.deallocate_sync(blocks[0], 600 * KiB);
  pool.deallocate_sync(blocks[2], 600 * KiB);
  CHECK(pool.release() == 2 * MiB);
  st = pool.stats();
  CHECK(st.reserved_bytes == 0);
  CHECK(st.upstream_deallocations == 3);
  CHECK(pool.upstream().counters().live_bytes == 0);
  pool.check_invariants();
}

TEST_CASE("stream_pool: a contiguous upstream grows in place and chunks coalesce", "[stream_pool]") {
  recorded_pool pool(recorded_sim(contiguous_device()), {.small_max = 0});
  void* a = pool.allocate_sync(1 * MiB);
  void* b = pool.allocate_sync(3 * MiB);
  CHECK(at(a) + 1 * MiB == at(b));  // the second chunk landed right above the first
  CHECK(pool.stats().reserved_bytes == 4 * MiB);
  pool.deallocate_sync(a, 1 * MiB);
  pool.deallocate_sync(b, 3 * MiB);
  auto st = pool.stats();
  CHECK(st.free_blocks == 1);  // one range, no seam between the two growths
  CHECK(st.largest_free_block == 4 * MiB);
  // A bigger request tops up the free top block instead of taking a new 5 MiB.
  void* c = pool.allocate_sync(5 * MiB);
  CHECK(c == a);
  CHECK(pool.stats().reserved_bytes == 5 * MiB);
  pool.check_invariants();
  pool.deallocate_sync(c, 5 * MiB);
  // Release gives back every granule-aligned free piece, including partially.
  void* d = pool.allocate_sync(100 * KiB);
  CHECK(pool.release() == 5 * MiB - 128 * KiB);
  st = pool.stats();
  CHECK(st.reserved_bytes == 128 * KiB);
  pool.check_invariants();
  pool.deallocate_sync(d, 100 * KiB);
  CHECK(pool.release() == 128 * KiB);
  CHECK(pool.upstream().counters().live_bytes + 0 == pool.upstream().inner().stats().reserved_bytes);
  CHECK(pool.upstream().inner().stats().reserved_bytes == 0);
  pool.check_invariants();
}

TEST_CASE("stream_pool: a capped pool reaches exactly its maximum (RMM #1957)", "[stream_pool]") {
  host_pool pool(vram::host_source{}, {.maximum_size = 4 * MiB, .growth_step = 3 * MiB, .small_max = 0});
  void* a = pool.allocate_sync(3 * MiB);
  void* b = pool.allocate_sync(1 * MiB);  // only 1 MiB of room: the pool grows by exactly that
  auto st = pool.stats();
  CHECK(st.reserved_bytes == 4 * MiB);
  CHECK(st.live_bytes == 4 * MiB);
  try {
    (void)pool.allocate_sync(256);
    FAIL("a full capped pool served a request");
  } catch (const vram::out_of_memory& e) {  // the message names the cap that refused
    CHECK(e.limit() == 4 * MiB);
    CHECK(std::string(e.what()).find("its maximum_size is 4194304 bytes") != std::string::npos);
  }
  CHECK(pool.stats().ooms == 1);
  pool.deallocate_sync(a, 3 * MiB);
  pool.deallocate_sync(b, 1 * MiB);
  pool.check_invariants();
}

TEST_CASE("stream_pool: a capped pool releases free chunks before reporting out of memory", "[stream_pool]") {
  recorded_pool pool(recorded_sim(separate_device()), {.maximum_size = 4 * MiB, .growth_step = 1 * MiB, .small_max = 0});
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(pool.allocate_sync(1 * MiB));
  for (void* p : blocks) pool.deallocate_sync(p, 1 * MiB);
  // Four separate 1 MiB chunks cannot serve 2 MiB; giving them back makes room.
  void* big = pool.allocate_sync(2 * MiB);
  auto st = pool.stats();
  CHECK(st.reserved_bytes == 2 * MiB);
  CHECK(st.upstream_deallocations == 4);
  CHECK(st.ooms == 0);
  pool.deallocate_sync(big, 2 * MiB);
  pool.check_invariants();
}

TEST_CASE("stream_pool: out of memory leaves the pool unchanged and the upstream balanced", "[stream_pool]") {
  recorded_sim upstream(separate_device(8 * MiB));  // copies share the counters
  const auto* counters = &upstream.counters();
  {
    recorded_pool pool(upstream, {.growth_step = 1 * MiB});
    void* a = pool.allocate_sync(6 * MiB);
    void* small = pool.allocate_sync(1000);
    auto before = pool.stats();
    auto upstream_before = counters->allocations.load();
    try {
      (void)pool.allocate(vram::stream_ref{}, 4 * MiB);
      FAIL("expected out_of_memory");
    } catch (const vram::out_of_memory& e) {
      CHECK(e.bytes() == 4 * MiB);
      CHECK(e.stats().live_bytes == before.live_bytes);
      CHECK(e.stats().reserved_bytes == before.reserved_bytes);
      CHECK(std::string(e.resource()) == "stream_pool");
    }
    auto after = pool.stats();
    CHECK(after.live_bytes == before.live_bytes);
    CHECK(after.reserved_bytes == before.reserved_bytes);
    CHECK(after.live_allocations == before.live_allocations);
    CHECK(after.ooms == before.ooms + 1);
    CHECK(counters->allocations.load() == upstream_before);
    pool.check_invariants();
    pool.deallocate_sync(small, 1000);
    pool.deallocate_sync(a, 6 * MiB);
    void* again = pool.allocate_sync(4 * MiB);  // still works afterwards
    pool.deallocate_sync(again, 4 * MiB);
    pool.check_invariants();
  }
  CHECK(counters->live_allocations() == 0);
  CHECK(counters->live_bytes == 0);
}

TEST_CASE("stream_pool: bad input is reported and changes nothing", "[stream_pool]") {
  vram::test::misuse_capture capture;
  host_pool pool;
  vram::host_stream stream;
  void* small = pool.allocate(stream, 1000);
  void* large = pool.allocate_sync(3 * MiB);
  void* aligned = pool.allocate_sync(5000, 4096);
  void* freed = pool.allocate_sync(2 * MiB);
  pool.deallocate_sync(freed, 2 * MiB);
  auto before = pool.stats();

  alignas(256) static char foreign[1024];
  pool.deallocate_sync(foreign, 1024);
  CHECK(capture.count(vram::misuse::foreign_pointer) == 1);
  pool.deallocate(stream, small, 999);  // lane path
  pool.deallocate_sync(small, 1001);    // another stream: slow path finds it in the lane
  pool.deallocate_sync(large, 3 * MiB + 1);
  CHECK(capture.count(vram::misuse::wrong_size) == 3);
  CHECK(capture.last().expected_bytes == 3 * MiB);
  pool.deallocate_sync(freed, 2 * MiB);
  CHECK(capture.count(vram::misuse::double_free) == 1);
  pool.deallocate_sync(at(large) + 256, 256);  // inside a live block
  CHECK(capture.count(vram::misuse::foreign_pointer) == 2);

  auto after = pool.stats();
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(after.free_blocks == before.free_blocks);
  CHECK(after.live_allocations == before.live_allocations);
  pool.check_invariants();
  capture.clear();
  pool.deallocate(stream, small, 1000);
  pool.deallocate_sync(large, 3 * MiB);
  pool.deallocate_sync(aligned, 5000, 4096);
  CHECK(capture.count() == 0);
  CHECK(pool.stats().live_bytes == 0);
  stream.synchronize();
  pool.check_invariants();
}

TEST_CASE("stream_pool: the inline bin paths hand every other case to the general ones", "[stream_pool]") {
  vram::test::misuse_capture capture;
  host_pool pool;
  vram::host_stream stream;
  void* p = pool.allocate(stream, 1000);  // the lane exists and is this thread's cached lane
  pool.deallocate(stream, p, 1000);       // cached in its bin
  auto before = pool.stats();

  // nullptr with any size and alignment: nothing (the lane's map must not be probed for 0).
  pool.deallocate(stream, nullptr, 1000);
  pool.deallocate(stream, nullptr, 3 * MiB);
  pool.deallocate(stream, nullptr, 1000, 4096);
  CHECK(capture.count() == 0);
  // A second free of the cached block on its own stream: reported, not cached twice.
  pool.deallocate(stream, p, 1000);
  CHECK(capture.count(vram::misuse::double_free) == 1);
  // Zero bytes and bad alignments never reach a bin.
  CHECK(pool.allocate(stream, 0) == nullptr);
  CHECK_THROWS_AS(pool.allocate(stream, 1000, 0), vram::invalid_argument);
  CHECK_THROWS_AS(pool.allocate(stream, 1000, 384), vram::invalid_argument);
  CHECK_THROWS_AS(pool.allocate(stream, vram::max_request_bytes + 1), vram::invalid_argument);
  auto after = pool.stats();
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(after.total_allocations == before.total_allocations);
  pool.check_invariants();

  // A cached block's recorded size is 0 (block::cached()): a free of it with 0 bytes is a
  // double free too, and a live block freed with 0 bytes a wrong size; neither is cached.
  pool.deallocate(stream, p, 0);
  CHECK(capture.count(vram::misuse::double_free) == 2);
  void* live = pool.allocate(stream, 1000);  // the cached block again
  CHECK(live == p);
  pool.deallocate(stream, live, 0);
  CHECK(capture.count(vram::misuse::wrong_size) == 1);
  CHECK(capture.last().expected_bytes == 1000);
  pool.deallocate(stream, live, 1000);
  CHECK(capture.count() == 3);
  pool.check_invariants();

  // A small request with a large alignment takes the heap and comes back through it.
  void* q = pool.allocate(stream, 1000, 4096);
  CHECK(vram::is_aligned(q, 4096));
  CHECK(pool.allocate(stream, 1000) == p);  // the bin still serves its block
  pool.deallocate(stream, q, 1000, 4096);
  pool.deallocate(stream, p, 1000);
  CHECK(capture.count() == 3);
  CHECK(pool.stats().live_bytes == 0);
  stream.synchronize();
  pool.check_invariants();
}

namespace {

/// Random operations on several streams against a reference model (a map of live blocks).
template <class Pool>
void random_operations(Pool& pool, unsigned seed, int operations) {
  std::mt19937_64 rng(seed);
  vram::host_stream s1, s2, s3;
  vram::stream_ref streams[] = {vram::stream_ref{}, s1, s2, s3};
  struct live {
    std::size_t bytes, align;
  };
  std::map<char*, live> model;
  std::size_t requested = 0;
  for (int op = 0; op < operations; ++op) {
    vram::stream_ref s = streams[rng() % 4];
    if (model.empty() || rng() % 100 < 55) {
      std::size_t bytes;
      switch (rng() % 4) {
        case 0: bytes = 1 + rng() % 4096; break;
        case 1: bytes = 1 + rng() % (256 * KiB); break;
        case 2: bytes = 1 + rng() % (2 * MiB); break;
        default: bytes = 1 + rng() % (8 * MiB); break;
      }
      std::size_t align = std::size_t{256} << (rng() % 8 == 0 ? rng() % 6 : 0);
      char* p = nullptr;
      try {
        p = at(pool.allocate(s, bytes, align));
      } catch (const vram::out_of_memory&) {
        pool.check_invariants();
        CHECK(pool.stats().live_allocations == model.size());
        continue;
      }
      REQUIRE(vram::is_aligned(p, align));
      // No overlap with any live block.
      auto next = model.lower_bound(p);
      if (next != model.end()) REQUIRE(p + bytes <= next->first);
      if (next != model.begin()) {
        auto prev = std::prev(next);
        REQUIRE(prev->first + prev->second.bytes <= p);
      }
      model.emplace(p, live{bytes, align});
      requested += bytes;
    } else {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng() % model.size()));
      pool.deallocate(s, it->first, it->second.bytes, it->second.align);
      requested -= it->second.bytes;
      model.erase(it);
    }
    if (op % 97 == 0 && rng() % 2 == 0) (void)pool.release();
    pool.check_invariants();
    auto st = pool.stats();
    REQUIRE(st.live_allocations == model.size());
    REQUIRE(st.requested_bytes == requested);
    REQUIRE(st.live_bytes + st.free_bytes == st.reserved_bytes);
  }
  for (auto& [p, b] : model) pool.deallocate_sync(p, b.bytes, b.align);
  pool.check_invariants();
  CHECK(pool.stats().live_bytes == 0);
}

}  // namespace

TEST_CASE("stream_pool: property test against a reference model", "[stream_pool][property]") {
  for (unsigned seed : {1u, 2u, 3u}) {
    SECTION("contiguous, on demand, seed " + std::to_string(seed)) {
      recorded_pool pool(recorded_sim(contiguous_device(256 * MiB)), {.bin_capacity = 4});
      random_operations(pool, seed, 2500);
      pool.release();
      CHECK(pool.upstream().counters().live_bytes == 0);
    }
    SECTION("separate chunks, capped, seed " + std::to_string(seed)) {
      recorded_pool pool(recorded_sim(separate_device(256 * MiB)),
                         {.maximum_size = 96 * MiB, .growth_step = 8 * MiB, .lane_cache_bytes = 1 * MiB});
      random_operations(pool, seed + 100, 2500);
      pool.release();
      CHECK(pool.upstream().counters().live_allocations() == 0);
    }
    SECTION("host memory, seed " + std::to_string(seed)) {
      host_pool pool(vram::host_source{}, {.growth_step = 4 * MiB});
      random_operations(pool, seed + 200, 2500);
    }
  }
}

TEST_CASE("stream_pool: blocks freed on one stream are not overwritten early by another", "[stream_pool][streams]") {
  // A small capped pool forces blocks freed on one stream to be taken by the others. Each
  // stream fills its block with its own pattern, pauses, and verifies it: an early reuse by
  // another stream shows up as a corrupted block.
  host_pool pool(vram::host_source{}, {.maximum_size = 1 * MiB, .growth_step = 1 * MiB, .small_max = 64 * KiB});
  constexpr int stream_count = 3;
  vram::host_stream streams[stream_count];
  std::map<void*, std::set<int>> users;
  std::mt19937 rng(7);
  for (int i = 0; i < 600; ++i) {
    int k = static_cast<int>(rng() % stream_count);
    std::size_t bytes = (rng() % 2 == 0) ? 48 * KiB : 200 * KiB;
    void* p = pool.allocate(streams[k], bytes);
    users[p].insert(k);
    auto pattern = static_cast<unsigned char>(k * 64 + i % 64);
    streams[k].enqueue([p, bytes, pattern] { std::memset(p, pattern, bytes); });
    streams[k].enqueue([] { std::this_thread::sleep_for(std::chrono::microseconds(30)); });
    streams[k].enqueue([p, bytes, pattern] {
      auto* c = static_cast<unsigned char*>(p);
      for (std::size_t j = 0; j < bytes; j += 512)
        if (c[j] != pattern) throw std::runtime_error("block overwritten while in use");
      if (c[bytes - 1] != pattern) throw std::runtime_error("block overwritten while in use");
    });
    pool.deallocate(streams[k], p, bytes);
    if (i % 50 == 0) pool.check_invariants();
  }
  for (auto& s : streams) REQUIRE_NOTHROW(s.synchronize());
  std::size_t shared = 0;
  for (auto& [p, who] : users) shared += who.size() > 1;
  CHECK(shared > 0);  // blocks really moved between streams
  CHECK(pool.stats().reserved_bytes <= 1 * MiB);
  pool.check_invariants();
}

TEST_CASE("stream_pool: allocate_sync waits for a stolen block's stream", "[stream_pool][streams]") {
  host_pool pool(vram::host_source{}, {.maximum_size = 1 * MiB, .growth_step = 1 * MiB, .small_max = 0});
  vram::host_stream s;
  std::atomic<bool> done{false};
  void* p = pool.allocate(s, 1 * MiB);
  s.enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    done = true;
  });
  pool.deallocate(s, p, 1 * MiB);
  void* q = pool.allocate_sync(1 * MiB);  // only s's block exists: the host waits for s
  CHECK(q == p);
  CHECK(done.load());
  pool.deallocate_sync(q, 1 * MiB);
  pool.check_invariants();
}

TEST_CASE("stream_pool: idle streams' free blocks merge and serve everyone", "[stream_pool][streams]") {
  host_pool pool(vram::host_source{}, {.growth_step = 1 * MiB, .small_max = 0});
  vram::host_stream a, b;
  void* x = pool.allocate(a, 512 * KiB);
  void* y = pool.allocate(b, 512 * KiB);
  pool.deallocate(a, x, 512 * KiB);
  pool.deallocate(b, y, 512 * KiB);
  a.synchronize();
  b.synchronize();
  // Keyed to a and b, the halves cannot coalesce; once both streams are seen idle they merge.
  void* whole = pool.allocate_sync(1 * MiB);
  CHECK(pool.stats().reserved_bytes == 1 * MiB);  // no growth: the two halves merged
  CHECK(whole == std::min(x, y));
  pool.deallocate_sync(whole, 1 * MiB);
  pool.check_invariants();
}

TEST_CASE("stream_pool: several threads at once", "[stream_pool][threads]") {
  recorded_pool pool(recorded_sim(contiguous_device(1ull << 30)), {.lane_cache_bytes = 2 * MiB});
  host_pool hpool(vram::host_source{}, {.growth_step = 8 * MiB});
  constexpr int threads = 4;
  std::vector<std::thread> workers;
  vram::host_stream shared_stream;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      vram::host_stream own;
      std::vector<std::pair<void*, std::size_t>> held;
      for (int i = 0; i < 3000; ++i) {
        vram::stream_ref s = (t % 2 == 0) ? vram::stream_ref{own} : vram::stream_ref{shared_stream};
        if (i % 7 == 0) s = vram::stream_ref{};
        if (held.size() < 20 && rng() % 2 == 0) {
          std::size_t bytes = rng() % 3 == 0 ? 1 + rng() % (3 * MiB) : 1 + rng() % 8192;
          held.emplace_back(pool.allocate(s, bytes), bytes);
          void* h = hpool.allocate(s, bytes);
          auto pattern = static_cast<unsigned char>(t);
          if (s.is_host()) {
            s.host().enqueue([h, bytes, pattern] { std::memset(h, pattern, bytes); });
            s.host().enqueue([h, bytes, pattern] {
              if (static_cast<unsigned char*>(h)[bytes - 1] != pattern) throw std::runtime_error("corrupted");
            });
          }
          hpool.deallocate(s, h, bytes);
        } else if (!held.empty()) {
          pool.deallocate(s, held.back().first, held.back().second);
          held.pop_back();
        }
        if (i % 500 == 0) (void)pool.stats();
      }
      for (auto& [p, n] : held) pool.deallocate_sync(p, n);
      own.synchronize();
    });
  }
  for (auto& w : workers) w.join();
  shared_stream.synchronize();
  pool.check_invariants();
  hpool.check_invariants();
  CHECK(pool.stats().live_bytes == 0);
  CHECK(hpool.stats().live_bytes == 0);
}

namespace {

struct counting_observer {
  struct counts {
    std::atomic<int> allocations{0}, deallocations{0}, grows{0}, releases{0}, ooms{0};
    std::atomic<std::size_t> grown_bytes{0}, released_bytes{0};
  };
  std::shared_ptr<counts> c = std::make_shared<counts>();
  void on_allocate(const void*, std::size_t, vram::stream_ref) noexcept { ++c->allocations; }
  void on_deallocate(const void*, std::size_t, vram::stream_ref) noexcept { ++c->deallocations; }
  void on_grow(const void*, std::size_t n) noexcept {
    ++c->grows;
    c->grown_bytes += n;
  }
  void on_release(const void*, std::size_t n) noexcept {
    ++c->releases;
    c->released_bytes += n;
  }
  void on_out_of_memory(std::size_t, vram::stream_ref, const vram::stats& st) noexcept {
    ++c->ooms;
    CHECK(st.ooms >= 1);
  }
};
static_assert(vram::observer<counting_observer>);

}  // namespace

TEST_CASE("stream_pool: a heap free takes a block out of a bin another thread is using", "[stream_pool][threads]") {
  // One stream, two threads: one keeps leaving a 12 KiB block cached alone between two 2 MiB
  // blocks it frees (the heap free moves it out of the lane's bin, under the lane's lock);
  // the other allocates and frees 8 KiB blocks on the same lane, checking their contents.
  host_pool pool(vram::host_source{}, {.growth_step = 64 * MiB});  // one chunk: the blocks are adjacent
  vram::host_stream stream;
  vram::stream_ref s{stream};
  {  // the 8 KiB bin holds 8 blocks at the bottom, enough for the small thread: it never goes to the heap
    std::vector<void*> warm;
    for (int i = 0; i < 8; ++i) warm.push_back(pool.allocate(s, 8 * KiB));
    for (void* p : warm) pool.deallocate(s, p, 8 * KiB);
  }
  std::atomic<bool> done{false};
  std::atomic<int> corrupted{0};
  std::thread small([&] {
    std::vector<char*> held;
    for (int i = 0; !done.load(std::memory_order_relaxed) || i < 2000; ++i) {
      auto* p = static_cast<char*>(pool.allocate(s, 8 * KiB));
      std::memset(p, static_cast<char>(i), 8 * KiB);
      held.push_back(p);
      if (held.size() == 8 || i % 3 == 0) {
        for (char* h : held) {
          if (h[0] != h[8 * KiB - 1]) corrupted.fetch_add(1);
          pool.deallocate(s, h, 8 * KiB);
        }
        held.clear();
      }
    }
    for (char* h : held) pool.deallocate(s, h, 8 * KiB);
  });
  for (int i = 0; i < 500; ++i) {
    void* a = pool.allocate(s, 2 * MiB);
    void* c = pool.allocate(s, 12 * KiB);
    void* b = pool.allocate(s, 2 * MiB);
    pool.deallocate(s, c, 12 * KiB);
    pool.deallocate(s, a, 2 * MiB);
    pool.deallocate(s, b, 2 * MiB);
    if (i % 50 == 0) pool.check_invariants();
  }
  done = true;
  small.join();
  stream.synchronize();
  pool.check_invariants();
  CHECK(corrupted.load() == 0);
  CHECK(pool.stats().live_bytes == 0);
}

TEST_CASE("stream_pool: the observer sees every event and stats keep exact peaks", "[stream_pool]") {
  counting_observer obs;
  auto counts = obs.c;
  {
    vram::stream_pool<vram::simulated_device_source, counting_observer> pool(
        separate_device(16 * MiB), {.maximum_size = 8 * MiB, .growth_step = 2 * MiB}, obs);
    void* a = pool.allocate_sync(3 * MiB);
    void* b = pool.allocate_sync(1000);
    void* c = pool.allocate_sync(1 * MiB + 1);
    auto st = pool.stats();
    CHECK(st.peak_live_bytes == 3 * MiB + 1024 + 1 * MiB + 256);
    CHECK(st.requested_bytes == 3 * MiB + 1000 + 1 * MiB + 1);
    pool.deallocate_sync(a, 3 * MiB);
    pool.deallocate_sync(c, 1 * MiB + 1);
    st = pool.stats();
    CHECK(st.peak_live_bytes == 3 * MiB + 1024 + 1 * MiB + 256);
    CHECK(st.live_bytes == 1024);
    CHECK(st.peak_requested_bytes == 3 * MiB + 1000 + 1 * MiB + 1);
    CHECK(st.peak_reserved_bytes == st.reserved_bytes);
    CHECK_THROWS_AS(pool.allocate_sync(9 * MiB), vram::out_of_memory);
    pool.deallocate_sync(b, 1000);
    pool.release();
    CHECK(pool.stats().reserved_bytes == 0);
    CHECK(counts->allocations == 3);
    CHECK(counts->deallocations == 3);
    CHECK(counts->ooms == 1);
    CHECK(counts->grown_bytes == counts->released_bytes);
    CHECK(counts->grows >= 2);
  }
}

TEST_CASE("stream_pool: try_allocate returns nullptr where allocate throws", "[stream_pool]") {
  host_pool pool(vram::host_source{}, {.maximum_size = 1 * MiB, .growth_step = 1 * MiB});
  void* a = pool.try_allocate(vram::stream_ref{}, 512 * KiB);
  CHECK(a != nullptr);
  CHECK(pool.try_allocate(vram::stream_ref{}, 768 * KiB) == nullptr);
  CHECK(pool.stats().ooms == 1);
  CHECK(pool.owns(a));
  pool.deallocate_sync(a, 512 * KiB);
  CHECK_FALSE(pool.owns(a));
  pool.check_invariants();
}

TEST_CASE("stream_pool: more streams than lanes take the heap path", "[stream_pool][streams]") {
  host_pool pool(vram::host_source{}, {.growth_step = 4 * MiB});
  constexpr int stream_count = 80;  // the lane table holds 64
  std::vector<std::unique_ptr<vram::host_stream>> streams;
  std::vector<void*> blocks;
  for (int i = 0; i < stream_count; ++i) {
    streams.push_back(std::make_unique<vram::host_stream>());
    blocks.push_back(pool.allocate(*streams.back(), 1000 + static_cast<std::size_t>(i)));
  }
  pool.check_invariants();
  for (std::size_t i = 0; i < stream_count; ++i) pool.deallocate(*streams[i], blocks[i], 1000 + i);
  auto st = pool.stats();
  CHECK(st.live_allocations == 0);
  CHECK(st.total_allocations == stream_count);
  pool.check_invariants();
  // Blocks freed on a destroyed stream become usable by everyone.
  streams.clear();
  void* big = pool.allocate_sync(4 * MiB);
  CHECK(pool.stats().reserved_bytes == 4 * MiB);
  pool.deallocate_sync(big, 4 * MiB);
  pool.check_invariants();
}

TEST_CASE("stream_pool: with several streams, peaks are bounds; with one, exact", "[stream_pool][streams]") {
  // Each stream's lane keeps its own ledger (no shared counter on the fast path), so the pool
  // knows each stream's peak but not when they coincided: it reports their sum, capped by the
  // reserved peak. The true peak is tracked here.
  sim_pool pool(contiguous_device(256 * MiB), {});
  vram::host_stream a, b;
  vram::host_stream* streams[] = {&a, &b};
  std::mt19937 rng(7);
  struct live_block {
    void* p;
    std::size_t bytes;
    int stream;
  };
  std::vector<live_block> live;
  std::size_t live_bytes = 0, true_peak = 0, sum_requested = 0, true_peak_requested = 0;
  for (int i = 0; i < 2000; ++i) {
    if (live.empty() || rng() % 100 < 55) {
      std::size_t bytes = 1 + rng() % (rng() % 4 == 0 ? 2 * MiB : 8 * KiB);
      int s = static_cast<int>(rng() % 2);
      live.push_back({pool.allocate(*streams[s], bytes), bytes, s});
      live_bytes += vram::align_up(bytes, 256);
      sum_requested += bytes;
      true_peak = std::max(true_peak, live_bytes);
      true_peak_requested = std::max(true_peak_requested, sum_requested);
    } else {
      std::size_t k = rng() % live.size();
      live_block x = live[k];
      live[k] = live.back();
      live.pop_back();
      pool.deallocate(*streams[rng() % 2], x.p, x.bytes);  // freed on either stream
      live_bytes -= vram::align_up(x.bytes, 256);
      sum_requested -= x.bytes;
    }
    if (i % 100 == 0) {
      auto st = pool.stats();
      REQUIRE(st.live_bytes == live_bytes);
      REQUIRE(st.requested_bytes == sum_requested);
      REQUIRE(st.peak_live_bytes >= true_peak);
      REQUIRE(st.peak_live_bytes <= st.peak_reserved_bytes);
      REQUIRE(st.peak_requested_bytes >= true_peak_requested);
      REQUIRE(st.peak_requested_bytes <= st.peak_live_bytes);
      pool.check_invariants();
    }
  }
  for (auto& x : live) pool.deallocate(*streams[x.stream], x.p, x.bytes);
  CHECK(pool.stats().live_bytes == 0);
  pool.check_invariants();

  // One stream: every block is booked to its lane, bins and heap alike, so the peaks are exact.
  sim_pool single(contiguous_device(256 * MiB), {});
  void* big = single.allocate(a, 3 * MiB);     // heap path
  void* small = single.allocate(a, 1000);      // bin path
  single.deallocate(a, big, 3 * MiB);
  void* big2 = single.allocate(a, 2 * MiB);
  auto st = single.stats();
  CHECK(st.peak_live_bytes == 3 * MiB + 1024);
  CHECK(st.peak_requested_bytes == 3 * MiB + 1000);
  single.deallocate(a, small, 1000);
  single.deallocate(a, big2, 2 * MiB);
  single.check_invariants();

  // A heap free unbooks without the lane's lock (the lane's heap credit); bookings after it,
  // on the bin path (a miss, then a hit) and on the heap, must net it out of the peaks.
  sim_pool credit(contiguous_device(256 * MiB), {});
  credit.deallocate(a, credit.allocate(a, 3 * MiB), 3 * MiB);
  void* x = credit.allocate(a, 1000);  // bin miss
  credit.deallocate(a, x, 1000);
  x = credit.allocate(a, 1000);  // bin hit
  void* y = credit.allocate(a, 2 * MiB);
  st = credit.stats();
  CHECK(st.live_bytes == 2 * MiB + 1024);
  CHECK(st.requested_bytes == 2 * MiB + 1000);
  CHECK(st.peak_live_bytes == 3 * MiB);
  CHECK(st.peak_requested_bytes == 3 * MiB);
  CHECK(st.total_deallocations == 2);
  void* z = credit.allocate(a, 1 * MiB + 512);
  CHECK(credit.stats().peak_live_bytes == 3 * MiB + 1024 + 512);
  credit.deallocate(a, x, 1000);
  credit.deallocate(a, y, 2 * MiB);
  credit.deallocate(a, z, 1 * MiB + 512);
  CHECK(credit.stats().live_bytes == 0);
  credit.check_invariants();
}

TEST_CASE("stream_pool: owns() answers for the live blocks of every stream's lane", "[stream_pool][streams]") {
  host_pool pool;
  vram::host_stream a, b, c;
  // A bin-sized and a heap block on each of three streams: three lanes, the first two not the newest.
  std::vector<std::pair<vram::stream_ref, void*>> small, large;
  for (vram::stream_ref s : {vram::stream_ref{a}, vram::stream_ref{b}, vram::stream_ref{c}}) {
    small.emplace_back(s, pool.allocate(s, 100));
    large.emplace_back(s, pool.allocate(s, 2 * MiB));
  }
  for (auto& [s, p] : small) CHECK(pool.owns(p));
  for (auto& [s, p] : large) CHECK(pool.owns(p));
  for (auto& [s, p] : small) pool.deallocate(s, p, 100);  // into each lane's bin: cached, not live
  for (auto& [s, p] : large) pool.deallocate(s, p, 2 * MiB);
  for (auto& [s, p] : small) CHECK_FALSE(pool.owns(p));
  for (auto& [s, p] : large) CHECK_FALSE(pool.owns(p));
  alignas(256) static char foreign[256];
  CHECK_FALSE(pool.owns(foreign));
  pool.check_invariants();
  for (auto* s : {&a, &b, &c}) s->synchronize();
}

TEST_CASE("stream_pool: check_invariants() sees one consistent state while threads use their own streams",
          "[stream_pool][threads]") {
  host_pool pool;
  // Many heap blocks make the check's walk long, so the bin traffic below overlaps it.
  std::vector<void*> held;
  for (int i = 0; i < 4000; ++i) held.push_back(pool.allocate_sync(32 * KiB));
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> pairs{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 2; ++t)
    workers.emplace_back([&, t] {
      vram::host_stream own;
      std::size_t bytes = 256u << t;
      while (!stop.load(std::memory_order_relaxed)) {
        void* p = pool.allocate(own, bytes);
        void* q = pool.allocate(own, bytes);
        pool.deallocate(own, q, bytes);
        pool.deallocate(own, p, bytes);
        pairs.fetch_add(1, std::memory_order_relaxed);
      }
      own.synchronize();
    });
  std::size_t failures = 0, checks = 0;
  std::string first_failure;
  // Enough checks that the bin traffic overlaps them (each check takes every lock in turn).
  for (auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(400);
       std::chrono::steady_clock::now() < until || pairs.load() < 1000; ++checks) {
    try {
      pool.check_invariants();
    } catch (const std::logic_error& e) {
      if (failures++ == 0) first_failure = e.what();
    }
  }
  stop = true;
  for (auto& w : workers) w.join();
  INFO(first_failure);
  CHECK(failures == 0);
  CHECK(checks > 10);
  pool.check_invariants();
  for (void* p : held) pool.deallocate_sync(p, 32 * KiB);
  CHECK(pool.stats().live_bytes == 0);
}

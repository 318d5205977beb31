// activation_arena: bump allocation, frees in any order, mark/rewind, O(1) reset that keeps
// chunks, stream binding, misuse reports, and a random-sequence property test.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <vram/alloc/activation_arena.hpp>
#include <vram/core/event.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"

namespace {

using recorder = vram::test::recording_resource<vram::host_source>;
using arena_t = vram::activation_arena<recorder>;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

arena_t make_arena(std::size_t chunk = 1 * MiB, vram::stream_ref s = {}) {
  return arena_t(recorder{}, s, vram::activation_arena_options{.chunk_bytes = chunk});
}

/// host_source that throws out_of_memory while *fail is set.
struct flaky_host {
  std::shared_ptr<bool> fail;
  vram::host_source inner{};
  void* allocate(vram::stream_ref s, std::size_t bytes, std::size_t align = vram::default_alignment) {
    if (*fail) throw vram::out_of_memory("flaky_host", bytes, s, vram::stats{});
    return inner.allocate(s, bytes, align);
  }
  void deallocate(vram::stream_ref s, void* p, std::size_t bytes, std::size_t align = vram::default_alignment) noexcept {
    inner.deallocate(s, p, bytes, align);
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = vram::default_alignment) {
    return allocate(vram::stream_ref{}, bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = vram::default_alignment) noexcept {
    deallocate(vram::stream_ref{}, p, bytes, align);
  }
  friend bool operator==(const flaky_host& a, const flaky_host& b) noexcept { return a.inner == b.inner; }
};

std::vector<std::size_t> state(const arena_t& a) {
  auto s = a.stats();
  return {s.live_bytes, s.requested_bytes, s.reserved_bytes, s.live_allocations, s.total_allocations,
          s.total_deallocations, s.upstream_allocations, a.chunk_count()};
}

}  // namespace

TEST_CASE("activation_arena: LIFO frees give space back at once", "[activation_arena]") {
  auto a = make_arena();
  void* p = a.allocate_sync(1000);
  void* q = a.allocate_sync(3000);
  CHECK(static_cast<char*>(q) == static_cast<char*>(p) + 1024);  // bump: next to p, rounded to 256
  CHECK(a.stats().live_bytes == 1024 + 3072);
  CHECK(a.stats().requested_bytes == 4000);
  a.deallocate_sync(q, 3000);
  a.check_invariants();
  void* r = a.allocate_sync(500);
  CHECK(r == q);  // the freed top is reused
  a.deallocate_sync(r, 500);
  a.deallocate_sync(p, 1000);
  CHECK(a.stats().live_bytes == 0);
  CHECK(a.allocate_sync(64) == p);
  a.deallocate_sync(p, 64);
  a.check_invariants();
  CHECK(a.upstream().counters().allocations == 1);
}

TEST_CASE("activation_arena: out-of-order frees return when everything above is dead", "[activation_arena]") {
  auto a = make_arena();
  void* x = a.allocate_sync(256);
  void* y = a.allocate_sync(256);
  void* z = a.allocate_sync(256);
  a.deallocate_sync(y, 256);  // out of order: y is dead but z sits above it
  a.check_invariants();
  CHECK(a.stats().live_allocations == 2);
  void* w = a.allocate_sync(256);
  CHECK(w == static_cast<char*>(z) + 256);  // y's space is not reusable yet
  a.deallocate_sync(w, 256);
  a.deallocate_sync(z, 256);  // now y and z pop together
  a.check_invariants();
  CHECK(a.allocate_sync(256) == y);
  a.deallocate_sync(y, 256);
  a.deallocate_sync(x, 256);
  CHECK(a.stats().live_bytes == 0);
  a.check_invariants();
}

TEST_CASE("activation_arena: chunks fill, the next is taken, and frees step back", "[activation_arena]") {
  auto a = make_arena(64 * KiB);
  std::vector<void*> ps;
  for (int i = 0; i < 10; ++i) ps.push_back(a.allocate_sync(16 * KiB));  // 4 per chunk
  CHECK(a.chunk_count() == 3);
  CHECK(a.stats().reserved_bytes == 3 * 64 * KiB);
  a.check_invariants();
  for (int i = 9; i >= 0; --i) {
    a.deallocate_sync(ps[static_cast<std::size_t>(i)], 16 * KiB);
    a.check_invariants();
  }
  // All free: the same addresses come back, without the upstream.
  for (int i = 0; i < 10; ++i) CHECK(a.allocate_sync(16 * KiB) == ps[static_cast<std::size_t>(i)]);
  CHECK(a.upstream().counters().allocations == 3);
  a.reset();
  a.check_invariants();
}

TEST_CASE("activation_arena: a request larger than a chunk gets a chunk of its own", "[activation_arena]") {
  auto a = make_arena(64 * KiB);
  void* small = a.allocate_sync(1 * KiB);
  void* big = a.allocate_sync(1 * MiB);
  CHECK(a.chunk_count() == 2);
  CHECK(a.stats().reserved_bytes == 64 * KiB + 1 * MiB);
  std::memset(big, 1, 1 * MiB);
  a.deallocate_sync(big, 1 * MiB);
  a.deallocate_sync(small, 1 * KiB);
  a.check_invariants();
  // The step used two chunks: reset() replaces them by one of the step's size, and the same
  // sequence in the next steps fits in it without the upstream.
  a.reset();
  a.check_invariants();
  CHECK(a.chunk_count() == 1);
  CHECK(a.upstream().counters().allocations == 3);
  CHECK(a.upstream().counters().live_allocations() == 1);
  std::size_t resized = a.stats().reserved_bytes;
  CHECK(resized >= 1 * KiB + 1 * MiB);
  CHECK(resized <= (1 * KiB + 1 * MiB) * 102 / 100);
  for (int step = 0; step < 3; ++step) {
    void* s2 = a.allocate_sync(1 * KiB);
    void* b2 = a.allocate_sync(1 * MiB);
    CHECK(static_cast<char*>(b2) == static_cast<char*>(s2) + 1 * KiB);
    std::memset(b2, 2, 1 * MiB);
    a.check_invariants();
    a.reset();
  }
  CHECK(a.upstream().counters().allocations == 3);
  CHECK(a.chunk_count() == 1);
}

TEST_CASE("activation_arena: reset() re-sizes a multi-chunk step to its high-water (reserved/live <= 1.02)",
          "[activation_arena]") {
  // bench.arena_forward_backward's shape: a 62 MiB step in 16 MiB chunks takes four chunks
  // (64 MiB) in step one.
  auto a = make_arena(16 * MiB);
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 62; ++i) sizes.push_back(1 * MiB - 256 * static_cast<std::size_t>(i % 3));
  auto run_step = [&] {
    std::vector<void*> ps;
    for (auto n : sizes) ps.push_back(a.allocate_sync(n));
    for (std::size_t i = sizes.size(); i-- > 0;) a.deallocate_sync(ps[i], sizes[i]);
    a.check_invariants();
    a.reset();
    a.check_invariants();
  };
  run_step();
  CHECK(a.upstream().counters().allocations == 5);  // four chunks, then one of the step's size
  CHECK(a.upstream().counters().live_allocations() == 1);
  CHECK(a.chunk_count() == 1);
  const std::size_t calls = a.upstream().counters().allocations + a.upstream().counters().deallocations;
  for (int step = 0; step < 5; ++step) run_step();
  CHECK(a.upstream().counters().allocations + a.upstream().counters().deallocations == calls);  // steady: untouched
  auto st = a.stats();
  INFO("reserved " << st.reserved_bytes << " peak live " << st.peak_live_bytes);
  CHECK(static_cast<double>(st.reserved_bytes) / static_cast<double>(st.peak_live_bytes) <= 1.02);

  // A larger step takes one extra chunk, and its reset() re-sizes again; then steady again.
  sizes.push_back(3 * MiB);
  run_step();
  CHECK(a.chunk_count() == 1);
  CHECK(a.stats().reserved_bytes >= st.peak_live_bytes + 3 * MiB);
  const std::size_t calls2 = a.upstream().counters().allocations + a.upstream().counters().deallocations;
  CHECK(calls2 == calls + 4);  // the extra chunk, the two given back, the new one
  run_step();
  run_step();
  CHECK(a.upstream().counters().allocations + a.upstream().counters().deallocations == calls2);
  // A smaller step keeps the chunk (no shrink, no upstream call).
  sizes.resize(10);
  run_step();
  CHECK(a.upstream().counters().allocations + a.upstream().counters().deallocations == calls2);
  CHECK(a.upstream().counters().live_allocations() == 1);
}

TEST_CASE("activation_arena: reset() re-sizing with a failing upstream leaves no chunk and keeps working",
          "[activation_arena]") {
  auto fail = std::make_shared<bool>(false);
  vram::test::recording_resource<flaky_host> up(flaky_host{fail, vram::host_source{}});
  vram::activation_arena<vram::test::recording_resource<flaky_host>> a(up, {}, {.chunk_bytes = 1 * MiB});
  std::vector<void*> ps;
  for (int i = 0; i < 3; ++i) ps.push_back(a.allocate_sync(512 * KiB + 256));  // one per chunk
  CHECK(a.chunk_count() == 3);
  for (int i = 2; i >= 0; --i) a.deallocate_sync(ps[static_cast<std::size_t>(i)], 512 * KiB + 256);
  *fail = true;
  a.reset();  // gives the three chunks back, then cannot take the new one: the arena holds none
  a.check_invariants();
  CHECK(a.chunk_count() == 0);
  CHECK(a.stats().reserved_bytes == 0);
  CHECK(up.counters().live_allocations() == 0);
  CHECK(up.counters().live_bytes == 0);
  *fail = false;
  for (int step = 0; step < 2; ++step) {  // the next step takes chunks as the first did, and re-sizes
    for (int i = 0; i < 3; ++i) ps[static_cast<std::size_t>(i)] = a.allocate_sync(512 * KiB + 256);
    std::memset(ps[2], 3, 512 * KiB + 256);
    for (int i = 2; i >= 0; --i) a.deallocate_sync(ps[static_cast<std::size_t>(i)], 512 * KiB + 256);
    a.reset();
    a.check_invariants();
    CHECK(a.chunk_count() == 1);
    CHECK(up.counters().live_allocations() == 1);
  }
  CHECK(a.stats().reserved_bytes == up.counters().live_bytes);
  CHECK(a.stats().reserved_bytes <= 3 * (512 * KiB + 256) * 102 / 100);
  CHECK(up.counters().allocations == 3 + 3 + 1);  // step one, step two, the re-size; step three none
}

TEST_CASE("activation_arena: alignment above the default is honoured", "[activation_arena]") {
  auto a = make_arena(64 * KiB);
  (void)a.allocate_sync(256);
  for (std::size_t align : {512ul, 4096ul, 32768ul}) {
    void* p = a.allocate_sync(100, align);
    CHECK(vram::is_aligned(p, align));
  }
  void* huge_aligned = a.allocate_sync(100 * KiB, 64 * KiB);  // own chunk, over-sized for the alignment
  CHECK(vram::is_aligned(huge_aligned, 64 * KiB));
  std::memset(huge_aligned, 0, 100 * KiB);
  a.check_invariants();
  a.reset();
}

TEST_CASE("activation_arena: the gap below an over-aligned block is returned with it", "[activation_arena]") {
  vram::test::misuse_capture capture;
  auto a = make_arena(64 * KiB);
  auto* p = static_cast<char*>(a.allocate_sync(256));
  auto* q = static_cast<char*>(a.allocate_sync(100, 4096));  // a gap between p + 256 and q (unless p + 256 is aligned)
  REQUIRE(vram::is_aligned(q, 4096));
  CHECK(a.stats().live_bytes == 512);  // the gap is not live
  a.check_invariants();
  if (q != p + 256) {
    auto before = state(a);
    a.deallocate_sync(p + 256, 256);  // the gap's start: never handed out
    CHECK(capture.count(vram::misuse::foreign_pointer) == 1);
    CHECK(state(a) == before);
  }
  a.deallocate_sync(q, 100);  // LIFO: the gap goes too
  CHECK(a.stats().live_bytes == 256);
  a.check_invariants();
  CHECK(a.allocate_sync(256) == p + 256);  // bumped right above p again
  a.check_invariants();
  a.reset();

  // Out of order: the block below the gap first, then the aligned block empties the chunk.
  p = static_cast<char*>(a.allocate_sync(256));
  q = static_cast<char*>(a.allocate_sync(300, 8192));
  a.deallocate_sync(p, 256);
  CHECK(a.stats().live_bytes == 512);
  a.deallocate_sync(q, 300);
  CHECK(a.stats().live_bytes == 0);
  CHECK(a.stats().live_allocations == 0);
  a.check_invariants();
  CHECK(a.allocate_sync(256) == p);  // the chunk is empty: bumping starts at its base
  a.reset();
}

TEST_CASE("activation_arena: a size with bit 63 set matches no record (the sentinel, dead blocks)",
          "[activation_arena]") {
  vram::test::misuse_capture capture;
  auto a = make_arena(64 * KiB);
  constexpr std::size_t bit63 = std::size_t{1} << 63;
  void* p = a.allocate_sync(1000);
  a.deallocate_sync(p, 1000);  // the chunk is empty: its last record is the sentinel (nullptr, dead)
  auto before = state(a);
  a.deallocate_sync(nullptr, bit63);
  a.deallocate_sync(nullptr, ~std::size_t{0});
  CHECK(state(a) == before);
  a.check_invariants();
  void* x = a.allocate_sync(1000);
  void* y = a.allocate_sync(2000);
  a.deallocate_sync(x, 1000);  // dead below y
  auto mid = state(a);
  a.deallocate_sync(x, 1000 | bit63);  // a dead record's tag: still a double free
  CHECK(capture.count(vram::misuse::double_free) == 1);
  a.deallocate_sync(y, 2000 | bit63);
  CHECK(capture.count(vram::misuse::wrong_size) == 1);
  CHECK(state(a) == mid);
  a.check_invariants();
  a.deallocate_sync(y, 2000);
  CHECK(a.stats().live_bytes == 0);
  a.check_invariants();
  a.reset();
}

TEST_CASE("activation_arena: live bytes stay exact when a lower chunk is freed out of order", "[activation_arena]") {
  auto a = make_arena(64 * KiB);
  std::vector<void*> ps;
  for (int i = 0; i < 10; ++i) ps.push_back(a.allocate_sync(20 * KiB));  // four chunks: 3 + 3 + 3 + 1
  CHECK(a.chunk_count() == 4);
  CHECK(a.stats().live_bytes == 200 * KiB);
  a.deallocate_sync(ps[2], 20 * KiB);  // chunk 0's top block, freed while chunk 3 is current
  CHECK(a.stats().live_bytes == 180 * KiB);
  a.check_invariants();
  a.deallocate_sync(ps[1], 20 * KiB);
  a.deallocate_sync(ps[4], 20 * KiB);  // out of order in chunk 1: dead below ps[5]
  CHECK(a.stats().live_bytes == 140 * KiB);
  a.check_invariants();
  a.deallocate_sync(ps[9], 20 * KiB);  // chunk 3 empties: step back to chunk 2
  a.deallocate_sync(ps[8], 20 * KiB);
  a.deallocate_sync(ps[7], 20 * KiB);
  a.deallocate_sync(ps[6], 20 * KiB);  // chunk 2 empties: back to chunk 1
  CHECK(a.stats().live_bytes == 60 * KiB);
  a.check_invariants();
  a.deallocate_sync(ps[5], 20 * KiB);  // pops ps[4]'s dead record too: chunk 1 holds ps[3]
  CHECK(a.stats().live_bytes == 40 * KiB);
  void* again = a.allocate_sync(20 * KiB);
  CHECK(again == ps[4]);
  a.deallocate_sync(again, 20 * KiB);
  a.deallocate_sync(ps[3], 20 * KiB);  // chunk 1 empties: back to chunk 0
  CHECK(a.stats().live_bytes == 20 * KiB);
  again = a.allocate_sync(20 * KiB);
  CHECK(again == ps[1]);  // bumped above ps[0] in chunk 0 again
  CHECK(a.stats().live_bytes == 40 * KiB);
  a.check_invariants();
  a.deallocate_sync(again, 20 * KiB);
  a.deallocate_sync(ps[0], 20 * KiB);
  CHECK(a.stats().live_bytes == 0);
  a.check_invariants();
  a.reset();
}

TEST_CASE("activation_arena: mark/rewind and arena_scope", "[activation_arena]") {
  auto a = make_arena(64 * KiB);
  void* keep = a.allocate_sync(4 * KiB);
  auto m = a.mark();
  for (int i = 0; i < 40; ++i) (void)a.allocate_sync(8 * KiB);  // spans several chunks
  CHECK(a.stats().live_allocations == 41);
  a.rewind(m);
  a.check_invariants();
  CHECK(a.stats().live_allocations == 1);
  CHECK(a.stats().live_bytes == 4 * KiB);
  void* next = a.allocate_sync(256);
  CHECK(next == static_cast<char*>(keep) + 4 * KiB);
  a.deallocate_sync(next, 256);
  {
    vram::arena_scope scope(a);
    (void)a.allocate_sync(1000);
    (void)a.allocate_sync(2000);
    CHECK(a.stats().live_allocations == 3);
  }
  CHECK(a.stats().live_allocations == 1);
  a.check_invariants();
  a.reset();
  CHECK_THROWS_AS(a.rewind(m), vram::invalid_argument);  // a mark from before the reset
}

TEST_CASE("activation_arena: reset is a step; a steady loop touches the upstream only in step one",
          "[activation_arena]") {
  auto a = make_arena(4 * MiB);
  // A forward/backward step: 48 layers of varied sizes, freed in reverse, some kept to the end.
  std::vector<std::size_t> sizes;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 48; ++i) sizes.push_back(std::size_t{1} << (10 + rng() % 10));  // 1 KiB .. 512 KiB
  std::size_t after_step0 = 0;
  for (int step = 0; step < 5; ++step) {
    std::vector<void*> ps;
    for (auto s : sizes) ps.push_back(a.allocate(vram::stream_ref{}, s));
    if (step > 0) {
      auto st = a.stats();
      INFO("reserved " << st.reserved_bytes << " live " << st.live_bytes);
      CHECK(a.upstream().counters().allocations == after_step0);  // no new chunk after step 0 and its reset
    }
    for (std::size_t i = sizes.size(); i-- > sizes.size() / 2;) a.deallocate(vram::stream_ref{}, ps[i], sizes[i]);
    a.check_invariants();
    a.reset();  // the other half dies with the step
    a.check_invariants();
    CHECK(a.stats().live_bytes == 0);
    if (step == 0) after_step0 = a.upstream().counters().allocations;
  }
  CHECK(a.upstream().counters().allocations == after_step0);
  CHECK(a.upstream().counters().live_allocations() == a.chunk_count());
  // The activations of a step fill the chunks: reserved/live at the peak stays small.
  auto st = a.stats();
  INFO("reserved " << st.reserved_bytes << " peak live " << st.peak_live_bytes);
  CHECK(static_cast<double>(st.reserved_bytes) / static_cast<double>(st.peak_live_bytes) <= 1.02);
}

TEST_CASE("activation_arena: misuse is reported and changes nothing", "[activation_arena]") {
  vram::test::misuse_capture capture;
  auto a = make_arena(64 * KiB);
  void* p = a.allocate_sync(1000);
  void* q = a.allocate_sync(2000);
  auto before = state(a);

  alignas(256) static char foreign[256];
  a.deallocate_sync(foreign, 256);
  CHECK(capture.count(vram::misuse::foreign_pointer) == 1);
  a.deallocate_sync(static_cast<char*>(p) + 256, 256);  // interior pointer
  CHECK(capture.count(vram::misuse::foreign_pointer) == 2);
  a.deallocate_sync(q, 1999);
  CHECK(capture.count(vram::misuse::wrong_size) == 1);
  CHECK(capture.last().expected_bytes == 2000);
  a.deallocate_sync(p, 999);  // wrong size on the out-of-order path
  CHECK(capture.count(vram::misuse::wrong_size) == 2);
  vram::host_stream other;
  a.deallocate(other, q, 2000);
  CHECK(capture.count(vram::misuse::wrong_stream) == 1);
  CHECK(state(a) == before);
  a.check_invariants();

  a.deallocate_sync(p, 1000);  // out of order: p dead below q
  auto mid = state(a);
  a.deallocate_sync(p, 1000);
  CHECK(capture.count(vram::misuse::double_free) == 1);
  CHECK(state(a) == mid);
  a.deallocate_sync(q, 2000);
  auto after = state(a);
  a.deallocate_sync(q, 2000);  // popped: now in free space
  CHECK(capture.count(vram::misuse::double_free) == 2);
  CHECK(state(a) == after);
  a.check_invariants();
}

TEST_CASE("activation_arena: a pointer from before reset() is use_after_reset", "[activation_arena]") {
  vram::test::misuse_capture capture;
  auto a = make_arena(64 * KiB);
  // Step one uses two chunks, so its reset() re-sizes them into one: pointers of that step are
  // then foreign (their memory went back to the upstream) unless the new chunk reuses them.
  void* p0 = a.allocate_sync(1000);
  (void)a.allocate_sync(70 * KiB);  // its own chunk
  a.reset();
  CHECK(a.chunk_count() == 1);
  auto resized = state(a);
  a.deallocate_sync(p0, 1000);
  CHECK(capture.count() == 1);
  CHECK((capture.count(vram::misuse::foreign_pointer) + capture.count(vram::misuse::use_after_reset)) == 1);
  CHECK(state(a) == resized);
  capture.clear();
  // Step two fits the re-sized chunk and its reset keeps it: its pointers are use_after_reset.
  void* p = a.allocate_sync(1000);
  void* q = a.allocate_sync(70 * KiB);
  CHECK(a.chunk_count() == 1);
  a.reset();
  CHECK(a.chunk_count() == 1);
  auto before = state(a);
  a.deallocate_sync(p, 1000);
  a.deallocate_sync(q, 70 * KiB);
  CHECK(capture.count(vram::misuse::use_after_reset) == 2);
  CHECK(state(a) == before);
  // After the step begins again: an old pointer above the new top is still caught.
  void* r = a.allocate_sync(256);
  CHECK(r == p);  // the address is reused (and would be indistinguishable from p)
  a.deallocate_sync(q, 70 * KiB);
  CHECK(capture.count(vram::misuse::use_after_reset) == 3);
  a.deallocate_sync(r, 256);
  a.check_invariants();
  CHECK(capture.count() == 3);
}

TEST_CASE("activation_arena: a second free of this step's block is double_free, before and after a reset()",
          "[activation_arena]") {
  vram::test::misuse_capture capture;
  auto a = make_arena(64 * KiB);
  for (int step = 0; step < 3; ++step) {  // step 0 in a new chunk; steps 1 and 2 in the chunk kept by reset()
    void* top = a.allocate_sync(1000);
    a.deallocate_sync(top, 1000);
    auto after = state(a);
    a.deallocate_sync(top, 1000);  // popped: above the top, below the step's high-water
    CHECK(capture.count(vram::misuse::double_free) == static_cast<std::size_t>(step + 1));
    CHECK(state(a) == after);
    a.check_invariants();
    a.reset();
  }
  CHECK(a.chunk_count() == 1);
  // Above this step's high-water in a kept chunk: a pointer of an ended step.
  void* low = a.allocate_sync(256);
  void* high = a.allocate_sync(4 * KiB);
  a.deallocate_sync(high, 4 * KiB);
  a.deallocate_sync(low, 256);
  a.reset();
  (void)a.allocate_sync(256);
  a.deallocate_sync(high, 4 * KiB);
  CHECK(capture.count(vram::misuse::use_after_reset) == 1);
  CHECK(capture.count() == 4);
  a.reset();
  a.check_invariants();
}

TEST_CASE("activation_arena: bound to one stream", "[activation_arena]") {
  vram::host_stream bound, other;
  auto a = make_arena(64 * KiB, bound);
  CHECK(a.stream() == vram::stream_ref(bound));
  CHECK_THROWS_AS(a.allocate(other, 256), vram::invalid_argument);
  CHECK(a.upstream().counters().allocations == 0);  // a failed request leaves the upstream untouched
  // Work on the bound stream writes and checks patterns; frees and reuse follow stream order.
  std::atomic<int> bad{0};
  for (int step = 0; step < 20; ++step) {
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (int i = 0; i < 8; ++i) {
      std::size_t bytes = 1000 + static_cast<std::size_t>(i) * 777;
      void* p = a.allocate(bound, bytes);
      auto pattern = static_cast<unsigned char>(step * 8 + i);
      bound.enqueue([p, bytes, pattern] { std::memset(p, pattern, bytes); });
      blocks.emplace_back(p, bytes);
    }
    for (int i = 7; i >= 0; --i) {
      auto [p, bytes] = blocks[static_cast<std::size_t>(i)];
      auto pattern = static_cast<unsigned char>(step * 8 + i);
      bound.enqueue([p, bytes, pattern, &bad] {
        auto* c = static_cast<unsigned char*>(p);
        if (c[0] != pattern || c[bytes - 1] != pattern) ++bad;
      });
      a.deallocate(bound, p, bytes);
    }
    a.reset();
  }
  // Another stream may use arena memory once the arena's stream waits for it.
  void* shared = a.allocate(bound, 4096);
  vram::event ready, done;
  ready.record(bound);  // the block is ours once the bound stream's earlier work is done
  ready.make_wait(other);
  other.enqueue([shared] { std::memset(shared, 7, 4096); });
  done.record(other);  // and the arena may take it back once the other stream is done with it
  done.make_wait(bound);
  a.deallocate(bound, shared, 4096);
  bound.synchronize();
  CHECK(bad == 0);
  CHECK(a.upstream().counters().allocations == 1);
}

TEST_CASE("activation_arena: upstream out of memory is typed and changes nothing", "[activation_arena]") {
  vram::simulated_device_source device(
      vram::simulated_device_options{.capacity = 4 * MiB, .granularity = 64 * KiB});
  vram::activation_arena<vram::simulated_device_source> a(device, {}, {.chunk_bytes = 1 * MiB});
  void* p = a.allocate_sync(512 * KiB);
  auto before = a.stats();
  try {
    (void)a.allocate_sync(8 * MiB);
    FAIL("expected out_of_memory");
  } catch (const vram::out_of_memory& e) {
    CHECK(e.bytes() == 8 * MiB);
    CHECK(std::string(e.resource()) == "activation_arena");
  }
  auto after = a.stats();
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.ooms == 1);
  CHECK(a.chunk_count() == 1);
  a.check_invariants();
  a.deallocate_sync(p, 512 * KiB);
  CHECK(a.release() == 1 * MiB);
  CHECK(device.stats().reserved_bytes == 0);
}

TEST_CASE("activation_arena: random operations agree with a reference model", "[activation_arena][property]") {
  std::mt19937_64 rng(GENERATE(1u, 2u, 3u, 4u));
  auto a = make_arena(32 * KiB);
  struct live_block {
    std::size_t bytes;
    unsigned char pattern;
  };
  std::map<char*, live_block> model;  // what must be live, by address
  std::vector<char*> order;           // allocation order (to free mostly in reverse)
  // The model's own totals: footprints (requests rounded to default_alignment) and requests,
  // and their maxima over the run (peaks survive reset()).
  std::size_t live = 0, requested = 0, peak_live = 0, peak_requested = 0;
  auto add = [&](std::size_t bytes, int sign) {
    live += sign * vram::align_up(bytes, vram::default_alignment);
    requested += sign * bytes;
    peak_live = std::max(peak_live, live);
    peak_requested = std::max(peak_requested, requested);
  };
  for (int op = 0; op < 3000; ++op) {
    auto roll = rng() % 100;
    if (roll < 50 || order.empty()) {
      std::size_t bytes = 1 + rng() % (roll < 5 ? 100 * KiB : 6 * KiB);
      std::size_t align = roll % 7 == 0 ? 1024 : vram::default_alignment;
      auto* p = static_cast<char*>(a.allocate_sync(bytes, align));
      REQUIRE(vram::is_aligned(p, align));
      auto it = model.lower_bound(p);
      if (it != model.end()) REQUIRE(p + bytes <= it->first);
      if (it != model.begin()) REQUIRE(std::prev(it)->first + std::prev(it)->second.bytes <= p);
      auto pattern = static_cast<unsigned char>(rng());
      std::memset(p, pattern, bytes);
      model.emplace(p, live_block{bytes, pattern});
      order.push_back(p);
      add(bytes, +1);
    } else if (roll < 95) {
      // 80% LIFO, otherwise a random live block.
      std::size_t i = rng() % 5 != 0 ? order.size() - 1 : rng() % order.size();
      char* p = order[i];
      auto b = model.at(p);
      REQUIRE(static_cast<unsigned char>(p[0]) == b.pattern);
      REQUIRE(static_cast<unsigned char>(p[b.bytes - 1]) == b.pattern);
      a.deallocate_sync(p, b.bytes);
      model.erase(p);
      order.erase(order.begin() + static_cast<std::ptrdiff_t>(i));
      add(b.bytes, -1);
    } else if (roll < 98) {
      auto m = a.mark();
      std::size_t n = order.size();
      for (int k = 0; k < 5; ++k) {
        std::size_t bytes = 1 + rng() % (4 * KiB);
        auto* p = static_cast<char*>(a.allocate_sync(bytes));
        order.push_back(p);
        model.emplace(p, live_block{bytes, 0});
        add(bytes, +1);
      }
      a.rewind(m);
      for (std::size_t k = n; k < order.size(); ++k) {
        add(model.at(order[k]).bytes, -1);
        model.erase(order[k]);
      }
      order.resize(n);
    } else if (roll == 98) {
      a.release();  // gives back the spare chunks above the current one; nothing live changes
    } else {
      a.reset();
      model.clear();
      order.clear();
      live = requested = 0;
    }
    a.check_invariants();
    auto s = a.stats();
    REQUIRE(s.live_allocations == model.size());
    REQUIRE(s.live_bytes == live);
    REQUIRE(s.requested_bytes == requested);
    REQUIRE(s.peak_live_bytes == peak_live);
    REQUIRE(s.peak_requested_bytes == peak_requested);
    for (auto* p : order) REQUIRE(a.owns(p));
  }
  a.reset();
}

TEST_CASE("activation_arena: peaks are exact though the hot path defers them", "[activation_arena]") {
  auto a = make_arena(8 * MiB);
  vram::stream_ref s{};
  void* x = a.allocate(s, 1 * MiB);
  void* y = a.allocate(s, 2 * MiB + 100);
  CHECK(a.stats().peak_live_bytes == 3 * MiB + 256);  // read while rising
  CHECK(a.stats().peak_requested_bytes == 3 * MiB + 100);
  a.check_invariants();
  a.deallocate(s, y, 2 * MiB + 100);  // the turn: the peak is kept
  void* z = a.allocate(s, 512 * KiB);
  CHECK(a.stats().peak_live_bytes == 3 * MiB + 256);
  CHECK(a.stats().live_bytes == 1 * MiB + 512 * KiB);
  a.check_invariants();
  void* w = a.allocate(s, 2 * MiB);  // a new peak after the turn
  CHECK(a.stats().peak_live_bytes == 3 * MiB + 512 * KiB);
  a.deallocate(s, w, 2 * MiB);
  a.deallocate(s, z, 512 * KiB);
  a.deallocate(s, x, 1 * MiB);
  a.reset();
  CHECK(a.stats().peak_live_bytes == 3 * MiB + 512 * KiB);
  CHECK(a.stats().peak_requested_bytes == 3 * MiB + 512 * KiB);
  void* v = a.allocate(s, 5 * MiB);  // the next step's larger peak, then a reset while rising
  a.reset();
  (void)v;
  CHECK(a.stats().peak_live_bytes == 5 * MiB);
  CHECK(a.stats().live_bytes == 0);
  a.check_invariants();
}

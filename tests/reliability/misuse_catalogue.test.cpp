// The misuse catalogue: one TEST_CASE per row of docs/errors.md. Each proves what vram does
// about that misuse, for every resource kind the row covers, and that the resource is
// exactly as it was afterwards (stats, invariants, and it still works).

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include <vram/core/error.hpp>
#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>

#include "support/fixtures.hpp"
#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"

namespace {

using vram::misuse;
using fixtures = vram::test::host_fixtures;
using recorded_host = vram::test::recording_resource<vram::host_source>;

template <class R>
std::vector<std::size_t> snapshot(const R& r) {
  if constexpr (vram::has_stats<R>) {
    auto s = r.stats();
    return {s.live_bytes, s.requested_bytes, s.reserved_bytes, s.live_allocations, s.total_allocations,
            s.total_deallocations, s.free_blocks, s.upstream_allocations};
  } else {
    return {};
  }
}

template <class R>
void check(const R& r) {
  if constexpr (vram::has_check_invariants<R>) r.check_invariants();
}

/// Every report since `capture` was cleared is one of `kinds`, and there is at least one.
bool reported_as(std::initializer_list<misuse> kinds) {
  std::size_t matching = 0;
  for (misuse k : kinds) matching += vram::test::misuse_capture::count(k);
  return vram::test::misuse_capture::count() >= 1 && matching == vram::test::misuse_capture::count();
}

/// The resource still serves and frees a request.
template <class R>
void still_works(R& r) {
  void* p = r.allocate_sync(3000);
  REQUIRE(p != nullptr);
  r.deallocate_sync(p, 3000);
  check(r);
}

}  // namespace

// ---- row: double free ----------------------------------------------------------------------
TEMPLATE_LIST_TEST_CASE("errors.md: double free is reported and changes nothing", "[misuse]", fixtures) {
  vram::test::misuse_capture capture;
  auto r = TestType::make();
  void* keep = r.allocate_sync(512);
  void* p = r.allocate_sync(1000);
  r.deallocate_sync(p, 1000);
  auto before = snapshot(r);
  r.deallocate_sync(p, 1000);
  CHECK(reported_as({misuse::double_free, misuse::foreign_pointer}));
  CHECK(capture.last().pointer == p);
  CHECK(snapshot(r) == before);
  check(r);
  still_works(r);
  r.deallocate_sync(keep, 512);
}

// ---- row: foreign pointer ------------------------------------------------------------------
TEMPLATE_LIST_TEST_CASE("errors.md: a foreign pointer is reported and changes nothing", "[misuse]", fixtures) {
  vram::test::misuse_capture capture;
  auto r = TestType::make();
  auto other = TestType::make();  // another resource of the same kind: its pointer is foreign here
  void* keep = r.allocate_sync(512);
  void* theirs = other.allocate_sync(1000);
  auto before = snapshot(r);
  r.deallocate_sync(theirs, 1000);
  alignas(256) static char on_host[1024];
  r.deallocate_sync(on_host, 1024);
  CHECK(reported_as({misuse::foreign_pointer}));
  CHECK(capture.count() == 2);
  CHECK(snapshot(r) == before);
  check(r);
  still_works(r);
  r.deallocate_sync(keep, 512);
  other.deallocate_sync(theirs, 1000);
}

// ---- row: wrong size -----------------------------------------------------------------------
TEMPLATE_LIST_TEST_CASE("errors.md: a wrong size on free is reported and changes nothing", "[misuse]", fixtures) {
  vram::test::misuse_capture capture;
  auto r = TestType::make();
  void* p = r.allocate_sync(1000);
  auto before = snapshot(r);
  r.deallocate_sync(p, 5000);  // another size class too, for budget_slab's per-class check
  CHECK(reported_as({misuse::wrong_size}));
  CHECK(capture.last().bytes == 5000);
  CHECK(snapshot(r) == before);
  check(r);
  r.deallocate_sync(p, 1000);  // the right size still frees it
  CHECK(capture.count() == 1);
  still_works(r);
}

// ---- row: wrong stream without an event ----------------------------------------------------
TEST_CASE("errors.md: wrong stream — an arena refuses and reports another stream", "[misuse]") {
  vram::test::misuse_capture capture;
  vram::host_stream mine, other;
  vram::activation_arena<vram::host_source> arena(vram::host_source{}, mine, {.chunk_bytes = 1 << 20});
  void* p = arena.allocate(mine, 1000);
  auto before = snapshot(arena);
  CHECK_THROWS_AS(arena.allocate(other, 1000), vram::invalid_argument);
  arena.deallocate(other, p, 1000);
  CHECK(reported_as({misuse::wrong_stream}));
  CHECK(snapshot(arena) == before);
  // The documented way: make the arena's stream wait on an event of the other stream.
  vram::event e;
  e.record(other);
  e.make_wait(mine);
  arena.deallocate(mine, p, 1000);
  CHECK(arena.stats().live_bytes == 0);
  mine.synchronize();
}

TEST_CASE("errors.md: wrong stream — a stream_pool never hands a block to another stream before its work ran",
          "[misuse]") {
  // A pool cannot see which stream will touch a block next; what it guarantees is the other
  // half: a block freed on S goes to T only after T waited on S's work. A slow task on S
  // that writes the block after it was freed would be overwritten by T's task if it did not.
  vram::stream_pool<vram::host_source> pool(vram::host_source{}, {.growth_step = 1 << 20});
  vram::host_stream s, t;
  const std::size_t bytes = 4096;
  auto* p = static_cast<unsigned char*>(pool.allocate(s, bytes));
  std::atomic<bool> overwritten{false};
  s.enqueue([p, bytes] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::fill(p, p + bytes, 0x11);
  });
  pool.deallocate(s, p, bytes);
  auto* q = static_cast<unsigned char*>(pool.allocate(t, bytes));
  t.enqueue([q, bytes, &overwritten] {
    std::fill(q, q + bytes, 0x22);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    overwritten = std::any_of(q, q + bytes, [](unsigned char c) { return c != 0x22; });
  });
  t.synchronize();
  s.synchronize();
  CHECK_FALSE(overwritten.load());
  pool.deallocate(t, q, bytes);
  t.synchronize();
}

// ---- row: using an arena after reset -------------------------------------------------------
TEST_CASE("errors.md: using an arena after reset is reported (free) or refused (rewind)", "[misuse]") {
  vram::test::misuse_capture capture;
  vram::activation_arena<vram::host_source> arena(vram::host_source{}, vram::stream_ref{}, {.chunk_bytes = 1 << 20});
  void* a = arena.allocate_sync(1000);
  auto m = arena.mark();
  void* b = arena.allocate_sync(2000);
  (void)b;
  arena.reset();
  void* fresh = arena.allocate_sync(300);  // the next step: reuses the chunk from its base
  CHECK(fresh == a);                        // (so a's address is live again: indistinguishable)
  auto before = snapshot(arena);
  arena.deallocate_sync(b, 2000);  // b's address belongs to the ended step only
  CHECK(reported_as({misuse::use_after_reset}));
  CHECK(snapshot(arena) == before);
  CHECK_THROWS_AS(arena.rewind(m), vram::invalid_argument);
  CHECK(snapshot(arena) == before);
  check(arena);
  arena.deallocate_sync(fresh, 300);
  still_works(arena);
}

// ---- row: exceeding a quota ----------------------------------------------------------------
TEST_CASE("errors.md: exceeding a hard quota throws quota_exceeded before the upstream is touched", "[misuse]") {
  auto registry = std::make_shared<vram::tenant_registry>();
  vram::tenant job = registry->create("job");
  vram::tenant model = registry->create("model", &job);
  recorded_host upstream;
  vram::quota_adaptor<recorded_host> q(upstream, registry);
  q.set_hard_limit(job, 10000);
  void* p = q.allocate(vram::stream_ref{}, 6000, vram::default_alignment, model);
  std::size_t calls = upstream.counters().allocations;
  try {
    (void)q.allocate(vram::stream_ref{}, 6000, vram::default_alignment, model);
    FAIL("expected quota_exceeded");
  } catch (const vram::quota_exceeded& e) {
    CHECK(e.bytes() == 6000);
    CHECK(e.limit() == 10000);
    CHECK(e.usage() == 6000);
    CHECK(e.limited_tenant().id == job.id);
    CHECK(e.requester().id == model.id);
  }
  CHECK(upstream.counters().allocations == calls);  // refused before the upstream
  CHECK(q.usage(job) == 6000);
  CHECK(q.usage(model) == 6000);
  CHECK(q.refusals(job) == 1);
  check(q);
  // It is an out_of_memory too, so retry adaptors and generic handlers see it.
  CHECK_THROWS_AS(q.allocate(vram::stream_ref{}, 6000, vram::default_alignment, model), vram::out_of_memory);
  q.deallocate(vram::stream_ref{}, p, 6000);
  q.deallocate(vram::stream_ref{}, q.allocate(vram::stream_ref{}, 10000, vram::default_alignment, model), 10000);
  CHECK(upstream.counters().live_allocations() == 0);
}

// ---- row: destroying a resource with live allocations --------------------------------------
TEST_CASE("errors.md: destroying an allocator with live allocations reports it and returns all memory",
          "[misuse]") {
  vram::test::misuse_capture capture;
  recorded_host upstream;
  {
    vram::stream_pool<recorded_host> pool(upstream, {.growth_step = 1 << 20});
    (void)pool.allocate_sync(1000);
    (void)pool.allocate_sync(1 << 21);
  }
  CHECK(capture.count(misuse::live_at_destruction) == 1);
  CHECK(capture.last().resource == std::string("stream_pool"));
  {
    vram::activation_arena<recorded_host> arena(upstream, vram::stream_ref{}, {.chunk_bytes = 1 << 20});
    (void)arena.allocate_sync(1000);
  }
  CHECK(capture.count(misuse::live_at_destruction) == 2);
  {
    vram::budget_slab<recorded_host, recorded_host> slab(upstream, upstream, {.device_budget = 1 << 20});
    (void)slab.allocate_sync(1000);
    (void)slab.allocate_sync(2 << 20);  // spilled
  }
  CHECK(capture.count(misuse::live_at_destruction) == 3);
  CHECK(capture.count() == 3);
  // Every chunk, the reservation and the spilled block went back: nothing leaks.
  CHECK(upstream.counters().live_allocations() == 0);
  CHECK(upstream.counters().live_bytes == 0);
}

TEST_CASE("errors.md: destroying an adaptor with live allocations leaves them to the upstream", "[misuse]") {
  // Adaptors own no memory: the blocks stay valid in (and are freed through) the upstream.
  vram::test::misuse_capture capture;
  recorded_host upstream;
  void* p;
  {
    vram::statistics_adaptor<recorded_host> stats(upstream);
    p = stats.allocate_sync(1000);
  }
  CHECK(capture.count() == 0);
  CHECK(upstream.counters().live_allocations() == 1);
  upstream.deallocate_sync(p, 1000);
  CHECK(upstream.counters().live_allocations() == 0);
}

// ---- row: bad alignment --------------------------------------------------------------------
TEMPLATE_LIST_TEST_CASE("errors.md: a bad alignment is invalid_argument and changes nothing", "[misuse]", fixtures) {
  auto r = TestType::make();
  void* keep = r.allocate_sync(512);
  auto before = snapshot(r);
  CHECK_THROWS_AS(r.allocate_sync(1000, 3), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate_sync(1000, 0), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate_sync(1000, vram::max_alignment * 2), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate(vram::stream_ref{}, 1000, 384), vram::invalid_argument);
  CHECK(snapshot(r) == before);
  check(r);
  r.deallocate_sync(keep, 512);
}

// ---- row: absurd size ----------------------------------------------------------------------
TEMPLATE_LIST_TEST_CASE("errors.md: an absurd size is invalid_argument and changes nothing", "[misuse]", fixtures) {
  auto r = TestType::make();
  auto before = snapshot(r);
  CHECK_THROWS_AS(r.allocate_sync(vram::max_request_bytes + 1), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate_sync(~std::size_t{0}), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate_sync(~std::size_t{0} - 255), vram::invalid_argument);  // would wrap when rounded
  CHECK(snapshot(r) == before);
  check(r);
  still_works(r);
}

// ---- row: zero bytes -----------------------------------------------------------------------
TEMPLATE_LIST_TEST_CASE("errors.md: zero bytes gives nullptr; freeing nullptr does nothing", "[misuse]", fixtures) {
  vram::test::misuse_capture capture;
  auto r = TestType::make();
  auto before = snapshot(r);
  CHECK(r.allocate_sync(0) == nullptr);
  CHECK(r.allocate(vram::stream_ref{}, 0, 256) == nullptr);
  r.deallocate_sync(nullptr, 0);
  r.deallocate_sync(nullptr, 1000);
  r.deallocate(vram::stream_ref{}, nullptr, 1000);
  CHECK(snapshot(r) == before);
  CHECK(capture.count() == 0);
  check(r);
}

TEST_CASE("errors.md: zero bytes never reaches the upstream", "[misuse]") {
  recorded_host upstream;
  {
    vram::stream_pool<recorded_host> pool(upstream);
    vram::activation_arena<recorded_host> arena(upstream);
    vram::quota_adaptor<recorded_host> quota(upstream, std::make_shared<vram::tenant_registry>());
    vram::statistics_adaptor<recorded_host> stats(upstream);
    CHECK(pool.allocate_sync(0) == nullptr);
    CHECK(arena.allocate_sync(0) == nullptr);
    CHECK(quota.allocate_sync(0) == nullptr);
    CHECK(stats.allocate_sync(0) == nullptr);
  }
  CHECK(upstream.counters().allocations == 0);
}

// ---- row: out of memory --------------------------------------------------------------------
TEMPLATE_LIST_TEST_CASE("errors.md: out of memory is vram::out_of_memory with the numbers, nothing changed",
                        "[misuse]", fixtures) {
  auto r = TestType::make();
  void* keep = r.allocate_sync(512);
  auto before = snapshot(r);
  const std::size_t huge = std::size_t{1} << 52;  // valid, but no machine has 4 PiB
  try {
    (void)r.allocate_sync(huge);
    FAIL("expected out_of_memory");
  } catch (const vram::out_of_memory& e) {
    CHECK(e.bytes() == huge);
    CHECK(std::string(e.what()).find("out of memory") != std::string::npos);
  }
  CHECK(snapshot(r) == before);
  check(r);
  still_works(r);
  r.deallocate_sync(keep, 512);
}

// ---- fixed defects (docs/errors.md), kept as regression tests --------------------------------
TEST_CASE("errors.md: statistics_adaptor keeps its counters on a wrong-size free", "[misuse]") {
  vram::test::misuse_capture capture;
  vram::statistics_adaptor<vram::host_source> stats(vram::host_source{});
  void* p = stats.allocate_sync(1000);
  auto before = snapshot(stats);
  stats.deallocate_sync(p, 5000);  // host_source reports it and keeps the block ...
  CHECK(reported_as({misuse::wrong_size}));
  CHECK(snapshot(stats) == before);  // ... so the adaptor's counters must not move either
  stats.deallocate_sync(p, 1000);
}

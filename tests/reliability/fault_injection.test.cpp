// Fault injection across every allocator and adaptor: a fixed workload is run with one
// upstream failure placed at each upstream call of a clean run (N = 1 .. calls), and each
// run checks that
//   - the failure surfaces as the documented typed error (vram::out_of_memory), nothing else;
//   - check_invariants() holds after the fault, and stats say nothing is live after cleanup;
//   - nothing is reported as misuse (the allocator's own clean-up frees what it took, exactly);
//   - the allocator keeps working once the fault clears (the whole workload runs again);
//   - the recording upstream balances after destruction (nothing leaked).

#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <streambuf>
#include <vector>

#include <vram/adaptor/logging_adaptor.hpp>
#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/retry_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/adaptor/fault_injection_adaptor.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"

namespace {

using recorded_host = vram::test::recording_resource<vram::host_source>;
using faulty_host = vram::fault_injection_adaptor<recorded_host>;
using recorded_device = vram::test::recording_resource<vram::simulated_device_source>;
using faulty_device = vram::fault_injection_adaptor<recorded_device>;

struct live_block {
  void* p;
  std::size_t bytes;
};

/// The workload: sizes from tiny to larger than any chunk, frees out of order, a release()
/// in the middle, more allocations, then everything freed. `live` holds what is live when an
/// exception leaves it, so the caller can clean up.
template <class A>
void workload(A& a, std::vector<live_block>& live, bool writable) {
  constexpr std::size_t sizes[] = {256, 1000, 70000, 3000, 200000, 512, std::size_t{3} << 20, 40, 9000, 65536};
  auto take = [&](std::size_t bytes) {
    void* p = a.allocate_sync(bytes, vram::default_alignment);
    REQUIRE(p != nullptr);
    if (writable) std::memset(p, 0x5a, bytes);
    live.push_back({p, bytes});
  };
  for (std::size_t b : sizes) take(b);
  // Free every other block, from the top down (the arena's friendliest non-LIFO order).
  for (std::size_t i = live.size(); i-- > 0;)
    if (i % 2 == 1) {
      a.deallocate_sync(live[i].p, live[i].bytes, vram::default_alignment);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
  if constexpr (vram::has_release<A>) a.release();
  for (std::size_t b : sizes) take(b * 2 + 256);
  while (!live.empty()) {
    a.deallocate_sync(live.back().p, live.back().bytes, vram::default_alignment);
    live.pop_back();
  }
}

template <class A>
void check(const A& a) {
  if constexpr (vram::has_check_invariants<A>) a.check_invariants();
}

template <class A>
void check_empty(const A& a) {
  check(a);
  if constexpr (vram::has_stats<A>) {
    CHECK(a.stats().live_bytes == 0);
    CHECK(a.stats().live_allocations == 0);
  }
}

/// Runs the sweep. `make(faulty)` builds the allocator under test over a fault-injection adaptor (it
/// may itself fail: a constructor that takes memory is a failure point too).
/// The recording upstream balances: every byte taken was given back. (A pool over a
/// contiguous source may free a range in other pieces than it took it, so calls need not
/// pair up; there the device itself must hold nothing.)
template <class Faulty>
bool balanced(Faulty f) {  // a copy shares the source's state
  auto& recorder = f.upstream();
  if (recorder.counters().live_bytes != 0) return false;
  if constexpr (vram::has_contiguous_growth<Faulty>)
    return recorder.inner().stats().reserved_bytes == 0;
  else
    return recorder.counters().live_allocations() == 0;
}

/// Returns how many of the placed faults escaped as an error (the others were absorbed).
template <class Faulty, class Make>
std::size_t fault_sweep(Faulty base, Make make, bool writable) {
  vram::test::misuse_capture misuse;

  // The clean run: how many upstream allocation calls are there to fail?
  std::size_t calls;
  {
    Faulty f = base;
    std::size_t before = f.allocations();
    auto a = make(f);
    std::vector<live_block> live;
    workload(*a, live, writable);
    check_empty(*a);
    calls = f.allocations() - before;
  }
  REQUIRE(calls > 0);
  REQUIRE(balanced(base));
  REQUIRE(misuse.count() == 0);

  std::size_t escaped = 0;
  for (std::size_t n = 1; n <= calls; ++n) {
    INFO("fault at upstream call " << n << " of " << calls);
    Faulty f = base;
    f.set_plan({.fail_call = n});
    std::size_t failures = f.failures();
    bool failed = false;
    {
      std::unique_ptr<std::remove_reference_t<decltype(*make(f))>> a;
      try {
        a = make(f);
      } catch (const vram::out_of_memory&) {
        failed = true;  // the constructor took memory and failed cleanly
      }
      if (a) {
        std::vector<live_block> live;
        try {
          workload(*a, live, writable);
        } catch (const vram::out_of_memory& e) {
          failed = true;
          CHECK(e.bytes() > 0);
        }
        check(*a);
        for (auto& b : live) a->deallocate_sync(b.p, b.bytes, vram::default_alignment);
        live.clear();
        check_empty(*a);
        // The fault has cleared (it was the Nth call only): everything works again.
        f.clear();
        workload(*a, live, writable);
        check_empty(*a);
      }
    }
    CHECK(f.failures() == failures + 1);
    // A fault may be absorbed (a retry, a spill, a cache): then there was no error to see.
    escaped += failed;
    CHECK(balanced(base));
    CHECK(misuse.count() == 0);
  }
  return escaped;
}

std::ostream& null_sink() {
  struct null_buffer : std::streambuf {
    int overflow(int c) override { return c; }
  };
  static null_buffer buffer;
  static std::ostream sink(&buffer);
  return sink;
}

}  // namespace

TEST_CASE("fault_injection_adaptor: fails the Nth call, sticky, with a probability, past a byte budget", "[reliability]") {
  faulty_host f(recorded_host{});
  f.set_plan({.fail_call = 2});
  void* a = f.allocate_sync(100);
  CHECK_THROWS_AS(f.allocate_sync(100), vram::out_of_memory);
  void* b = f.allocate_sync(100);
  CHECK(f.allocations() == 3);
  CHECK(f.failures() == 1);
  CHECK(f.live_bytes() == 200);
  CHECK(f.allocate_sync(0) == nullptr);  // zero bytes is not a call
  CHECK(f.allocations() == 3);
  CHECK_THROWS_AS(f.allocate_sync(8, 3), vram::invalid_argument);  // forwarded: the upstream decides
  f.deallocate_sync(a, 100);
  f.deallocate_sync(b, 100);

  f.set_plan({.fail_call = 1, .sticky = true});
  for (int i = 0; i < 5; ++i) CHECK_THROWS_AS(f.allocate_sync(64), vram::out_of_memory);
  f.clear();
  f.deallocate_sync(f.allocate_sync(64), 64);

  f.set_plan({.byte_budget = 1000});
  void* c = f.allocate_sync(600);
  try {
    (void)f.allocate_sync(600);
    FAIL("byte budget not enforced");
  } catch (const vram::out_of_memory& e) {
    CHECK(e.bytes() == 600);
    CHECK(std::string(e.resource()) == "fault_injection_adaptor");
  }
  void* d = f.allocate_sync(400);
  f.deallocate_sync(c, 600);
  f.deallocate_sync(d, 400);
  CHECK(f.live_bytes() == 0);

  // Probability: deterministic from the seed, and roughly the rate asked for.
  auto failures_of = [&](std::uint64_t seed) {
    f.set_plan({.probability = 0.25, .seed = seed});
    std::vector<bool> pattern;
    for (int i = 0; i < 400; ++i) {
      try {
        f.deallocate_sync(f.allocate_sync(32), 32);
        pattern.push_back(false);
      } catch (const vram::out_of_memory&) {
        pattern.push_back(true);
      }
    }
    return pattern;
  };
  auto p1 = failures_of(7), p2 = failures_of(7), p3 = failures_of(8);
  CHECK(p1 == p2);
  CHECK(p1 != p3);
  auto n = std::count(p1.begin(), p1.end(), true);
  CHECK(n > 60);
  CHECK(n < 140);
  CHECK(f.upstream().counters().live_allocations() == 0);
}

TEST_CASE("fault_injection_adaptor: forwards properties and contiguous growth", "[reliability]") {
  STATIC_REQUIRE(vram::has_property<faulty_host, vram::host_accessible>);
  STATIC_REQUIRE(vram::has_property<faulty_device, vram::device_accessible>);
  STATIC_REQUIRE(!vram::has_property<faulty_device, vram::host_accessible>);
  STATIC_REQUIRE(vram::has_contiguous_growth<faulty_device>);
  STATIC_REQUIRE(!vram::has_contiguous_growth<faulty_host>);
  faulty_device f(recorded_device(vram::simulated_device_source(
      vram::simulated_device_options{.capacity = std::size_t{64} << 20, .granularity = 4096, .contiguous = true})));
  CHECK(f.contiguous());
  CHECK(f.granularity() == 4096);
}

TEST_CASE("fault_injection_adaptor: over a contiguous upstream, frees of merged or partial ranges are un-charged",
          "[reliability]") {
  vram::test::misuse_capture capture;
  constexpr std::size_t MiB = std::size_t{1} << 20;
  faulty_device f(recorded_device(vram::simulated_device_source(
                      vram::simulated_device_options{.capacity = 64 * MiB, .granularity = 2 * MiB, .contiguous = true})),
                  {.byte_budget = 16 * MiB});
  auto* a = static_cast<char*>(f.allocate_sync(2 * MiB));
  auto* b = static_cast<char*>(f.allocate_sync(2 * MiB));
  auto* c = static_cast<char*>(f.allocate_sync(6 * MiB));
  REQUIRE((b == a + 2 * MiB && c == b + 2 * MiB));  // the simulated device hands out adjacent ranges
  CHECK(f.live_bytes() == 10 * MiB);
  f.deallocate_sync(c + 4 * MiB, 4 * MiB);  // runs past the end of c: not all live, no count changes
  CHECK(f.live_bytes() == 10 * MiB);
  f.deallocate_sync(a, 2 * MiB);            // one range, exactly
  CHECK(f.live_bytes() == 8 * MiB);
  f.deallocate_sync(c + 2 * MiB, 2 * MiB);  // the middle of c: c keeps a head and a tail
  CHECK(f.live_bytes() == 6 * MiB);
  f.deallocate_sync(a, 2 * MiB);            // a second free: not live here
  CHECK(f.live_bytes() == 6 * MiB);
  f.deallocate_sync(b, 4 * MiB);            // b and c's head, across two ranges
  CHECK(f.live_bytes() == 2 * MiB);
  f.deallocate_sync(c + 4 * MiB, 2 * MiB);  // c's tail
  CHECK(f.live_bytes() == 0);
  CHECK(f.upstream().inner().stats().reserved_bytes == 0);  // the device agrees
  CHECK(capture.count() == 2);  // reported by the device: the overrun and the second free
}

namespace {
/// Host memory whose free first runs a hook, while it still holds the block (a slow free).
struct hooked_free_source {
  vram::host_source host;
  std::shared_ptr<std::function<void()>> during_free = std::make_shared<std::function<void()>>();
  void* allocate_sync(std::size_t b, std::size_t a = vram::default_alignment) { return host.allocate_sync(b, a); }
  void deallocate_sync(void* p, std::size_t b, std::size_t a = vram::default_alignment) noexcept {
    if (*during_free) (*during_free)();
    host.deallocate_sync(p, b, a);
  }
  void* allocate(vram::stream_ref, std::size_t b, std::size_t a = vram::default_alignment) { return allocate_sync(b, a); }
  void deallocate(vram::stream_ref, void* p, std::size_t b, std::size_t a = vram::default_alignment) noexcept {
    deallocate_sync(p, b, a);
  }
  friend bool operator==(const hooked_free_source& x, const hooked_free_source& y) noexcept {
    return x.during_free == y.during_free;
  }
};
}  // namespace

TEST_CASE("fault_injection_adaptor: the byte budget holds while the upstream is still freeing", "[reliability]") {
  vram::fault_injection_adaptor<hooked_free_source> f(hooked_free_source{}, {.byte_budget = 1000});
  void* a = f.allocate_sync(1000);
  bool refused = false;
  *f.upstream().during_free = [&] {  // a's bytes are still in the upstream: no room yet
    try {
      f.deallocate_sync(f.allocate_sync(1000), 1000);
    } catch (const vram::out_of_memory&) {
      refused = true;
    }
  };
  f.deallocate_sync(a, 1000);
  CHECK(refused);
  *f.upstream().during_free = nullptr;
  CHECK(f.live_bytes() == 0);
  f.deallocate_sync(f.allocate_sync(1000), 1000);  // once back: the budget is free
  CHECK(f.live_bytes() == 0);
}

TEST_CASE("fault_injection_adaptor: a pool's release over a contiguous upstream gives its byte budget back", "[reliability]") {
  vram::test::misuse_capture capture;
  constexpr std::size_t MiB = std::size_t{1} << 20;
  faulty_device f(recorded_device(vram::simulated_device_source(
                      vram::simulated_device_options{.capacity = 64 * MiB, .granularity = 2 * MiB, .contiguous = true})),
                  {.byte_budget = 8 * MiB});
  vram::stream_pool<faulty_device> pool(f);
  for (int round = 0; round < 4; ++round) {
    void* x = pool.allocate_sync(1 * MiB);
    void* y = pool.allocate_sync(3 * MiB);  // grows in place: one chunk of two upstream ranges
    pool.deallocate_sync(x, 1 * MiB);
    pool.deallocate_sync(y, 3 * MiB);
    CHECK(pool.release() == 4 * MiB);
    CHECK(f.live_bytes() == 0);
    CHECK(f.upstream().counters().live_bytes == 0);
    pool.check_invariants();
  }
  CHECK(f.failures() == 0);
  CHECK(capture.count() == 0);
}

TEST_CASE("fault sweep: stream_pool over host memory", "[reliability][fault]") {
  // initial_size: a fault may also hit the constructor's first growth.
  fault_sweep(faulty_host(recorded_host{}), [](faulty_host f) {
    return std::make_unique<vram::stream_pool<faulty_host>>(
        f, vram::stream_pool_options{.initial_size = std::size_t{1} << 20, .growth_step = std::size_t{1} << 20});
  }, true);
}

TEST_CASE("fault sweep: stream_pool whose constructor's initial growth fails leaks nothing", "[reliability][fault]") {
  // Regression: a throwing first growth used to leak the block it had prepared (72 bytes), as
  // a constructor that throws never runs the destructor; LeakSanitizer (ASan in CI) checks it.
  faulty_host f(recorded_host{}, {.fail_call = 1});
  CHECK_THROWS_AS(vram::stream_pool<faulty_host>(f, {.initial_size = std::size_t{1} << 20}), vram::out_of_memory);
  CHECK(f.upstream().counters().live_allocations() == 0);
}

TEST_CASE("fault sweep: stream_pool over a contiguous simulated device", "[reliability][fault]") {
  faulty_device base(recorded_device(vram::simulated_device_source(
      vram::simulated_device_options{.capacity = std::size_t{256} << 20, .granularity = 64 << 10, .contiguous = true})));
  fault_sweep(base, [](faulty_device f) { return std::make_unique<vram::stream_pool<faulty_device>>(f); }, false);
}

TEST_CASE("fault sweep: stream_pool with a maximum size", "[reliability][fault]") {
  fault_sweep(faulty_host(recorded_host{}), [](faulty_host f) {
    return std::make_unique<vram::stream_pool<faulty_host>>(
        f, vram::stream_pool_options{.maximum_size = std::size_t{64} << 20, .growth_step = std::size_t{2} << 20});
  }, true);
}

TEST_CASE("fault sweep: activation_arena", "[reliability][fault]") {
  fault_sweep(faulty_host(recorded_host{}), [](faulty_host f) {
    return std::make_unique<vram::activation_arena<faulty_host>>(f, vram::stream_ref{},
                                                                 vram::activation_arena_options{.chunk_bytes = 256 << 10});
  }, true);
}

TEST_CASE("fault sweep: budget_slab (device and spill both faulty)", "[reliability][fault]") {
  fault_sweep(faulty_host(recorded_host{}), [](faulty_host f) {
    return std::make_unique<vram::budget_slab<faulty_host, faulty_host>>(
        f, f, vram::budget_slab_options{.device_budget = std::size_t{1} << 20});
  }, true);
}

TEST_CASE("fault sweep: statistics_adaptor", "[reliability][fault]") {
  fault_sweep(faulty_host(recorded_host{}),
              [](faulty_host f) { return std::make_unique<vram::statistics_adaptor<faulty_host>>(f); }, true);
}

TEST_CASE("fault sweep: quota_adaptor", "[reliability][fault]") {
  auto registry = std::make_shared<vram::tenant_registry>();
  fault_sweep(faulty_host(recorded_host{}), [&](faulty_host f) {
    auto q = std::make_unique<vram::quota_adaptor<faulty_host>>(f, registry);
    q->set_hard_limit(vram::tenant::none(), std::size_t{1} << 30);
    return q;
  }, true);
}

TEST_CASE("fault sweep: tracker_adaptor", "[reliability][fault]") {
  fault_sweep(faulty_host(recorded_host{}), [](faulty_host f) {
    return std::make_unique<vram::tracker_adaptor<faulty_host>>(f, vram::tracker_options{.event_capacity = 256});
  }, true);
}

TEST_CASE("fault sweep: logging_adaptor", "[reliability][fault]") {
  fault_sweep(faulty_host(recorded_host{}), [](faulty_host f) {
    return std::make_unique<vram::logging_adaptor<faulty_host>>(f, null_sink());
  }, true);
}

TEST_CASE("fault sweep: retry_adaptor that cannot reclaim rethrows the upstream's error", "[reliability][fault]") {
  fault_sweep(faulty_host(recorded_host{}), [](faulty_host f) {
    auto r = std::make_unique<vram::retry_adaptor<faulty_host>>(f, vram::retry_options{.max_retries = 2});
    r->add_reclaim([](std::size_t, vram::stream_ref) -> std::size_t { return 0; });
    return r;
  }, true);
}

TEST_CASE("fault sweep: retry_adaptor over a stream_pool absorbs single faults", "[reliability][fault]") {
  using pool = vram::stream_pool<faulty_host>;
  // stream_pool is not movable, so the retry adaptor holds it through a shared handle here.
  struct shared_pool {
    std::shared_ptr<pool> p;
    void* allocate(vram::stream_ref s, std::size_t b, std::size_t a = vram::default_alignment) { return p->allocate(s, b, a); }
    void deallocate(vram::stream_ref s, void* q, std::size_t b, std::size_t a = vram::default_alignment) noexcept { p->deallocate(s, q, b, a); }
    void* allocate_sync(std::size_t b, std::size_t a = vram::default_alignment) { return p->allocate_sync(b, a); }
    void deallocate_sync(void* q, std::size_t b, std::size_t a = vram::default_alignment) noexcept { p->deallocate_sync(q, b, a); }
    vram::stats stats() const { return p->stats(); }
    void check_invariants() const { p->check_invariants(); }
    bool operator==(const shared_pool&) const = default;
  };
  faulty_host base(recorded_host{});
  std::size_t errors = 0;
  std::size_t escaped = fault_sweep(base, [&](faulty_host f) {
    auto r = std::make_unique<vram::retry_adaptor<shared_pool>>(
        shared_pool{std::make_shared<pool>(f, vram::stream_pool_options{.growth_step = std::size_t{1} << 20})},
        vram::retry_options{.max_retries = 2});
    r->add_reclaim([&errors](std::size_t, vram::stream_ref) -> std::size_t { ++errors; return 1; });
    return r;
  }, true);
  CHECK(errors > 0);    // the reclaim callback ran
  CHECK(escaped == 0);  // and every single, transient fault was absorbed by a retry
}

// Composition keeps every capability: vram::ref(r) and each adaptor over it expose exactly
// the optional capabilities of the resource underneath (plus those an adaptor has of its own),
// and a stack built by value over a pool reports the pool's figures from its top.
#include <catch2/catch.hpp>

#include <sstream>
#include <type_traits>

#include <vram/adaptor/logging_adaptor.hpp>
#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/retry_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/statistics_observer.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/adaptor/tracker_observer.hpp>
#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/observers.hpp>
#include <vram/core/ref.hpp>
#include <vram/interop/pmr.hpp>
#include <vram/interop/thrust.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

#include "support/misuse_capture.hpp"

namespace {

using pool_t = vram::stream_pool<vram::host_source>;
using arena_t = vram::activation_arena<vram::host_source>;
using slab_t = vram::budget_slab<vram::host_source, vram::host_source>;
using device_pool_t = vram::stream_pool<vram::simulated_device_source>;

/// The optional capabilities of R, as one comparable value.
struct capabilities {
  bool try_allocate, owns, release, stats, check_invariants, contiguous, host, device;
  bool operator==(const capabilities&) const = default;
};
template <class R>
constexpr capabilities capabilities_of() {
  return {vram::has_try_allocate<R>,      vram::has_owns<R>,
          vram::has_release<R>,           vram::has_stats<R>,
          vram::has_check_invariants<R>,  vram::has_contiguous_growth<R>,
          vram::has_property<R, vram::host_accessible>, vram::has_property<R, vram::device_accessible>};
}

/// What an adaptor over R exposes: R's capabilities, with what the adaptor adds of its own
/// (statistics, quota and tracker count, so they always have stats(); quota and tracker record
/// pointers, so they always answer owns(); the three check their own records), and never
/// contiguous growth (a recording adaptor cannot honour a free of part of a merged range).
template <class R>
constexpr capabilities over(bool own_stats, bool own_owns, bool own_check) {
  capabilities c = capabilities_of<R>();
  c.stats = c.stats || own_stats;
  c.owns = c.owns || own_owns;
  c.check_invariants = c.check_invariants || own_check;
  c.contiguous = false;
  return c;
}

template <class R>
constexpr bool composes() {
  using ref = vram::ref_t<R>;
  static_assert(vram::resource<ref>);
  static_assert(capabilities_of<ref>() == capabilities_of<R>(), "ref_t forwards exactly what R has");
  static_assert(vram::resource<vram::statistics_adaptor<ref>>);
  static_assert(vram::resource<vram::quota_adaptor<ref>>);
  static_assert(vram::resource<vram::tracker_adaptor<ref>>);
  static_assert(vram::resource<vram::logging_adaptor<ref>>);
  static_assert(vram::resource<vram::retry_adaptor<ref>>);
  static_assert(capabilities_of<vram::statistics_adaptor<ref>>() == over<R>(true, false, true));
  static_assert(capabilities_of<vram::quota_adaptor<ref>>() == over<R>(true, true, true));
  static_assert(capabilities_of<vram::tracker_adaptor<ref>>() == over<R>(true, true, true));
  static_assert(capabilities_of<vram::logging_adaptor<ref>>() == over<R>(false, false, false));
  static_assert(capabilities_of<vram::retry_adaptor<ref>>() == over<R>(false, false, false));
  // A stack of them keeps the pool's capabilities too.
  using stack = vram::tracker_adaptor<vram::quota_adaptor<vram::statistics_adaptor<ref>>>;
  static_assert(capabilities_of<stack>() == over<R>(true, true, true));
  return true;
}

}  // namespace

TEST_CASE("capabilities: ref and every adaptor over it expose exactly what the resource has", "[adaptor][compose]") {
  STATIC_REQUIRE(composes<pool_t>());
  STATIC_REQUIRE(composes<arena_t>());
  STATIC_REQUIRE(composes<slab_t>());
  STATIC_REQUIRE(composes<device_pool_t>());
  STATIC_REQUIRE(composes<vram::host_source>());                // a source: no optional capability
  STATIC_REQUIRE(composes<vram::simulated_device_source>());    // with contiguous growth and stats
  STATIC_REQUIRE(capabilities_of<pool_t>() == capabilities{true, true, true, true, true, false, true, false});
  STATIC_REQUIRE(vram::has_contiguous_growth<vram::ref_t<vram::simulated_device_source>>);
  STATIC_REQUIRE(!vram::has_release<vram::ref_t<vram::host_source>>);
  // The interop adapters hold a non-copyable pool through ref_t.
  STATIC_REQUIRE(std::is_same_v<decltype(vram::pmr_resource{std::declval<pool_t&>()}), vram::pmr_resource<vram::ref_t<pool_t>>>);
}

TEST_CASE("capabilities: a stack built by value over a pool reports the pool from its top", "[adaptor][compose]") {
  vram::test::misuse_capture capture;
  pool_t pool(vram::host_source{}, {.initial_size = 64 << 20});
  auto reg = std::make_shared<vram::tenant_registry>();
  vram::tenant a = reg->create("a"), b = reg->create("b");
  vram::tracker_adaptor stack{vram::quota_adaptor{vram::statistics_adaptor{vram::ref(pool)}, reg},
                              vram::tracker_options{.registry = reg}};
  auto& quota = stack.upstream();
  auto& counts = quota.upstream();
  quota.set_hard_limit(b, 1 << 20);
  vram::host_stream s1, s2;
  void* p = nullptr;
  void* q = nullptr;
  {
    vram::tenant_scope in(a);  // every layer reads the tenant in scope
    p = stack.allocate(s1, 4096);
  }
  {
    vram::tenant_scope in(b);
    q = stack.allocate(s2, 8192);
    CHECK_THROWS_AS(stack.allocate(s2, 2 << 20), vram::quota_exceeded);
    CHECK(stack.try_allocate(s2, 2 << 20) == nullptr);  // the quota's refusal, as nullptr
  }
  void* r = stack.try_allocate(s2, 2 << 20);  // the default tenant has no limit
  CHECK(r != nullptr);
  vram::stats top = stack.stats();
  CHECK(top.reserved_bytes >= (std::size_t{64} << 20));  // from the pool, through three adaptors
  CHECK(top.reserved_bytes == pool.stats().reserved_bytes);
  CHECK(top.live_allocations == 3);
  CHECK(stack.owns(p));
  CHECK(counts.stats(b).live_bytes == 8192);
  CHECK(quota.usage(a) == 4096);
  stack.check_invariants();  // the tracker's, the quota's, the statistics', the pool's
  stack.deallocate(s1, p, 4096);
  stack.deallocate(s2, q, 8192);
  CHECK_FALSE(stack.owns(p));
  stack.deallocate(s2, r, 2 << 20);
  s1.synchronize();
  s2.synchronize();
  CHECK(stack.stats().live_allocations == 0);
  CHECK(stack.release() > 0);  // through every layer to the pool
  CHECK(pool.stats().reserved_bytes == 0);
  stack.check_invariants();
  CHECK(capture.count() == 0);
}

TEST_CASE("capabilities: observers<...> feed statistics and a tracker inside one pool", "[adaptor][compose]") {
  vram::statistics_observer counts;
  vram::tracker_observer tracker;
  using both = vram::observers<vram::statistics_observer, vram::tracker_observer>;
  vram::stream_pool<vram::host_source, both> pool({}, {}, {counts, tracker});
  void* p = pool.allocate_sync(1000);
  void* q = pool.allocate_sync(3 << 20);
  CHECK(counts.stats().live_allocations == 2);
  CHECK(counts.stats().reserved_bytes == pool.stats().reserved_bytes);
  CHECK(tracker.live_allocations().size() == 2);
  CHECK(pool.observer().get<vram::statistics_observer>().stats().live_bytes == counts.stats().live_bytes);
  pool.deallocate_sync(p, 1000);
  pool.deallocate_sync(q, 3 << 20);
  CHECK(counts.stats().live_allocations == 0);
  CHECK(tracker.live_allocations().empty());
  pool.check_invariants();
}

// Nothing on an allocate or deallocate path blocks the host: per free through the tracker,
// the quota adaptor and the C ABI's own stack (tracker over quota over a type-erased pool),
// on host streams, the number of host-blocking waits (host_stream::blocking_waits) is zero.
// The streams are held back while the frees are made (for two seconds at most, so that a
// free that waits for its stream is counted and fails the test instead of hanging it).
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/adaptor/tracker_observer.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/resource_ref.hpp>
#include <vram/source/host_source.hpp>

#include "support/recording_resource.hpp"

namespace {

using upstream_t = vram::test::recording_resource<vram::host_source>;

/// Holds a host stream's tasks back until released, or for two seconds.
struct gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  void hold(vram::host_stream& s) {
    s.enqueue([this] {
      std::unique_lock lock(m);
      cv.wait_for(lock, std::chrono::seconds(2), [&] { return open; });
    });
  }
  void release() {
    {
      std::lock_guard lock(m);
      open = true;
    }
    cv.notify_all();
  }
};

/// Allocates on three host streams, holds them, frees everything on its stream and returns
/// the host-blocking waits that the allocations and frees made. Streams drained afterwards.
template <class R>
std::uint64_t waits_per_round(R& r) {
  vram::host_stream streams[3];
  std::vector<std::pair<void*, std::size_t>> blocks[3];
  auto before = vram::host_stream::blocking_waits();
  for (int round = 0; round < 3; ++round)
    for (std::size_t s = 0; s < 3; ++s)
      for (std::size_t i = 1; i <= 8; ++i) {
        std::size_t bytes = i * 3000 + s * 100000;
        blocks[s].emplace_back(r.allocate(vram::stream_ref(streams[s]), bytes), bytes);
      }
  gate g;
  for (auto& s : streams) g.hold(s);
  for (std::size_t s = 0; s < 3; ++s)
    for (auto [p, n] : blocks[s]) r.deallocate(vram::stream_ref(streams[s]), p, n);
  // The freed blocks are reused at once on their own stream, still held.
  for (std::size_t s = 0; s < 3; ++s) {
    void* p = r.allocate(vram::stream_ref(streams[s]), 3000 + s * 100000);
    r.deallocate(vram::stream_ref(streams[s]), p, 3000 + s * 100000);
  }
  auto waits = vram::host_stream::blocking_waits() - before;
  g.release();
  for (auto& s : streams) s.synchronize();
  return waits;
}

}  // namespace

TEST_CASE("no host-blocking wait per free: the counter counts", "[adaptor][streams]") {
  vram::host_stream s;
  auto before = vram::host_stream::blocking_waits();
  s.synchronize();
  vram::event e;
  e.record(s);
  e.synchronize();
  vram::wait(vram::stream_ref{}, e);  // the synchronous stream waits by blocking; e is done: no wait
  CHECK(vram::host_stream::blocking_waits() - before == 2);
}

TEST_CASE("no host-blocking wait per free: tracker_adaptor", "[adaptor][streams]") {
  upstream_t up;
  SECTION("over host_source") {
    vram::tracker_adaptor<upstream_t> tracker(up);
    CHECK(waits_per_round(tracker) == 0);
    CHECK(tracker.pending_frees() == 0);
  }
  SECTION("over a stream_pool") {
    vram::stream_pool<upstream_t> pool(up);
    vram::tracker_adaptor<vram::resource_ref<>> tracker{vram::resource_ref<>(pool)};
    CHECK(waits_per_round(tracker) == 0);
    CHECK(tracker.pending_frees() == 0);
  }
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("no host-blocking wait per free: quota_adaptor", "[adaptor][streams]") {
  upstream_t up;
  {
    vram::stream_pool<upstream_t> pool(up);
    vram::quota_adaptor<vram::resource_ref<>> quota{vram::resource_ref<>(pool)};
    CHECK(waits_per_round(quota) == 0);
  }
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("no host-blocking wait per free: the C ABI's stack", "[adaptor][streams][c_abi]") {
  // libvram_c builds tracker_adaptor<quota_adaptor<resource_ref<>>> over its allocator per
  // device; its host backends order nothing on streams, so the stack is exercised here.
  upstream_t up;
  {
    vram::stream_pool<upstream_t> pool(up);
    vram::tracker_adaptor<vram::quota_adaptor<vram::resource_ref<>>> top{
        vram::quota_adaptor<vram::resource_ref<>>{vram::resource_ref<>(pool)}};
    CHECK(waits_per_round(top) == 0);
    CHECK(top.pending_frees() == 0);
  }
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("no host-blocking wait per free: tracker_observer inside a stream_pool", "[adaptor][streams]") {
  upstream_t up;
  vram::tracker_observer tracker;
  {
    vram::stream_pool<upstream_t, vram::tracker_observer> pool(up, {}, tracker);
    CHECK(waits_per_round(pool) == 0);
    CHECK(tracker.pending_frees() == 0);
  }
  CHECK(up.counters().live_allocations() == 0);
}

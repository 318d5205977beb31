// What a GPU would reveal about vram's CUDA paths, asserted on the CUDA stand-in (standin.h
// counts every call): no host-blocking call on the hot paths, a cross-stream steal ordered by
// an event instead of a wait, cuda_vmm_source's reservation, mappings and access, and a fault
// at every CUDA call of the sources under stream_pool and budget_slab.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/ref.hpp>
#include <vram/source/cuda_async_source.hpp>
#include <vram/source/cuda_device_source.hpp>
#include <vram/source/cuda_pinned_source.hpp>
#include <vram/source/cuda_vmm_source.hpp>

#include "standin/standin.h"

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

struct cuda_stream {
  cuda_stream() { REQUIRE(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking) == cudaSuccess); }
  ~cuda_stream() {
    cudaStreamSynchronize(raw);
    cudaStreamDestroy(raw);
  }
  cudaStream_t raw = nullptr;
  vram::stream_ref ref() const { return vram::stream_ref{raw}; }
};

/// Holds a stream busy until open() (a host function that waits), so its work is pending.
struct gate {
  std::atomic<bool> open_{false};
  static void CUDART_CB wait(void* self) {
    while (!static_cast<gate*>(self)->open_.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  void close_on(cudaStream_t s) { REQUIRE(cudaLaunchHostFunc(s, &gate::wait, this) == cudaSuccess); }
  void open() { open_ = true; }
};

std::size_t blocking_calls() { return vram_standin_blocking_calls(); }

/// Allocates and frees on two streams (bins, the heap, frees on the other stream) through `r`.
template <class R>
void churn(R& r, const cuda_stream& a, const cuda_stream& b) {
  std::vector<std::pair<void*, std::size_t>> live;
  for (int round = 0; round < 50; ++round) {
    for (std::size_t bytes : {std::size_t{256}, 4 * KiB, 64 * KiB, 3 * MiB})
      live.emplace_back(r.allocate(round % 2 == 0 ? a.ref() : b.ref(), bytes), bytes);
    std::vector<std::pair<void*, std::size_t>> kept;  // every other block freed, on either stream
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (i % 2 == 1) {
        kept.push_back(live[i]);
        continue;
      }
      r.deallocate(round % 3 == 0 ? b.ref() : a.ref(), live[i].first, live[i].second);
    }
    live = std::move(kept);
  }
  for (auto [p, bytes] : live) r.deallocate(a.ref(), p, bytes);
}

}  // namespace

TEST_CASE("standin: allocate and deallocate on CUDA streams never block the host", "[standin][sync]") {
  cuda_stream a, b;
  vram::stream_pool<vram::cuda_device_source> pool(vram::cuda_device_source{}, {.initial_size = 64 * MiB});
  churn(pool, a, b);  // warm: lanes exist, the pool has grown
  vram_standin_reset_counts();
  churn(pool, a, b);
  CHECK(blocking_calls() == 0);
  CHECK(vram_standin_calls("cudaFree") == 0);

  SECTION("through the adaptors over the pool") {
    vram::statistics_adaptor stats(vram::ref(pool));
    vram::quota_adaptor quota(vram::ref(stats));
    vram::tracker_adaptor tracker(vram::ref(quota));
    churn(tracker, a, b);
    vram_standin_reset_counts();
    churn(tracker, a, b);
    CHECK(blocking_calls() == 0);
  }
  REQUIRE(cudaStreamSynchronize(a.raw) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b.raw) == cudaSuccess);
  pool.check_invariants();
}

TEST_CASE("standin: a cross-stream steal records an event on the freeing stream and makes the taker wait",
          "[standin][steal]") {
  cuda_stream a, b;
  vram::stream_pool<vram::cuda_device_source> pool(vram::cuda_device_source{});
  void* p = pool.allocate(a.ref(), 8 * MiB);
  gate busy;
  busy.close_on(a.raw);  // a's work stays pending: the block freed on it is not yet free for b
  pool.deallocate(a.ref(), p, 8 * MiB);
  vram_standin_reset_counts();
  void* q = pool.allocate(b.ref(), 8 * MiB);  // nothing else fits on b without growing: a steal
  CHECK(q == p);
  CHECK(vram_standin_calls("cudaEventRecord") == 1);
  CHECK(vram_standin_calls("cudaStreamWaitEvent") == 1);
  CHECK(blocking_calls() == 0);
  CHECK(vram_standin_calls("cudaMalloc") == 0);

  // b's work now runs after a's: a host function on b cannot run while a is held.
  std::atomic<bool> ran{false};
  auto mark = [](void* flag) { static_cast<std::atomic<bool>*>(flag)->store(true); };
  REQUIRE(cudaLaunchHostFunc(b.raw, mark, &ran) == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(ran.load());
  busy.open();
  REQUIRE(cudaStreamSynchronize(b.raw) == cudaSuccess);
  CHECK(ran.load());
  pool.deallocate(b.ref(), q, 8 * MiB);
  REQUIRE(cudaStreamSynchronize(b.raw) == cudaSuccess);
  pool.check_invariants();
}

TEST_CASE("standin: cuda_vmm_source reserves once, maps granules, sets access, and gives everything back",
          "[standin][vmm]") {
  std::size_t leaks_before = vram_standin_leaks(0);
  vram_standin_reset_counts();
  {
    cuda_stream s;
    vram::stream_pool<vram::cuda_vmm_source> pool(vram::cuda_vmm_source({.capacity = std::size_t{8} << 30}));
    const std::size_t g = pool.upstream().granularity();
    std::vector<void*> blocks;
    for (int i = 0; i < 6; ++i) blocks.push_back(pool.allocate(s.ref(), 3 * g / 2));
    // The pool grows in place by what is missing: 6 x 1.5 granules need 9 granules, no more.
    CHECK(pool.upstream().mapped_bytes() == 9 * g);
    CHECK(vram_standin_calls("cuMemAddressReserve") == 1);
    CHECK(vram_standin_calls("cuMemCreate") == 9);
    CHECK(vram_standin_calls("cuMemMap") == 9);
    CHECK(vram_standin_calls("cuMemSetAccess") >= 1);
    // The memory is usable (the stand-in keeps it inaccessible until access is set).
    REQUIRE(cudaMemsetAsync(blocks.front(), 7, 3 * g / 2, s.raw) == cudaSuccess);
    for (void* p : blocks) pool.deallocate(s.ref(), p, 3 * g / 2);
    REQUIRE(cudaStreamSynchronize(s.raw) == cudaSuccess);
    CHECK(pool.release() == 9 * g);
    CHECK(pool.upstream().mapped_bytes() == 0);
    CHECK(vram_standin_calls("cuMemUnmap") == 9);
    CHECK(vram_standin_calls("cuMemRelease") == 9);
  }
  CHECK(vram_standin_calls("cuMemAddressFree") == 1);
  CHECK(vram_standin_leaks(1) == leaks_before);
}

namespace {

/// Runs a small workload with the `nth` call of `name` failing. Returns false once the
/// workload no longer reaches that call. Every failure must be a typed vram error.
template <class Make>
bool sweep_once(const char* name, std::size_t nth, Make&& make) {
  std::size_t leaks_before = vram_standin_leaks(0);
  vram_standin_reset_counts();
  vram_standin_fail_call(name, nth);
  std::size_t failures = 0;  // one call fails: at most one request may, and the rest must not
  {
    cuda_stream s;
    decltype(make()) r;
    std::vector<std::pair<void*, std::size_t>> live;
    auto attempt = [&](auto&& f) {
      try {
        f();
      } catch (const vram::out_of_memory&) {
        ++failures;
      } catch (const vram::cuda_error&) {
        ++failures;
      }
    };
    attempt([&] { r = make(); });  // a constructor that takes memory up front (budget_slab) may fail too
    if (r) {
      for (std::size_t bytes : {std::size_t{512}, 2 * MiB, 5 * MiB, 100 * KiB, 9 * MiB, 3 * MiB, 12 * MiB}) {
        attempt([&] { live.emplace_back(r->allocate(s.ref(), bytes), bytes); });
        r->check_invariants();
      }
      r->check_invariants();
      for (auto [p, bytes] : live) r->deallocate(s.ref(), p, bytes);
      REQUIRE(cudaStreamSynchronize(s.raw) == cudaSuccess);
      r->check_invariants();
    }
  }
  bool reached = vram_standin_calls(name) >= nth;
  vram_standin_fail_call(nullptr, 0);
  CHECK(vram_standin_leaks(1) == leaks_before);
  CHECK(failures <= 1);
  CHECK((failures == 1 || !reached));
  return reached;
}

template <class Make>
void sweep(const char* name, Make&& make) {
  CAPTURE(name);
  std::size_t n = 1;
  for (; n < 64 && sweep_once(name, n, make); ++n) {
  }
  CHECK(n > 1);  // the workload reached the call at least once
}

}  // namespace

TEST_CASE("standin: a fault at every CUDA call under stream_pool and budget_slab is a typed error, leaks nothing",
          "[standin][faults]") {
  auto device_pool = [] {
    return std::make_unique<vram::stream_pool<vram::cuda_device_source>>(vram::cuda_device_source{});
  };
  auto async_pool = [] {
    return std::make_unique<vram::stream_pool<vram::cuda_async_source>>(vram::cuda_async_source{});
  };
  auto vmm_pool = [] {
    return std::make_unique<vram::stream_pool<vram::cuda_vmm_source>>(
        vram::cuda_vmm_source({.capacity = std::size_t{1} << 30}));
  };
  auto slab = [] {
    return std::make_unique<vram::budget_slab<vram::cuda_device_source, vram::cuda_pinned_source>>(
        vram::cuda_device_source{}, vram::cuda_pinned_source{}, vram::budget_slab_options{.device_budget = 4 * MiB});
  };
  sweep("cudaMalloc", device_pool);
  sweep("cudaMallocFromPoolAsync", async_pool);
  sweep("cuMemCreate", vmm_pool);
  sweep("cuMemMap", vmm_pool);
  sweep("cuMemSetAccess", vmm_pool);
  sweep("cudaMalloc", slab);
  sweep("cudaHostAlloc", slab);
}

TEST_CASE("standin: the tracker completes a free on a CUDA stream when the stream reaches it, without blocking",
          "[standin][tracker]") {
  cuda_stream s;
  vram::stream_pool<vram::cuda_device_source> pool(vram::cuda_device_source{});
  vram::tracker_adaptor tracker(vram::ref(pool));
  void* p = tracker.allocate(s.ref(), 1 * MiB);
  gate busy;
  busy.close_on(s.raw);  // the free's turn on the stream comes only when the gate opens
  vram_standin_reset_counts();
  tracker.deallocate(s.ref(), p, 1 * MiB);
  CHECK(blocking_calls() == 0);
  auto count = [&](vram::tracker_action a) {
    std::size_t n = 0;
    for (const auto& e : tracker.events()) n += e.action == a;
    return n;
  };
  CHECK(count(vram::tracker_action::free_requested) == 1);
  CHECK(count(vram::tracker_action::free_completed) == 0);  // the stream has not reached it
  busy.open();
  REQUIRE(cudaStreamSynchronize(s.raw) == cudaSuccess);
  // The stream has reached the free: the tracker sees it (it may notice on a later call).
  for (int i = 0; i < 100 && count(vram::tracker_action::free_completed) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(count(vram::tracker_action::free_completed) == 1);
}

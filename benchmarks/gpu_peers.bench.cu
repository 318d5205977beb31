// GPU allocators side by side, on a real device: stream_pool over cudaMalloc and over the
// VMM source, against cudaMalloc/cudaFree, cudaMallocAsync/cudaFreeAsync (the driver's pool)
// and cub::CachingDeviceAllocator (ships with the toolkit). Host time per operation.
//
//   bench.gpu_peers --benchmark_min_time=0.2      (scripts/gpu-check runs it)
//
// pair/<bytes>: one allocate + deallocate of one size on one stream (the hot path).
// churn: 64 live blocks, sizes drawn from a fixed table shaped like the shared traces'
// distribution (1 KiB .. 2.25 MiB), a random one replaced per iteration.
// Without a GPU every benchmark reports "no CUDA device" and skips.

#include <benchmark/benchmark.h>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <cub/util_allocator.cuh>

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/cuda_device_source.hpp>
#include <vram/source/cuda_vmm_source.hpp>

namespace {

bool have_gpu() {
  static const bool yes = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return yes;
}

cudaStream_t bench_stream() {
  static cudaStream_t s = [] {
    cudaStream_t created = nullptr;
    if (cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking) != cudaSuccess) return cudaStream_t{};
    return created;
  }();
  return s;
}

/// One allocator under test, behind two calls.
struct peer {
  virtual ~peer() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) = 0;
};

[[noreturn]] void fail(benchmark::State& state, const char* what) {
  state.SkipWithError(what);
  throw std::runtime_error(what);
}

struct cuda_malloc_peer final : peer {
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  }
  void deallocate(void* p, std::size_t) override { (void)cudaFree(p); }
};

struct cuda_malloc_async_peer final : peer {
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    return cudaMallocAsync(&p, bytes, bench_stream()) == cudaSuccess ? p : nullptr;
  }
  void deallocate(void* p, std::size_t) override { (void)cudaFreeAsync(p, bench_stream()); }
};

struct cub_peer final : peer {
  cub::CachingDeviceAllocator cub{8, 3, 7, std::size_t{6} << 20};  // CUB's defaults
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    return cub.DeviceAllocate(&p, bytes, bench_stream()) == cudaSuccess ? p : nullptr;
  }
  void deallocate(void* p, std::size_t) override { (void)cub.DeviceFree(p); }
};

template <class Source>
struct pool_peer final : peer {
  explicit pool_peer(Source s) : pool(std::move(s), {.growth_step = std::size_t{256} << 20}) {}
  vram::stream_pool<Source> pool;
  void* allocate(std::size_t bytes) override { return pool.allocate(vram::stream_ref(bench_stream()), bytes); }
  void deallocate(void* p, std::size_t bytes) override { pool.deallocate(vram::stream_ref(bench_stream()), p, bytes); }
};

std::unique_ptr<peer> make(int which) {
  switch (which) {
    case 0: return std::make_unique<pool_peer<vram::cuda_device_source>>(vram::cuda_device_source{});
    case 1: return std::make_unique<pool_peer<vram::cuda_vmm_source>>(vram::cuda_vmm_source{});
    case 2: return std::make_unique<cuda_malloc_peer>();
    case 3: return std::make_unique<cuda_malloc_async_peer>();
    default: return std::make_unique<cub_peer>();
  }
}

constexpr const char* names[] = {"stream_pool<cuda_device>", "stream_pool<cuda_vmm>", "cudaMalloc", "cudaMallocAsync",
                                 "cub::CachingDeviceAllocator"};

void pair(benchmark::State& state, int which) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  try {
    auto a = make(which);
    const auto bytes = static_cast<std::size_t>(state.range(0));
    for (auto _ : state) {
      void* p = a->allocate(bytes);
      if (p == nullptr) fail(state, "allocation failed");
      benchmark::DoNotOptimize(std::as_const(p));
      a->deallocate(p, bytes);
    }
    if (cudaStreamSynchronize(bench_stream()) != cudaSuccess) fail(state, "cudaStreamSynchronize failed");
    state.SetItemsProcessed(state.iterations());
  } catch (const std::exception& e) {
    if (!state.error_occurred()) state.SkipWithError(e.what());
  }
}

void churn(benchmark::State& state, int which) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  // Shaped like the 16-quantiles of the shared traces' allocation sizes (memory.pickle).
  constexpr std::array<std::size_t, 8> sizes{1024, 3072, 3072, 12288, 65536, 614400, 761856, 2359296};
  try {
    auto a = make(which);
    std::mt19937 rng(7);
    std::vector<std::pair<void*, std::size_t>> live;
    for (int i = 0; i < 64; ++i) {
      std::size_t b = sizes[rng() % sizes.size()];
      live.emplace_back(a->allocate(b), b);
      if (live.back().first == nullptr) fail(state, "allocation failed");
    }
    for (auto _ : state) {
      auto& slot = live[rng() % live.size()];
      a->deallocate(slot.first, slot.second);
      slot.second = sizes[rng() % sizes.size()];
      slot.first = a->allocate(slot.second);
      if (slot.first == nullptr) fail(state, "allocation failed");
    }
    for (auto& [p, b] : live) a->deallocate(p, b);
    if (cudaStreamSynchronize(bench_stream()) != cudaSuccess) fail(state, "cudaStreamSynchronize failed");
    state.SetItemsProcessed(state.iterations());
  } catch (const std::exception& e) {
    if (!state.error_occurred()) state.SkipWithError(e.what());
  }
}

[[maybe_unused]] const bool registered = [] {
  for (int i = 0; i < 5; ++i) {
    benchmark::RegisterBenchmark((std::string("pair/") + names[i]).c_str(), pair, i)
        ->Arg(512)->Arg(64 << 10)->Arg(4 << 20);
    benchmark::RegisterBenchmark((std::string("churn/") + names[i]).c_str(), churn, i);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();

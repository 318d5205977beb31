// budget_slab: the cost of an allocate + deallocate pair at 256 B, 4 KiB (size-class hits)
// and 64 KiB (a one-page run), and of the spill path (budget full: served by host_source).
// Peers in the same binary: stream_pool over the same simulated device, and malloc.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

namespace {

using slab_t = vram::budget_slab<vram::simulated_device_source, vram::host_source>;

vram::simulated_device_source device() {
  return vram::simulated_device_source(vram::simulated_device_options{.capacity = std::size_t{1} << 30});
}

void report(benchmark::State& state) {
  state.counters["ns_per_pair"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void slab_pair(benchmark::State& state) {
  auto bytes = static_cast<std::size_t>(state.range(0));
  slab_t slab(device(), vram::host_source{}, {.device_budget = std::size_t{64} << 20});
  void* keep = slab.allocate_sync(bytes);  // the slab/run stays warm, as in a running server
  for (auto _ : state) {
    void* p = slab.allocate_sync(bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    slab.deallocate_sync(p, bytes);
  }
  slab.deallocate_sync(keep, bytes);
  report(state);
}

void slab_spill_pair(benchmark::State& state) {
  auto bytes = static_cast<std::size_t>(state.range(0));
  slab_t slab(device(), vram::host_source{}, {.device_budget = std::size_t{64} << 10});
  void* fill = slab.allocate_sync(std::size_t{64} << 10);  // the whole budget
  for (auto _ : state) {
    void* p = slab.allocate_sync(bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    slab.deallocate_sync(p, bytes);
  }
  if (slab.stats().spills != state.iterations()) state.SkipWithError("did not spill");
  slab.deallocate_sync(fill, std::size_t{64} << 10);
  report(state);
}

void pool_pair(benchmark::State& state) {
  auto bytes = static_cast<std::size_t>(state.range(0));
  vram::stream_pool<vram::simulated_device_source> pool(device());
  void* keep = pool.allocate_sync(bytes);
  for (auto _ : state) {
    void* p = pool.allocate_sync(bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    pool.deallocate_sync(p, bytes);
  }
  pool.deallocate_sync(keep, bytes);
  report(state);
}

void malloc_pair(benchmark::State& state) {
  auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    std::free(p);
  }
  report(state);
}

}  // namespace

BENCHMARK(slab_pair)->Name("pair/budget_slab")->Arg(256)->Arg(4096)->Arg(65536);
BENCHMARK(slab_spill_pair)->Name("pair/budget_slab_spill")->Arg(256)->Arg(4096)->Arg(65536);
BENCHMARK(pool_pair)->Name("pair/stream_pool")->Arg(256)->Arg(4096)->Arg(65536);
BENCHMARK(malloc_pair)->Name("pair/malloc")->Arg(256)->Arg(4096)->Arg(65536);

BENCHMARK_MAIN();

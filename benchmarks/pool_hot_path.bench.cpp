// Hot path: allocate + deallocate pairs of one size on one stream, 1 and 2 threads, for
// stream_pool and its host-side peers (malloc/free, std::pmr pool resources).
//
//   bench.pool_hot_path --benchmark_min_time=0.2
//
// 2 threads: "own_stream" gives each thread its own host stream (the realistic pattern);
// "one_stream" has both threads allocate on the same stream (they share one lane).
// machine_parallelism: what 2 threads can gain on this machine at all (see below).

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <memory_resource>
#include <utility>

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>

namespace {

using pool_t = vram::stream_pool<vram::host_source>;

pool_t& shared_pool() {
  // small_max = 1 MiB: every size up to 1 MiB on the bins (the default, 16 KiB, favours fragmentation).
  static pool_t pool(vram::host_source{},
                     vram::stream_pool_options{.growth_step = std::size_t{256} << 20, .small_max = std::size_t{1} << 20});
  return pool;
}

vram::host_stream& stream_for(int thread) {
  static vram::host_stream streams[8];
  return streams[thread % 8];
}

void stream_pool_own_stream(benchmark::State& state) {
  auto& pool = shared_pool();
  vram::stream_ref s = stream_for(state.thread_index());
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = pool.allocate(s, bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    pool.deallocate(s, p, bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

void stream_pool_one_stream(benchmark::State& state) {
  auto& pool = shared_pool();
  vram::stream_ref s = stream_for(0);
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = pool.allocate(s, bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    pool.deallocate(s, p, bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

void malloc_free(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = std::malloc(bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    std::free(p);
  }
  state.SetItemsProcessed(state.iterations());
}

void pmr_synchronized_pool(benchmark::State& state) {
  static std::pmr::synchronized_pool_resource pool;
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = pool.allocate(bytes, 256);
    benchmark::DoNotOptimize(std::as_const(p));
    pool.deallocate(p, bytes, 256);
  }
  state.SetItemsProcessed(state.iterations());
}

void pmr_unsynchronized_pool(benchmark::State& state) {
  std::pmr::unsynchronized_pool_resource pool;  // not thread-safe: one per benchmark run
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = pool.allocate(bytes, 256);
    benchmark::DoNotOptimize(std::as_const(p));
    pool.deallocate(p, bytes, 256);
  }
  state.SetItemsProcessed(state.iterations());
}

// The machine's own ceiling for 2 threads: a register-only loop that shares nothing. On a
// machine with two free cores it scales 2x; where it does not (virtual CPUs that share one
// physical core), no allocator can, and the pool's 2-thread ratio is to be read against it.
void machine_parallelism(benchmark::State& state) {
  std::uint64_t x = static_cast<std::uint64_t>(state.thread_index()) + 1;
  for (auto _ : state) {
    for (int i = 0; i < 16; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
    benchmark::DoNotOptimize(std::as_const(x));
  }
  state.SetItemsProcessed(state.iterations());
}

void sizes(benchmark::internal::Benchmark* b) {
  for (long bytes : {256L, 4096L, 65536L, 1L << 20, 16L << 20}) b->Arg(bytes);
}

}  // namespace

BENCHMARK(stream_pool_own_stream)->Apply(sizes)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(stream_pool_one_stream)->Apply(sizes)->Threads(2)->UseRealTime();
BENCHMARK(malloc_free)->Apply(sizes)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(pmr_synchronized_pool)->Apply(sizes)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(pmr_unsynchronized_pool)->Apply(sizes)->Threads(1);
BENCHMARK(machine_parallelism)->Threads(1)->Threads(2)->UseRealTime();

BENCHMARK_MAIN();

// The allocator stack the C ABI gives PyTorch and CuPy (libvram_c: tracker_adaptor over
// quota_adaptor over the type-erased stream_pool, docs/integration.md), on its host backend:
// vram_malloc + vram_free pairs through the shared library, beside the same pairs through a
// stream_pool<host_source> called directly, in one binary (malloc's are in bench.pool_hot_path).
//
//   c_abi/SIZE        vram_malloc + vram_free (host backend, device 0, the null stream)
//   pool/SIZE         stream_pool<host_source>::allocate + deallocate, synchronous
//   torch_caching_model/SIZE
//                     PyTorch's caching allocator's algorithm (peers/torch_caching_model.hpp:
//                     one mutex, best fit in a std::set, the block split and merged back) over
//                     host memory: what PyTorch's allocator does per call, less its statistics,
//                     its stream bookkeeping and the tensor around it; not PyTorch itself,
//                     which needs a GPU
#include <benchmark/benchmark.h>

#include <cstddef>
#include <utility>
#include <cstdlib>  // setenv

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>
#include <vram/vram_c.h>

#include <peers/torch_caching_model.hpp>

namespace {

void sizes(benchmark::internal::Benchmark* b) { b->Arg(256)->Arg(4096); }

void c_abi(benchmark::State& state) {
  // The backend is read when device 0's stack is made: before the first call.
  static const bool ready = [] {
    ::setenv("VRAM_BACKEND", "host", 1);
    return vram_init(0) == 0;
  }();
  if (!ready) {
    state.SkipWithError(vram_last_error());
    return;
  }
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = vram_malloc(bytes, 0, nullptr);
    benchmark::DoNotOptimize(std::as_const(p));
    vram_free(p, bytes, 0, nullptr);
  }
  state.SetItemsProcessed(state.iterations());
}

/// allocate_sync + deallocate_sync pairs of state.range(0) bytes through r.
template <class R>
void sync_pairs(benchmark::State& state, R& r) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  for (auto _ : state) {
    void* p = r.allocate_sync(bytes);
    benchmark::DoNotOptimize(std::as_const(p));
    r.deallocate_sync(p, bytes);
  }
  state.SetItemsProcessed(state.iterations());
}

void pool(benchmark::State& state) {
  static vram::stream_pool<vram::host_source> pool;
  sync_pairs(state, pool);
}

void torch_caching_model(benchmark::State& state) {
  static vram::peers::torch_caching_model<vram::host_source> model{vram::host_source{}};
  sync_pairs(state, model);
}

}  // namespace

BENCHMARK(c_abi)->Apply(sizes);
BENCHMARK(pool)->Apply(sizes);
BENCHMARK(torch_caching_model)->Apply(sizes);

BENCHMARK_MAIN();

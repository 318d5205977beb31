// The activation pattern: a forward pass allocates N layers' activations in order, the
// backward pass frees them in reverse, and the step ends. activation_arena against
// stream_pool, std::pmr::monotonic_buffer_resource and malloc, in one binary.
//
// Reported per benchmark: ns_per_pair (one allocate + its free; the step's reset/release
// amortised in), and for the arena reserved_per_live (reserved bytes / peak live bytes of a
// step, measured after the first step) and upstream_calls (upstream allocations in total: the
// first step's chunks plus the one chunk its reset() re-sizes them into; none afterwards).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory_resource>
#include <vector>

#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>

namespace {

/// Activation sizes of a small transformer-like step: per layer a few tensors of 8 KiB..1 MiB.
std::vector<std::size_t> layer_sizes(std::size_t layers) {
  std::vector<std::size_t> sizes;
  const std::size_t shapes[] = {256 << 10, 1 << 20, 64 << 10, 8 << 10, 512 << 10, 96 << 10};
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t k = 0; k < 6; ++k) sizes.push_back(shapes[k] + (l % 3) * 4096);
  return sizes;
}

void report(benchmark::State& state, std::size_t pairs) {
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * pairs));
  state.counters["ns_per_pair"] = benchmark::Counter(static_cast<double>(state.iterations() * pairs),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void arena(benchmark::State& state) {
  auto sizes = layer_sizes(static_cast<std::size_t>(state.range(0)));
  vram::activation_arena<vram::host_source> a(vram::host_source{}, {}, {.chunk_bytes = std::size_t{16} << 20});
  std::vector<void*> ps(sizes.size());
  auto step = [&] {
    for (std::size_t i = 0; i < sizes.size(); ++i) ps[i] = a.allocate(vram::stream_ref{}, sizes[i]);
    benchmark::DoNotOptimize(ps.data());
    for (std::size_t i = sizes.size(); i-- > 0;) a.deallocate(vram::stream_ref{}, ps[i], sizes[i]);
    a.reset();
  };
  step();  // the first step takes the chunks
  for (auto _ : state) step();
  report(state, sizes.size());
  auto s = a.stats();
  state.counters["reserved_per_live"] = static_cast<double>(s.reserved_bytes) / static_cast<double>(s.peak_live_bytes);
  state.counters["upstream_calls"] = static_cast<double>(s.upstream_allocations);
}

void pool(benchmark::State& state) {
  auto sizes = layer_sizes(static_cast<std::size_t>(state.range(0)));
  vram::stream_pool<vram::host_source> p(vram::host_source{});
  std::vector<void*> ps(sizes.size());
  auto step = [&] {
    for (std::size_t i = 0; i < sizes.size(); ++i) ps[i] = p.allocate(vram::stream_ref{}, sizes[i]);
    benchmark::DoNotOptimize(ps.data());
    for (std::size_t i = sizes.size(); i-- > 0;) p.deallocate(vram::stream_ref{}, ps[i], sizes[i]);
  };
  step();
  for (auto _ : state) step();
  report(state, sizes.size());
  auto s = p.stats();
  state.counters["reserved_per_live"] = static_cast<double>(s.reserved_bytes) / static_cast<double>(s.peak_live_bytes);
}

void monotonic(benchmark::State& state) {
  auto sizes = layer_sizes(static_cast<std::size_t>(state.range(0)));
  std::pmr::monotonic_buffer_resource m(std::size_t{16} << 20);
  std::vector<void*> ps(sizes.size());
  auto step = [&] {
    for (std::size_t i = 0; i < sizes.size(); ++i) ps[i] = m.allocate(sizes[i], 256);
    benchmark::DoNotOptimize(ps.data());
    for (std::size_t i = sizes.size(); i-- > 0;) m.deallocate(ps[i], sizes[i], 256);  // a no-op
    m.release();  // its only way to reuse memory (and it frees its buffers: the next step mallocs again)
  };
  step();
  for (auto _ : state) step();
  report(state, sizes.size());
}

void malloc_free(benchmark::State& state) {
  auto sizes = layer_sizes(static_cast<std::size_t>(state.range(0)));
  std::vector<void*> ps(sizes.size());
  for (auto _ : state) {
    for (std::size_t i = 0; i < sizes.size(); ++i) ps[i] = std::malloc(sizes[i]);
    benchmark::DoNotOptimize(ps.data());
    for (std::size_t i = sizes.size(); i-- > 0;) std::free(ps[i]);
  }
  report(state, sizes.size());
}

}  // namespace

BENCHMARK(arena)->Name("forward_backward/activation_arena")->Arg(32);
BENCHMARK(pool)->Name("forward_backward/stream_pool")->Arg(32);
BENCHMARK(monotonic)->Name("forward_backward/pmr_monotonic")->Arg(32);
BENCHMARK(malloc_free)->Name("forward_backward/malloc")->Arg(32);

BENCHMARK_MAIN();

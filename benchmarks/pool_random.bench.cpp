// Random allocations, RMM's `random_allocations` shape: a fixed sequence of N operations,
// each allocating a size uniform in [1, max] or freeing a random live block (about half each),
// everything freed at the end. One iteration replays the whole sequence.
//
//   bench.pool_random --benchmark_min_time=0.2
//
// Args: operations (1k, 10k, 100k), max size (4 KiB, 1 MiB).

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory_resource>
#include <random>
#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

namespace {

struct operation {
  std::size_t bytes;  // 0: free
  std::size_t slot;   // alloc: slot to fill; free: slot to empty
};

/// The operation sequence (same for every resource): at most `ops` live blocks in slots.
std::vector<operation> make_sequence(std::size_t ops, std::size_t max_bytes) {
  std::mt19937_64 rng(42);
  std::vector<operation> seq;
  std::vector<std::size_t> live, free_slots;
  for (std::size_t i = 0; i < ops; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      std::size_t slot;
      if (free_slots.empty()) {
        slot = live.size() + free_slots.size();
      } else {
        slot = free_slots.back();
        free_slots.pop_back();
      }
      live.push_back(slot);
      seq.push_back({1 + rng() % max_bytes, slot});
    } else {
      std::size_t k = rng() % live.size();
      seq.push_back({0, live[k]});
      free_slots.push_back(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
  }
  for (std::size_t slot : live) seq.push_back({0, slot});
  return seq;
}

template <class Alloc, class Free>
void replay(benchmark::State& state, Alloc&& alloc, Free&& dealloc) {
  auto seq = make_sequence(static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  std::vector<std::pair<void*, std::size_t>> slots(seq.size());
  for (auto _ : state) {
    for (const auto& op : seq) {
      if (op.bytes != 0) {
        slots[op.slot] = {alloc(op.bytes), op.bytes};
      } else {
        dealloc(slots[op.slot].first, slots[op.slot].second);
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(seq.size()));
}

void stream_pool_host(benchmark::State& state) {
  vram::stream_pool<vram::host_source> pool;
  replay(state, [&](std::size_t n) { return pool.allocate_sync(n); },
         [&](void* p, std::size_t n) { pool.deallocate_sync(p, n); });
}

void stream_pool_simulated_contiguous(benchmark::State& state) {
  vram::stream_pool<vram::simulated_device_source> pool(vram::simulated_device_source(std::size_t{64} << 30, true));
  replay(state, [&](std::size_t n) { return pool.allocate_sync(n); },
         [&](void* p, std::size_t n) { pool.deallocate_sync(p, n); });
}

void malloc_free(benchmark::State& state) {
  replay(state, [](std::size_t n) { return std::malloc(n); }, [](void* p, std::size_t) { std::free(p); });
}

void pmr_synchronized_pool(benchmark::State& state) {
  std::pmr::synchronized_pool_resource pool;
  replay(state, [&](std::size_t n) { return pool.allocate(n, 256); },
         [&](void* p, std::size_t n) { pool.deallocate(p, n, 256); });
}

void pmr_unsynchronized_pool(benchmark::State& state) {
  std::pmr::unsynchronized_pool_resource pool;
  replay(state, [&](std::size_t n) { return pool.allocate(n, 256); },
         [&](void* p, std::size_t n) { pool.deallocate(p, n, 256); });
}

void args(benchmark::internal::Benchmark* b) {
  for (long ops : {1000L, 10000L, 100000L})
    for (long max : {4096L, 1L << 20}) b->Args({ops, max});
}

}  // namespace

BENCHMARK(stream_pool_host)->Apply(args);
BENCHMARK(stream_pool_simulated_contiguous)->Apply(args);
BENCHMARK(malloc_free)->Apply(args);
BENCHMARK(pmr_synchronized_pool)->Apply(args);
BENCHMARK(pmr_unsynchronized_pool)->Apply(args);

BENCHMARK_MAIN();

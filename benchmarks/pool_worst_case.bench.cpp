// stream_pool at the worst case of its complexity bounds, beside the common case, over the
// components a user stacks (a contiguous simulated device: no memory is touched).
//
//   bench.pool_worst_case --benchmark_min_time=0.2
//
// equal_sizes/k: a pair (free, then allocate) of one heap block while k free blocks of one
//   slightly smaller size sit in the same size class of the best-fit index. A class list is
//   kept in (size, address) order: a list, and past free_index::walk_limit blocks an ordered
//   set beside it, so the free (insert) and the best fit cost O(log k) rather than O(k).
//   k = 0 is the common case (a class holding few blocks).
// steal/s: an allocation on a stream that holds no free block, served by another stream's
//   block (the steal search visits every stream holding free blocks: O(s)), and its free back
//   on that stream. s = 1 is the common case.

#include <benchmark/benchmark.h>

#include <cstddef>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/source/simulated_device_source.hpp>

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

vram::simulated_device_source device() {
  return vram::simulated_device_source(
      vram::simulated_device_options{.capacity = std::size_t{64} << 30, .granularity = 2 * mib, .contiguous = true});
}

void equal_sizes(benchmark::State& state) {
  const auto k = static_cast<std::size_t>(state.range(0));
  vram::stream_pool<vram::simulated_device_source> pool(device());
  // k free blocks of 1 MiB, each between two live ones (so none coalesces), then the block
  // the pairs use: 1 MiB + 4 KiB, the same class (a class spans 16 KiB of sizes at 1 MiB).
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < 2 * k + 1; ++i) blocks.push_back(pool.allocate_sync(mib));
  const std::size_t bytes = mib + 4096;
  void* p = pool.allocate_sync(bytes);
  void* guard = pool.allocate_sync(mib);  // keeps p's block from touching the top free block
  for (std::size_t i = 0; i < 2 * k; i += 2) pool.deallocate_sync(blocks[i], mib);
  for (auto _ : state) {
    pool.deallocate_sync(p, bytes);
    p = pool.allocate_sync(bytes);
    benchmark::DoNotOptimize(std::as_const(p));
  }
  pool.deallocate_sync(p, bytes);
  pool.deallocate_sync(guard, mib);
  for (std::size_t i = 1; i < 2 * k + 1; i += 2) pool.deallocate_sync(blocks[i], mib);
  pool.deallocate_sync(blocks[2 * k], mib);
  state.counters["free_blocks_in_class"] = static_cast<double>(k);
}
BENCHMARK(equal_sizes)->Arg(0)->Arg(16)->Arg(256)->Arg(4096);

void steal(benchmark::State& state) {
  const auto s = static_cast<std::size_t>(state.range(0));
  vram::stream_pool<vram::simulated_device_source> pool(device());
  std::vector<vram::host_stream> streams(s + 1);  // streams[s] takes; the others hold free blocks
  // Each holding stream frees one 64 MiB block between live ones, so it stays keyed to it.
  std::vector<void*> live, held;
  live.push_back(pool.allocate_sync(mib));
  for (std::size_t i = 0; i < s; ++i) {
    held.push_back(pool.allocate(streams[i], 64 * mib));
    live.push_back(pool.allocate_sync(mib));
  }
  for (std::size_t i = 0; i < s; ++i) pool.deallocate(streams[i], held[i], 64 * mib);
  std::unordered_map<void*, std::size_t> holder;  // each held block's stream (blocks never split: sizes are equal)
  for (std::size_t i = 0; i < s; ++i) holder[held[i]] = i;
  for (auto _ : state) {
    // The taking stream holds nothing and key 0 has no 64 MiB block: the pool steals, records
    // a marker on the holder and makes the taker wait on it; the block goes back to its holder.
    void* p = pool.allocate(streams[s], 64 * mib);
    benchmark::DoNotOptimize(std::as_const(p));
    pool.deallocate(streams[holder.at(p)], p, 64 * mib);
  }
  for (auto& st : streams) st.synchronize();
  for (void* p : live) pool.deallocate_sync(p, mib);
  state.counters["streams_holding_free"] = static_cast<double>(s);
}
BENCHMARK(steal)->Arg(1)->Arg(8)->Arg(63);

}  // namespace

BENCHMARK_MAIN();

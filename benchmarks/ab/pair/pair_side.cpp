// One side of scripts/pair-ab: bench.pool_hot_path's one-thread loop (allocate + deallocate of
// one size on one host stream, every size on the bins: small_max = 1 MiB), timed over many
// pairs. Compiled twice, like scripts/replay-ab's sides: against the baseline's include folder
// with the library's namespace renamed (-Dvram=vram_base -DVRAM_AB_SIDE=pairs_base), and
// against this checkout's (-DVRAM_AB_SIDE=pairs_head), so both run in one process, alternately.
#include <chrono>
#include <cstddef>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/source/host_source.hpp>

namespace {

using pool_t = vram::stream_pool<vram::host_source>;

// Instantiated twice (the warm-up and the timed loop), so allocate() and deallocate() have two
// callers, as in the benchmark (which has a one-stream and an own-stream loop): a function with
// a single caller would be inlined whole, which users' code calling it from many places does
// not get.
template <int Caller>
[[gnu::noinline]] void pairs(pool_t& pool, vram::stream_ref s, std::size_t bytes, long n) {
  for (long i = 0; i < n; ++i) {
    void* p = pool.allocate(s, bytes);
    asm volatile("" : : "r"(p) : "memory");
    pool.deallocate(s, p, bytes);
  }
}

}  // namespace

/// Nanoseconds per allocate + deallocate pair of `bytes`, over `n` pairs (after a warm-up).
double VRAM_AB_SIDE(std::size_t bytes, long n) {
  static pool_t pool(vram::host_source{},
                     vram::stream_pool_options{.growth_step = std::size_t{256} << 20, .small_max = std::size_t{1} << 20});
  static vram::host_stream stream;
  pairs<0>(pool, stream, bytes, 1000);
  auto start = std::chrono::steady_clock::now();
  pairs<1>(pool, stream, bytes, n);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / static_cast<double>(n);
}

#pragma once
// vram::stream_pool_options: how a stream_pool grows, caps and caches (vram/alloc/stream_pool.hpp).

#include <cstddef>

namespace vram {

/// How a stream_pool grows, caps and caches.
struct stream_pool_options {
  /// Bytes taken from the upstream at construction (0: grow on demand).
  std::size_t initial_size = 0;
  /// The most bytes the pool holds from its upstream (0: as much as the upstream gives).
  std::size_t maximum_size = 0;
  /// Bytes added per growth, never less than the request. 0 (auto): with a contiguous
  /// upstream, exactly what is missing (rounded to its granularity: growth is in place, so
  /// small steps cost nothing in fragmentation); otherwise 64 MiB.
  std::size_t growth_step = 0;
  /// Largest request served from the per-stream bins (0: no bins). At most 1 MiB. Bins are
  /// exact-size caches of recently freed blocks: they add no rounding, but a cached block
  /// does not coalesce until the bins are flushed (before the pool grows or takes its top
  /// block) or a free leaves it alone inside 4 MiB or more of free space, and LIFO reuse
  /// places blocks differently from best fit, so the larger the bins,
  /// the more their blocks can scatter through the heap (docs/stream_pool.md, Limitations).
  /// 16 KiB keeps the shared traces within 0.004 of best fit's reserved bytes
  /// (docs/PERFORMANCE.md, fragmentation). Raise it for speed at larger sizes.
  std::size_t small_max = std::size_t{16} << 10;
  /// Per stream, the most bytes of small blocks kept in bins (beyond that they go back to
  /// the shared best-fit heap, where they coalesce).
  std::size_t lane_cache_bytes = std::size_t{32} << 20;
  /// Per stream and size class, the most blocks kept in a bin.
  std::size_t bin_capacity = 64;
};

}  // namespace vram

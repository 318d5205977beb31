#pragma once
// The one statistics struct every vram allocator fills.

#include <cstddef>
#include <cstdint>

namespace vram {

/// A snapshot of an allocator's state. Fields an allocator does not track stay 0.
///
/// Invariants (for allocators that track them):
///   live_bytes + free_bytes == reserved_bytes   (pools: every reserved byte is live or free)
///   live_allocations == total_allocations - total_deallocations
///   peak_x >= x
struct stats {
  std::size_t live_bytes = 0;          ///< bytes handed out and not yet freed (as rounded by the allocator)
  std::size_t requested_bytes = 0;     ///< bytes the callers asked for, of the live allocations
  std::size_t reserved_bytes = 0;      ///< bytes held from the upstream
  std::size_t peak_live_bytes = 0;
  std::size_t peak_requested_bytes = 0;
  std::size_t peak_reserved_bytes = 0;

  std::size_t live_allocations = 0;
  std::size_t total_allocations = 0;
  std::size_t total_deallocations = 0;

  std::size_t free_bytes = 0;          ///< reserved bytes that are not live
  std::size_t free_blocks = 0;
  std::size_t largest_free_block = 0;

  std::size_t upstream_allocations = 0;
  std::size_t upstream_deallocations = 0;
  std::size_t ooms = 0;

  std::size_t spills = 0;              ///< allocations served from the spill source (budget_slab)
  std::size_t spilled_bytes = 0;       ///< live bytes on the spill side
  std::size_t peak_spilled_bytes = 0;

  /// 1 - largest_free / total_free: 0 when all free memory is one block (or there is none).
  [[nodiscard]] double fragmentation() const noexcept {
    return free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free_block) / static_cast<double>(free_bytes);
  }

  /// reserved / live: 1.0 is perfect; 0 when nothing is live.
  [[nodiscard]] double reserved_per_live() const noexcept {
    return live_bytes == 0 ? 0.0 : static_cast<double>(reserved_bytes) / static_cast<double>(live_bytes);
  }
};

/// What statistics_adaptor knows about one tenant. live_bytes is signed: a tenant that frees
/// memory another tenant allocated goes negative instead of wrapping (see statistics_adaptor).
struct tenant_stats {
  std::int64_t live_bytes = 0;
  std::size_t allocations = 0;
  std::size_t deallocations = 0;
  [[nodiscard]] std::size_t live_allocations() const noexcept { return allocations - deallocations; }
};

}  // namespace vram

#pragma once
// detail::stream_pool::size_classes: the size classes of stream_pool's small-allocation fast path.
// 256-byte steps up to linear_max, then `divisions` classes per doubling up to max_small,
// so rounding wastes at most 1/divisions (12.5%) of a request above linear_max.

#include <bit>
#include <cstddef>

namespace vram::detail::stream_pool {

struct size_classes {
  // Tunable constants.
  static constexpr std::size_t quantum = 256;                  // every block is a multiple of this
  static constexpr std::size_t linear_max = 4096;              // 256-B steps up to here
  static constexpr std::size_t divisions = 8;                  // classes per doubling above linear_max
  static constexpr std::size_t max_small = std::size_t{1} << 20;  // largest class
  // Derived constants.
  static constexpr std::size_t linear_classes = linear_max / quantum;
  static constexpr int linear_log2 = std::countr_zero(linear_max);
  static constexpr int divisions_log2 = std::countr_zero(divisions);
  static constexpr std::size_t doublings = static_cast<std::size_t>(std::countr_zero(max_small) - linear_log2);
  static constexpr std::size_t count = linear_classes + doublings * divisions;

  static_assert(std::has_single_bit(linear_max) && std::has_single_bit(max_small) && max_small > linear_max);
  static_assert(std::has_single_bit(divisions));
  static_assert(linear_max / divisions >= quantum, "geometric steps must stay multiples of the quantum");

  /// The class serving `bytes`; pre: 0 < bytes <= max_small.
  [[nodiscard, gnu::always_inline]] static constexpr std::size_t index(std::size_t bytes) noexcept {
    if (bytes <= linear_max) return (bytes - 1) / quantum;
    std::size_t b = bytes - 1;
    int d = std::bit_width(b) - 1;  // floor(log2(b)) >= linear_log2
    std::size_t sub = (b - (std::size_t{1} << d)) >> (d - divisions_log2);  // a shift: the step is 2^d / divisions
    return linear_classes + static_cast<std::size_t>(d - linear_log2) * divisions + sub;
  }

  /// The block size of class `i`; pre: i < count.
  [[nodiscard]] static constexpr std::size_t size(std::size_t i) noexcept {
    if (i < linear_classes) return (i + 1) * quantum;
    std::size_t k = (i - linear_classes) / divisions, sub = (i - linear_classes) % divisions;
    std::size_t base = linear_max << k;
    return base + (sub + 1) * (base / divisions);
  }
};

static_assert(size_classes::size(size_classes::index(1)) == 256);
static_assert(size_classes::size(size_classes::index(4096)) == 4096);
static_assert(size_classes::size(size_classes::index(4097)) == 4608);
static_assert(size_classes::size(size_classes::index(8192)) == 8192);
static_assert(size_classes::index(size_classes::max_small) == size_classes::count - 1);
static_assert(size_classes::size(size_classes::count - 1) == size_classes::max_small);

}  // namespace vram::detail::stream_pool

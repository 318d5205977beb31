#pragma once
// Alignment helpers. Every vram resource guarantees at least default_alignment.

#include <cstddef>
#include <cstdint>

namespace vram {

/// What cudaMalloc and RMM guarantee; the default for every allocate call.
inline constexpr std::size_t default_alignment = 256;

/// The largest alignment any vram resource accepts (larger requests are invalid arguments).
inline constexpr std::size_t max_alignment = std::size_t{1} << 30;

/// The largest request any vram resource accepts; larger is an absurd size (invalid argument),
/// chosen so that rounding a request up to any alignment can never overflow.
inline constexpr std::size_t max_request_bytes = std::size_t{1} << 56;

static_assert(max_request_bytes + max_alignment > max_request_bytes, "rounding must not overflow");

[[nodiscard]] constexpr bool is_power_of_two(std::size_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

/// Rounds `v` up to a multiple of `align` (a power of two).
[[nodiscard]] constexpr std::size_t align_up(std::size_t v, std::size_t align) noexcept {
  return (v + align - 1) & ~(align - 1);
}

/// Rounds `v` down to a multiple of `align` (a power of two).
[[nodiscard]] constexpr std::size_t align_down(std::size_t v, std::size_t align) noexcept { return v & ~(align - 1); }

[[nodiscard]] constexpr bool is_aligned(std::size_t v, std::size_t align) noexcept { return (v & (align - 1)) == 0; }

[[nodiscard]] inline bool is_aligned(const void* p, std::size_t align) noexcept {
  return is_aligned(reinterpret_cast<std::uintptr_t>(p), align);
}

/// True when `align` is an alignment vram accepts.
[[nodiscard]] constexpr bool is_valid_alignment(std::size_t align) noexcept {
  return is_power_of_two(align) && align <= max_alignment;
}

}  // namespace vram

#pragma once
// The resource concepts, in the shape of CCCL 3.2+'s cuda::mr:
//   synchronous_resource: allocate_sync / deallocate_sync / ==
//   resource:             + stream-ordered allocate(stream, ...) / deallocate(stream, ...)
// and the optional capabilities that allocators detect with `requires`.

#include <concepts>
#include <cstddef>

#include <vram/core/alignment.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram {

template <class R>
concept synchronous_resource =
    std::equality_comparable<R> && requires(R& r, void* p, std::size_t bytes, std::size_t align) {
      { r.allocate_sync(bytes, align) } -> std::same_as<void*>;
      { r.deallocate_sync(p, bytes, align) } noexcept -> std::same_as<void>;
    };

template <class R>
concept resource = synchronous_resource<R> && requires(R& r, stream_ref s, void* p, std::size_t bytes, std::size_t align) {
  { r.allocate(s, bytes, align) } -> std::same_as<void*>;
  { r.deallocate(s, p, bytes, align) } noexcept -> std::same_as<void>;
};

/// A resource that also has every property in `Properties`.
template <class R, class... Properties>
concept resource_with = resource<R> && (has_property<R, Properties> && ...);

template <class R, class... Properties>
concept synchronous_resource_with = synchronous_resource<R> && (has_property<R, Properties> && ...);

// ---- optional capabilities ------------------------------------------------------------

/// `try_allocate` returns nullptr instead of throwing out_of_memory (for fallbacks).
template <class R>
concept has_try_allocate = requires(R& r, stream_ref s, std::size_t bytes, std::size_t align) {
  { r.try_allocate(s, bytes, align) } -> std::same_as<void*>;
};

/// `owns(p)`: whether p was allocated by this resource and is live.
template <class R>
concept has_owns = requires(const R& r, const void* p) {
  { r.owns(p) } -> std::convertible_to<bool>;
};

/// `release()`: return cached memory to the upstream; returns the bytes released.
template <class R>
concept has_release = requires(R& r) {
  { r.release() } -> std::convertible_to<std::size_t>;
};

/// `stats()`: a vram::stats snapshot.
template <class R>
concept has_stats = requires(const R& r) {
  { r.stats() } -> std::convertible_to<vram::stats>;
};

/// `check_invariants()`: verifies internal structures (throws std::logic_error) under VRAM_DEBUG.
template <class R>
concept has_check_invariants = requires(const R& r) { r.check_invariants(); };

/// A source whose neighbouring allocations may be treated as one range, and any
/// granularity-aligned piece of which may be freed on its own (VMM-style contiguous growth).
template <class R>
concept has_contiguous_growth = requires(const R& r) {
  { r.contiguous() } -> std::convertible_to<bool>;
  { r.granularity() } -> std::convertible_to<std::size_t>;
};

/// `for_each_free_block(f)`: calls f(bytes) for every free block the resource holds from its
/// upstream, the pieces its free memory is in (what fragmentation is made of). For reports:
/// O(free blocks), under the resource's lock.
template <class R>
concept has_free_blocks = requires(const R& r, void (*f)(std::size_t)) { r.for_each_free_block(f); };

/// `mark_step()`: the resource is told where one step of a repeating workload ends and the
/// next begins (planned_pool learns the step; tracker_adaptor summarizes it).
template <class R>
concept has_step_marks = requires(R& r) { r.mark_step(); };

/// A resource name (a string literal) used in errors and reports.
template <class R>
concept has_name = requires(const R& r) {
  { r.name() } -> std::convertible_to<const char*>;
};

template <class R>
[[nodiscard]] const char* name_of(const R& r) noexcept {
  if constexpr (has_name<R>) return r.name();
  else return "resource";
}

}  // namespace vram

#pragma once
// The observer policy: every allocator reports its events to an Observer template parameter.
// The default, no_observer, has empty inline members, so the calls compile to nothing.

#include <concepts>
#include <cstddef>

#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram {

/// What an allocator reports. All members are noexcept and called outside the allocator's
/// locks where the allocator can arrange it (observers may be slow); an observer that needs
/// thread safety provides its own.
template <class O>
concept observer = requires(O& o, const void* p, std::size_t bytes, stream_ref s, const stats& st) {
  { o.on_allocate(p, bytes, s) } noexcept;        // a block was handed out
  { o.on_deallocate(p, bytes, s) } noexcept;      // a block was given back
  { o.on_grow(p, bytes) } noexcept;               // the allocator took [p, p+bytes) from its upstream
  { o.on_release(p, bytes) } noexcept;            // the allocator gave [p, p+bytes) back to its upstream
  { o.on_out_of_memory(bytes, s, st) } noexcept;  // a request failed; `st` is the allocator's state
};

/// The default observer: observes nothing, costs nothing.
struct no_observer {
  constexpr void on_allocate(const void*, std::size_t, stream_ref) noexcept {}
  constexpr void on_deallocate(const void*, std::size_t, stream_ref) noexcept {}
  constexpr void on_grow(const void*, std::size_t) noexcept {}
  constexpr void on_release(const void*, std::size_t) noexcept {}
  constexpr void on_out_of_memory(std::size_t, stream_ref, const stats&) noexcept {}
};

static_assert(observer<no_observer>);

}  // namespace vram

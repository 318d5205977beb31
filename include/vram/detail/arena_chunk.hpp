#pragma once
// Internals of vram::activation_arena: one chunk of upstream memory and the record of the
// blocks bumped into it. The record lives on the host (device memory cannot be read), so the
// arena works the same over a CUDA source and over simulated_device_source.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vram::detail {

/// One block handed out by the arena, in allocation order inside its chunk.
struct arena_block {
  std::size_t offset;     // from the chunk base
  std::size_t end;        // offset + footprint (the footprint is the request rounded to default_alignment)
  std::size_t requested;  // what the caller asked for; a free must name the same size
  bool live;              // false: freed out of order, its space returns when everything above it is dead
};

/// A chunk taken from the upstream.
///
/// Invariants (current epoch only; a chunk of an older epoch is empty by definition):
///   blocks[i].offset <  blocks[i].end <= blocks[i+1].offset   (allocation order == address order)
///   top == blocks.empty() ? 0 : blocks.back().end <= bytes
///   blocks.empty() || blocks.back().live                       (no dead block on top)
///   top <= high <= bytes
struct arena_chunk {
  char* base = nullptr;
  std::size_t bytes = 0;
  std::size_t top = 0;
  std::uint64_t epoch = 0;  // the step in which blocks/top were last valid
  std::uint64_t born = 0;   // the step in which the chunk was taken from the upstream
  std::vector<arena_block> blocks;
  std::size_t high = 0;     // the highest top of the step (epoch): what the step needed of this chunk

  [[nodiscard]] bool contains(const void* p) const noexcept {
    auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(base);
    return a >= b && a < b + bytes;
  }

  /// Brings a chunk of an older epoch into `now`: empty, capacity kept. O(1) for trivially
  /// destructible blocks.
  void refresh(std::uint64_t now) noexcept {
    if (epoch == now) return;
    epoch = now;
    top = 0;
    high = 0;
    blocks.clear();
  }

  /// The index of the block starting at `offset`, or blocks.size(). O(log n).
  [[nodiscard]] std::size_t find(std::size_t offset) const noexcept {
    std::size_t lo = 0, hi = blocks.size();
    while (lo < hi) {
      std::size_t mid = lo + (hi - lo) / 2;
      if (blocks[mid].offset < offset) lo = mid + 1;
      else hi = mid;
    }
    return lo < blocks.size() && blocks[lo].offset == offset ? lo : blocks.size();
  }

  /// Pops dead blocks off the top, so their space can be bumped into again.
  void pop_dead() noexcept {
    while (!blocks.empty() && !blocks.back().live) blocks.pop_back();
    top = blocks.empty() ? 0 : blocks.back().end;
  }
};

}  // namespace vram::detail

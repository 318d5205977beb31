#pragma once
// Internals of vram::activation_arena: one chunk of upstream memory and the record of the
// blocks bumped into it. The record lives on the host (device memory cannot be read), so the
// arena works the same over a CUDA source and over simulated_device_source.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include <vram/core/alignment.hpp>

namespace vram::detail {

/// One block handed out by the arena, in allocation order inside its chunk. 16 bytes (the hot
/// path writes and reads one record per allocate + free, indexed by a shift): the request and
/// the dead flag share a word, since no request reaches bit 63.
struct arena_block {
  static constexpr std::size_t dead_bit = std::size_t{1} << 63;

  std::size_t offset;  // from the chunk base
  std::size_t tag;     // what the caller asked for (a free must name the same size), | dead_bit once
                       // freed out of order: its space returns when everything above it is dead

  [[nodiscard]] std::size_t requested() const noexcept { return tag & ~dead_bit; }
  [[nodiscard]] bool live() const noexcept { return (tag & dead_bit) == 0; }
  /// True for a live block of exactly `bytes` (a dead block's tag never equals a request).
  [[nodiscard]] bool live_with_size(std::size_t bytes) const noexcept { return tag == bytes; }
  void kill() noexcept { tag |= dead_bit; }
  /// offset + footprint (the footprint is the request rounded up to default_alignment).
  [[nodiscard]] std::size_t end() const noexcept { return offset + align_up(requested(), default_alignment); }
};
static_assert(max_request_bytes < arena_block::dead_bit && sizeof(arena_block) == 16);

/// The blocks of a chunk, as a stack that keeps its storage across steps: the hot path's push
/// and pop are a store and an increment, with no reallocation code inlined into them
/// (std::vector::push_back's was not inlined at all: a call per allocate).
///   size() <= capacity();  [0, size()) are the chunk's blocks
class block_stack {
 public:
  block_stack() = default;
  block_stack(block_stack&& o) noexcept
      : store_(std::move(o.store_)), size_(std::exchange(o.size_, 0)), capacity_(std::exchange(o.capacity_, 0)) {}
  block_stack& operator=(block_stack&& o) noexcept {
    store_ = std::move(o.store_);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
    return *this;
  }

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] bool full() const noexcept { return size_ == capacity_; }
  [[nodiscard]] arena_block& back() noexcept { return store_[size_ - 1]; }
  [[nodiscard]] const arena_block& back() const noexcept { return store_[size_ - 1]; }
  [[nodiscard]] arena_block& operator[](std::size_t i) noexcept { return store_[i]; }
  [[nodiscard]] const arena_block& operator[](std::size_t i) const noexcept { return store_[i]; }
  [[nodiscard]] const arena_block* begin() const noexcept { return store_.get(); }
  [[nodiscard]] const arena_block* end() const noexcept { return store_.get() + size_; }

  /// Pre: !full().
  void push_unchecked(const arena_block& b) noexcept { store_[size_++] = b; }
  /// May throw bad_alloc (growing), with nothing changed.
  void push_back(const arena_block& b) {
    if (full()) grow();
    push_unchecked(b);
  }
  void pop_back() noexcept { --size_; }
  void clear() noexcept { size_ = 0; }
  /// May throw bad_alloc, with nothing changed.
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    auto bigger = std::make_unique_for_overwrite<arena_block[]>(n);
    std::copy(begin(), end(), bigger.get());
    store_ = std::move(bigger);
    capacity_ = n;
  }

 private:
  [[gnu::noinline]] void grow() { reserve(capacity_ == 0 ? 16 : 2 * capacity_); }

  std::unique_ptr<arena_block[]> store_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

/// A chunk taken from the upstream.
///
/// Invariants (current epoch only; a chunk of an older epoch is empty by definition):
///   blocks[i].offset <  blocks[i].end() <= blocks[i+1].offset (allocation order == address order)
///   top == blocks.empty() ? 0 : blocks.back().end() <= bytes
///   blocks.empty() || blocks.back().live()                     (no dead block on top)
///   top <= high <= bytes
struct arena_chunk {
  char* base = nullptr;
  std::size_t bytes = 0;
  std::size_t top = 0;
  std::uint64_t epoch = 0;  // the step in which blocks/top were last valid
  std::uint64_t born = 0;   // the step in which the chunk was taken from the upstream
  block_stack blocks;
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
    while (!blocks.empty() && !blocks.back().live()) blocks.pop_back();
    top = blocks.empty() ? 0 : blocks.back().end();
  }
};

}  // namespace vram::detail

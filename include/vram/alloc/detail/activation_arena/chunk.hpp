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

namespace vram::detail::activation_arena {

/// One block handed out by the arena, in allocation order inside its chunk. 16 bytes (the hot
/// path writes and reads one record per allocate + free): the block's address, and the
/// request with the dead flag in the same word, since no request reaches bit 63.
struct arena_block {
  static constexpr std::size_t dead_bit = std::size_t{1} << 63;
  // A dead record that covers the gap below a block allocated at a larger alignment (so every
  // block starts where the one below it ends); never a block the caller was given.
  static constexpr std::size_t gap_bit = std::size_t{1} << 62;

  char* start;      // the block's address
  std::size_t tag;  // what the caller asked for (a free must name the same size), | dead_bit once
                    // freed out of order: its space returns when everything above it is dead

  [[nodiscard]] std::size_t requested() const noexcept { return tag & ~(dead_bit | gap_bit); }
  [[nodiscard]] bool live() const noexcept { return (tag & dead_bit) == 0; }
  [[nodiscard]] bool gap() const noexcept { return (tag & gap_bit) != 0; }
  void kill() noexcept { tag |= dead_bit; }
  /// start + footprint (the footprint is the request rounded up to default_alignment).
  [[nodiscard]] char* end() const noexcept { return start + align_up(requested(), default_alignment); }
};
static_assert(max_request_bytes < arena_block::gap_bit && sizeof(arena_block) == 16);

/// The blocks of a chunk, as a stack that keeps its storage across steps, held as two
/// pointers: the hot path's push is a compare and a store, its pop a store. Below the first
/// block there is always a sentinel record (dead, address nullptr), so back() is readable
/// when the stack is empty, and a dead back() is the one test for "empty or dead on top".
///   sentinel < data() <= end_ <= cap_;  [data(), end_) are the chunk's blocks
class block_stack {
 public:
  block_stack() = default;
  block_stack(block_stack&& o) noexcept
      : store_(std::move(o.store_)), end_(std::exchange(o.end_, empty_end())), cap_(std::exchange(o.cap_, empty_end())) {}
  block_stack& operator=(block_stack&& o) noexcept {
    store_ = std::move(o.store_);
    end_ = std::exchange(o.end_, empty_end());
    cap_ = std::exchange(o.cap_, empty_end());
    return *this;
  }

  [[nodiscard]] bool empty() const noexcept { return end_ == data(); }
  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(end_ - data()); }
  [[nodiscard]] std::size_t capacity() const noexcept { return static_cast<std::size_t>(cap_ - data()); }
  /// The last block, or the sentinel (dead) when empty.
  [[nodiscard]] arena_block& back() noexcept { return end_[-1]; }
  [[nodiscard]] const arena_block& back() const noexcept { return end_[-1]; }
  [[nodiscard]] arena_block& operator[](std::size_t i) noexcept { return data()[i]; }
  [[nodiscard]] const arena_block& operator[](std::size_t i) const noexcept { return data()[i]; }
  [[nodiscard]] const arena_block* begin() const noexcept { return data(); }
  [[nodiscard]] const arena_block* end() const noexcept { return end_; }

  /// The stack as two pointers, for a copy held elsewhere (activation_arena's hot state).
  [[nodiscard]] arena_block* end_ptr() const noexcept { return end_; }
  [[nodiscard]] arena_block* cap_ptr() const noexcept { return cap_; }
  /// Pre: data() <= e <= cap_ptr().
  void set_end(arena_block* e) noexcept { end_ = e; }
  /// Pre: end_ptr() != cap_ptr() (room for one).
  void push_unchecked(const arena_block& b) noexcept { *end_++ = b; }
  void pop_back() noexcept { --end_; }
  void clear() noexcept { end_ = data(); }
  /// Room for `n` more pushes. May throw bad_alloc, with nothing changed.
  void reserve_more(std::size_t n) {
    if (static_cast<std::size_t>(cap_ - end_) < n) grow(n);
  }
  /// May throw bad_alloc, with nothing changed.
  void reserve(std::size_t n) {
    if (n <= capacity()) return;
    auto bigger = std::make_unique_for_overwrite<arena_block[]>(n + 1);
    bigger[0] = {nullptr, arena_block::dead_bit};
    std::copy(begin(), end(), bigger.get() + 1);
    const std::size_t used = size();
    store_ = std::move(bigger);
    end_ = store_.get() + 1 + used;
    cap_ = store_.get() + 1 + n;
  }

 private:
  // The sentinel of every stack without storage (never written: such a stack is full).
  static inline arena_block empty_sentinel_{nullptr, arena_block::dead_bit};
  static arena_block* empty_end() noexcept { return &empty_sentinel_ + 1; }

  [[nodiscard]] arena_block* data() const noexcept { return store_ ? store_.get() + 1 : empty_end(); }
  [[gnu::noinline]] void grow(std::size_t n) { reserve(std::max(capacity() + n, capacity() == 0 ? 16 : 2 * capacity())); }

  std::unique_ptr<arena_block[]> store_;  // [0] is the sentinel
  arena_block* end_ = empty_end();
  arena_block* cap_ = empty_end();
};

/// Dead records popped together, and the bytes they covered.
struct dead_run {
  std::size_t bytes = 0;
  std::size_t records = 0;
};

/// A chunk taken from the upstream.
///
/// Invariants (current epoch only; a chunk of an older epoch is empty by definition):
///   blocks[0].start == base, blocks[i].end() == blocks[i+1].start (contiguous, in allocation
///     order; the gap below a block of a larger alignment is a dead gap record)
///   top == blocks.empty() ? base : blocks.back().end() <= limit
///   blocks.empty() || blocks.back().live()                     (no dead block on top)
///   top - base <= high <= bytes()
struct arena_chunk {
  char* base = nullptr;
  char* limit = nullptr;    // base + the chunk's bytes
  char* top = nullptr;      // the next free address
  std::uint64_t epoch = 0;  // the step in which blocks/top were last valid
  std::uint64_t born = 0;   // the step in which the chunk was taken from the upstream
  block_stack blocks;
  std::size_t high = 0;     // the highest top - base of the step (epoch): what the step needed of this chunk

  [[nodiscard]] std::size_t bytes() const noexcept { return static_cast<std::size_t>(limit - base); }
  [[nodiscard]] std::size_t used() const noexcept { return static_cast<std::size_t>(top - base); }
  [[nodiscard]] std::size_t room() const noexcept { return static_cast<std::size_t>(limit - top); }

  [[nodiscard]] bool contains(const void* p) const noexcept {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    return a >= reinterpret_cast<std::uintptr_t>(base) && a < reinterpret_cast<std::uintptr_t>(limit);
  }

  /// Brings a chunk of an older epoch into `now`: empty, capacity kept. O(1).
  void refresh(std::uint64_t now) noexcept {
    if (epoch == now) return;
    epoch = now;
    top = base;
    high = 0;
    blocks.clear();
  }

  /// The index of the block (or gap record) starting at `p` among the first `n` blocks (all of
  /// them by default), or n. O(log n).
  [[nodiscard]] std::size_t find(const void* p) const noexcept { return find(p, blocks.size()); }
  [[nodiscard]] std::size_t find(const void* p, std::size_t n) const noexcept {
    const auto key = reinterpret_cast<std::uintptr_t>(p);
    std::size_t lo = 0, hi = n;
    while (lo < hi) {
      std::size_t mid = lo + (hi - lo) / 2;
      if (reinterpret_cast<std::uintptr_t>(blocks[mid].start) < key) lo = mid + 1;
      else hi = mid;
    }
    return lo < n && blocks[lo].start == p ? lo : n;
  }

  /// Pops dead blocks (and gap records) off the top, so their space can be bumped into again;
  /// returns what it popped.
  dead_run pop_dead() noexcept {
    dead_run popped;
    for (; !blocks.empty() && !blocks.back().live(); blocks.pop_back()) {
      popped.bytes += static_cast<std::size_t>(blocks.back().end() - blocks.back().start);
      ++popped.records;
    }
    top = blocks.empty() ? base : blocks.back().end();
    return popped;
  }
};

}  // namespace vram::detail::activation_arena

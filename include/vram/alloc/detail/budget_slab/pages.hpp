#pragma once
// Internals of vram::budget_slab: the tunable constants, the size-class map, the page table
// entry, the free-run index over the budget's pages, a small spin lock, and the error that
// names both budgets. All metadata lives on the host: device memory is never read.

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include <vram/core/error.hpp>

namespace vram::detail::budget_slab {

// ---- tunable constants ----------------------------------------------------------------
/// The budget is cut into pages of this size: a slab of a size class is one page; a large
/// request takes a run of whole pages.
inline constexpr std::size_t page_bytes = std::size_t{64} << 10;
/// The smallest size class (and the alignment every block has at least).
inline constexpr std::size_t min_class = 256;
/// Size classes are powers of two from min_class; this many of them.
inline constexpr std::size_t class_count = 8;

// ---- derived constants ----------------------------------------------------------------
inline constexpr std::size_t max_class = min_class << (class_count - 1);  // 32 KiB
inline constexpr std::size_t max_blocks = page_bytes / min_class;         // blocks in a slab of min_class
inline constexpr std::size_t bitmap_words = max_blocks / 64;
inline constexpr std::size_t none = ~std::size_t{0};
static_assert(std::has_single_bit(page_bytes) && std::has_single_bit(min_class));
static_assert(max_class * 2 == page_bytes, "the largest class holds two blocks per slab");
static_assert(max_blocks % 64 == 0, "whole bitmap words");

/// The class of a request of `bytes` (<= max_class): the smallest power of two >= bytes.
[[nodiscard]] constexpr std::size_t class_of(std::size_t bytes) noexcept {
  return bytes <= min_class ? 0 : static_cast<std::size_t>(std::bit_width(bytes - 1)) - std::bit_width(min_class - 1);
}
[[nodiscard]] constexpr std::size_t class_bytes(std::size_t cls) noexcept { return min_class << cls; }
/// log2(class_bytes(cls)): block index == offset >> class_shift (shifts, not divisions, on the hot path).
[[nodiscard]] constexpr std::size_t class_shift(std::size_t cls) noexcept {
  return static_cast<std::size_t>(std::countr_zero(min_class)) + cls;
}
/// Blocks in a slab of class cls == page_bytes / class_bytes(cls).
[[nodiscard]] constexpr std::size_t class_blocks(std::size_t cls) noexcept { return max_blocks >> cls; }
static_assert(std::size_t{1} << class_shift(3) == class_bytes(3) && class_blocks(3) * class_bytes(3) == page_bytes);
static_assert(class_of(1) == 0 && class_of(256) == 0 && class_of(257) == 1 && class_of(max_class) == class_count - 1);

/// One page of the budget.
struct page {
  // freed: was a block start (run head or slab) and is free now, so a free of it is a double free.
  // Pages inside a run (not its head) keep whatever they were: never looked up as live.
  enum class kind : std::uint8_t { free, freed, slab, run_head };
  kind type = kind::free;
  std::uint8_t cls = 0;    // slab: the size class
  std::uint32_t used = 0;  // slab: live blocks == popcount(bits)
  std::size_t prev = none, next = none;  // slab: the class's list of slabs with a free block
  bool listed = false;                   // slab: on that list
  std::size_t run_pages = 0;             // run head: pages in the run
  std::size_t requested = 0;             // run head: the caller's size
  std::uint64_t bits[bitmap_words] = {};  // slab: 1 = live block
};

/// The free runs of pages, by address (for merging) and by size (for best fit): O(log n);
/// in front of them a small cache of free single pages, so that the common one-page take and
/// give (a new slab, a 64 KiB request) are O(1) and allocate nothing.
///   sum(count) over runs + cached == free pages;  runs never touch (merged on insert)
/// Cached pages are not merged with their neighbours: when a take finds no run, the cache is
/// flushed into the runs (merging) and the take retried, so a run is found whenever one exists.
class free_runs {
 public:
  /// Single pages kept out of the maps (4 MiB of a budget at most).
  static constexpr std::size_t cache_capacity = 64;

  /// Takes a run of n pages (best fit, lowest address among equals); none when no run fits.
  /// May throw bad_alloc (a map node) with nothing changed.
  std::size_t take(std::size_t n) {
    if (n == 1 && cached_ != 0) {
      --free_pages_;
      return cache_[--cached_];
    }
    std::size_t first = take_run(n);
    if (first == none && cached_ != 0) {
      flush();
      first = take_run(n);
    }
    return first;
  }

  /// Gives back [first, first + n), merging with free neighbours (a single page goes to the
  /// cache while it has room). May throw bad_alloc (a map node) with nothing changed.
  void give(std::size_t first, std::size_t n) {
    if (n == 1 && cached_ < cache_capacity) {
      cache_[cached_++] = first;
      ++free_pages_;
      return;
    }
    give_run(first, n);
    free_pages_ += n;
  }

  [[nodiscard]] std::size_t free_pages() const noexcept { return free_pages_; }
  /// Free runs as the caller sees them: each cached page counts as one.
  [[nodiscard]] std::size_t runs() const noexcept { return by_address_.size() + cached_; }
  /// The largest run that take() can find without flushing (a cached page counts as one).
  [[nodiscard]] std::size_t largest() const noexcept {
    std::size_t l = by_size_.empty() ? 0 : by_size_.rbegin()->first;
    return l == 0 && cached_ != 0 ? 1 : l;
  }
  [[nodiscard]] const std::map<std::size_t, std::size_t>& by_address() const noexcept { return by_address_; }
  [[nodiscard]] const std::size_t* cached_begin() const noexcept { return cache_; }
  [[nodiscard]] const std::size_t* cached_end() const noexcept { return cache_ + cached_; }

 private:
  std::size_t take_run(std::size_t n) {
    auto it = by_size_.lower_bound({n, 0});
    if (it == by_size_.end()) return none;
    auto [count, first] = *it;
    if (count > n) {  // the remainder's nodes first: a bad_alloc then changes nothing
      auto a = by_address_.emplace(first + n, count - n).first;
      try {
        by_size_.emplace(count - n, first + n);
      } catch (...) {
        by_address_.erase(a);
        throw;
      }
    }
    by_size_.erase(it);
    by_address_.erase(first);
    free_pages_ -= n;
    return first;
  }

  /// Merges [first, first + n) into the runs. Pre: none of its pages is free.
  void give_run(std::size_t first, std::size_t n) {
    std::size_t merged_first = first, merged_n = n;
    auto next = by_address_.find(first + n);
    auto after = by_address_.lower_bound(first);
    auto prev = by_address_.end();
    if (after != by_address_.begin() && std::prev(after)->first + std::prev(after)->second == first)
      prev = std::prev(after);
    if (prev != by_address_.end()) merged_first = prev->first, merged_n += prev->second;
    if (next != by_address_.end()) merged_n += next->second;
    // The merged run's nodes first (they may throw), then the old ones go (they cannot).
    auto sz = by_size_.emplace(merged_n, merged_first).first;
    if (prev == by_address_.end()) {
      try {
        by_address_.emplace(merged_first, merged_n);
      } catch (...) {
        by_size_.erase(sz);
        throw;
      }
    } else {
      by_size_.erase({prev->second, prev->first});
      prev->second = merged_n;
    }
    if (next != by_address_.end()) {
      by_size_.erase({next->second, next->first});
      by_address_.erase(next);
    }
  }

  /// Moves the cached pages into the runs (merging). A page whose node cannot be allocated
  /// stays cached.
  void flush() noexcept {
    while (cached_ != 0) {
      try {
        give_run(cache_[cached_ - 1], 1);
      } catch (...) {
        return;
      }
      --cached_;
    }
  }

  std::map<std::size_t, std::size_t> by_address_;           // first page -> count
  std::set<std::pair<std::size_t, std::size_t>> by_size_;  // (count, first page)
  std::size_t cache_[cache_capacity] = {};                 // free single pages, not in the maps
  std::size_t cached_ = 0;
  std::size_t free_pages_ = 0;
};

/// A test-and-test-and-set lock: the slab's critical sections are a few dozen instructions,
/// where a futex-based mutex costs more than the work; it yields when contended.
class spinlock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace vram::detail::budget_slab

#pragma once
// The tracker's live allocations by address: an open-addressing index (linear probing,
// backward-shift deletion) over a vector of records whose slots are reused. A std::unordered_map
// costs a heap node per allocation and a division per lookup; here an allocate + free pair
// allocates nothing once the table has grown, and a reused slot's tag string keeps its buffer.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <vram/adaptor/tracker_snapshot.hpp>

namespace vram::detail::tracker {

/// Invariants: every record with a non-null address is indexed exactly once, under its
/// address; free slots have a null address and are listed in free_; the index is at most half
/// full, and each key lies between its home bucket and the first empty bucket after it.
class live_table {
 public:
  static constexpr std::size_t npos = ~std::size_t{0};

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool contains(const void* p) const noexcept { return bucket_of(p) != npos; }

  [[nodiscard]] tracked_allocation* find(const void* p) noexcept {
    std::size_t b = bucket_of(p);
    return b == npos ? nullptr : &records_[index_[b].slot];
  }

  /// `p`'s record and false when it is live here; else a new record for `p` (its address
  /// set, the caller fills the rest) and true. One probe of the index. Throws std::bad_alloc
  /// having changed nothing.
  std::pair<tracked_allocation*, bool> find_or_insert(const void* p) {
    if ((size_ + 1) * 2 > index_.size()) grow();
    std::size_t b = home(p);
    for (; index_[b].key != nullptr; b = (b + 1) & mask())
      if (index_[b].key == p) return {&records_[index_[b].slot], false};
    return {&insert_at(b, p), true};
  }

  /// A record for `p`, which must not be live here, with its address set; the caller fills the
  /// rest. Throws std::bad_alloc having changed nothing.
  tracked_allocation& insert(const void* p) {
    if ((size_ + 1) * 2 > index_.size()) grow();
    std::size_t b = home(p);
    while (index_[b].key != nullptr) b = (b + 1) & mask();
    return insert_at(b, p);
  }

  /// Forgets `p`'s record (live here).
  void erase(const void* p) noexcept { erase_bucket(bucket_of(p)); }

  /// The bucket of `p`'s record, for record() and erase_bucket(); npos when `p` is not live.
  [[nodiscard]] std::size_t bucket_of(const void* p) const noexcept {
    if (size_ == 0 || p == nullptr) return npos;
    for (std::size_t b = home(p); index_[b].key != nullptr; b = (b + 1) & mask())
      if (index_[b].key == p) return b;
    return npos;
  }
  [[nodiscard]] tracked_allocation& record(std::size_t bucket) noexcept { return records_[index_[bucket].slot]; }

  /// Forgets the record in `bucket` (from bucket_of, with no insert or erase since); npos: nothing.
  /// Always inlined: on the tracker's free path the call cost a tracked pair about 1.5 ns.
  [[gnu::always_inline]] void erase_bucket(std::size_t hole) noexcept {
    if (hole == npos) return;
    const std::size_t slot = index_[hole].slot;
    records_[slot].address = nullptr;
    records_[slot].frames.clear();
    free_.push_back(slot);  // capacity reserved by insert
    --size_;
    // Backward shift: move later keys of the run into the hole where their home allows.
    for (std::size_t b = (hole + 1) & mask(); index_[b].key != nullptr; b = (b + 1) & mask()) {
      const std::size_t h = home(index_[b].key);
      const bool movable = hole <= b ? (h <= hole || h > b) : (h <= hole && h > b);
      if (!movable) continue;
      index_[hole] = index_[b];
      hole = b;
    }
    index_[hole] = {};
  }

  /// Calls f(const tracked_allocation&) on every live record, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const tracked_allocation& r : records_)
      if (r.address != nullptr) f(r);
  }

 private:
  struct bucket {
    const void* key = nullptr;
    std::size_t slot = 0;
  };

  /// Takes a free slot for `p` and indexes it in the empty bucket `b`. Throws std::bad_alloc
  /// (before the index changes).
  tracked_allocation& insert_at(std::size_t b, const void* p) {
    if (free_.empty()) {
      // Room in free_ for every slot, so that erase cannot throw.
      if (free_.capacity() < records_.size() + 1) free_.reserve(2 * records_.size() + 16);
      records_.emplace_back();
      free_.push_back(records_.size() - 1);
    }
    const std::size_t slot = free_.back();
    free_.pop_back();
    index_[b] = {p, slot};
    ++size_;
    records_[slot].address = p;
    return records_[slot];
  }

  [[nodiscard]] std::size_t mask() const noexcept { return index_.size() - 1; }
  [[nodiscard]] std::size_t home(const void* p) const noexcept {
    // Fibonacci hashing of the address: its low bits are alignment, its high bits alike.
    const auto h = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h >> (64 - std::countr_zero(index_.size())));
  }

  void grow() {
    std::vector<bucket> bigger(index_.empty() ? 64 : index_.size() * 2);
    std::swap(index_, bigger);  // bigger holds the old index now
    for (const bucket& old : bigger) {
      if (old.key == nullptr) continue;
      std::size_t b = home(old.key);
      while (index_[b].key != nullptr) b = (b + 1) & mask();
      index_[b] = old;
    }
  }

  std::vector<bucket> index_;              // size a power of two (or empty)
  std::vector<tracked_allocation> records_;
  std::vector<std::size_t> free_;          // slots of records_ with a null address
  std::size_t size_ = 0;
};

}  // namespace vram::detail::tracker

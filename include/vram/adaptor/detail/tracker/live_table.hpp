#pragma once
// The tracker's live allocations by address: open addressing (linear probing, backward-shift
// deletion) with the records in the buckets themselves. A std::unordered_map costs a heap node
// per allocation and a division per lookup; an index of slots into a separate array of
// records, one more dependent load per lookup and a free list to keep. Here a lookup is the
// hash and the bucket's line, and an allocate + free pair allocates nothing once the table
// has grown.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <vram/adaptor/tracker_snapshot.hpp>

namespace vram::detail::tracker {

/// One live allocation as the tracker keeps it: a tracked_allocation whose tag is the
/// tracker's one copy (tag_table), not a string of its own.
struct live_record {
  const void* address = nullptr;
  std::size_t bytes = 0;
  tenant owner;
  const std::string* tag = nullptr;  // nullptr: untagged
  std::uint64_t stream = 0;
  std::int64_t time_us = 0;
  std::vector<void*> frames;  // native return addresses, innermost first (empty unless captured)

  [[nodiscard]] tracked_allocation copy() const {
    return {address, bytes, owner, tag != nullptr ? *tag : std::string(), stream, time_us, frames};
  }
};

/// Invariants: the buckets are a power of two in number (or none); a bucket with a non-null
/// address holds that address's record, and no two hold the same address; at most half of
/// them are taken, and each record lies between its home bucket and the first empty bucket
/// after it. A record's address (and a bucket number) stays valid until the next insert or
/// erase: both move records.
class live_table {
 public:
  static constexpr std::size_t npos = ~std::size_t{0};

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool contains(const void* p) const noexcept { return bucket_of(p) != npos; }

  [[nodiscard]] live_record* find(const void* p) noexcept {
    std::size_t b = bucket_of(p);
    return b == npos ? nullptr : &buckets_[b];
  }

  /// `p`'s record and false when it is live here; else a new record for `p` (its address
  /// set, the caller fills the rest) and true. One probe. Throws std::bad_alloc having
  /// changed nothing. Always inlined, as bucket_of and erase_bucket: on the tracker's
  /// allocation path, where GCC left it out of line, the call cost a tracked pair 1-2 ns
  /// (bench.adaptor_overhead, pool/tracker_adaptor).
  [[gnu::always_inline]] std::pair<live_record*, bool> find_or_insert(const void* p) {
    if ((size_ + 1) * 2 > mask_ + 1) grow();  // not size(): a division by the record's size
    std::size_t b = home(p);
    for (; buckets_[b].address != nullptr; b = (b + 1) & mask_)
      if (buckets_[b].address == p) return {&buckets_[b], false};
    return {&take(b, p), true};
  }

  /// A record for `p`, which must not be live here, with its address set; the caller fills the
  /// rest. Throws std::bad_alloc having changed nothing.
  live_record& insert(const void* p) {
    if ((size_ + 1) * 2 > mask_ + 1) grow();  // not size(): a division by the record's size
    std::size_t b = home(p);
    while (buckets_[b].address != nullptr) b = (b + 1) & mask_;
    return take(b, p);
  }

  /// Forgets `p`'s record (live here).
  void erase(const void* p) noexcept { erase_bucket(bucket_of(p)); }

  /// The bucket of `p`'s record, for record() and erase_bucket(); npos when `p` is not live.
  [[nodiscard, gnu::always_inline]] std::size_t bucket_of(const void* p) const noexcept {
    if (size_ == 0 || p == nullptr) return npos;
    for (std::size_t b = home(p); buckets_[b].address != nullptr; b = (b + 1) & mask_)
      if (buckets_[b].address == p) return b;
    return npos;
  }
  [[nodiscard]] live_record& record(std::size_t bucket) noexcept { return buckets_[bucket]; }

  /// Forgets the record in `bucket` (from bucket_of, with no insert or erase since); npos: nothing.
  [[gnu::always_inline]] void erase_bucket(std::size_t hole) noexcept {
    if (hole == npos) return;
    --size_;
    // Backward shift: move later records of the run into the hole where their home allows.
    for (std::size_t b = (hole + 1) & mask_; buckets_[b].address != nullptr; b = (b + 1) & mask_) {
      const std::size_t h = home(buckets_[b].address);
      const bool movable = hole <= b ? (h <= hole || h > b) : (h <= hole && h > b);
      if (!movable) continue;
      buckets_[hole] = std::move(buckets_[b]);
      hole = b;
    }
    buckets_[hole].address = nullptr;
    buckets_[hole].frames.clear();
  }

  /// Calls f(const live_record&) on every live record, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const live_record& r : buckets_)
      if (r.address != nullptr) f(r);
  }

 private:
  live_record& take(std::size_t b, const void* p) noexcept {
    ++size_;
    buckets_[b].address = p;
    return buckets_[b];
  }

  [[nodiscard]] std::size_t home(const void* p) const noexcept {
    // Fibonacci hashing of the address: its low bits are alignment, its high bits alike.
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(p) * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  [[gnu::noinline]] void grow() {
    std::vector<live_record> bigger(buckets_.empty() ? 64 : buckets_.size() * 2);
    std::swap(buckets_, bigger);  // bigger holds the old records now
    mask_ = buckets_.size() - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(buckets_.size()));
    for (live_record& old : bigger) {
      if (old.address == nullptr) continue;
      std::size_t b = home(old.address);
      while (buckets_[b].address != nullptr) b = (b + 1) & mask_;
      buckets_[b] = std::move(old);
    }
  }

  std::vector<live_record> buckets_;
  std::size_t mask_ = 0;  // buckets_.size() - 1 (0 while there are none)
  unsigned shift_ = 64;   // 64 - log2(buckets_.size()): home() keeps the product's top bits
  std::size_t size_ = 0;
};

}  // namespace vram::detail::tracker

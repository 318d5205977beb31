#pragma once
// vram::peers::torch_caching_model: the algorithm of PyTorch's CUDA caching allocator
// (DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp, native backend), rebuilt as a
// peer for vram-replay, so that what PyTorch would reserve for a trace is measured in the same
// run as vram's own allocators, and a PyTorch snapshot can be replayed against the allocator
// that recorded it.
//
// What it reproduces (PEERS.md, "PyTorch's CUDA caching allocator"; the names are PyTorch's):
// - round_size: every request rounded up to kMinBlockSize (512 B);
// - get_pool: a rounded size ≤ kSmallSize (1 MiB) is served by the small pool, any other by the
//   large pool; the pools never lend to each other;
// - get_allocation_size: a new segment is kSmallBuffer (2 MiB) for the small pool, kLargeBuffer
//   (20 MiB) for sizes below kMinLargeAlloc (10 MiB), else the size rounded up to kRoundLarge
//   (2 MiB);
// - BlockComparatorSize + get_free_block: each pool's free blocks in one set ordered by
//   (stream, size, address); best fit is lower_bound(stream, size), taken only if it is on the
//   request's stream: a block is reused only on the stream it was allocated on, whatever
//   stream frees it;
// - should_split: a small-pool block is split if ≥ kMinBlockSize remains, a large-pool block
//   only if the request is below max_split_size and > kSmallSize remains; the remainder stays
//   free in the same pool;
// - get_free_block's max_split_size rules: a request below max_split_size never takes a free
//   block of max_split_size or more; a larger request takes one only if it wastes less than
//   kLargeBuffer;
// - free_block + try_merge_blocks: a freed block merges with its free neighbours in its
//   segment (segments never merge with each other);
// - malloc's path when no free block fits: alloc_block (the segment from the upstream), then
//   release_available_cached_blocks (only where max_split_size is set: frees unsplit oversize
//   segments of the stream, the smallest that is large enough, else the largest down) and
//   retry, then release_cached_blocks (frees every unsplit free segment of both pools and all
//   streams: empty_cache) and retry; then out_of_memory, with the cached segments already
//   released, as PyTorch leaves them.
// Only the default options: no expandable_segments, no roundup_power2_divisions, no
// garbage_collection_threshold, no per-process memory fraction (the upstream's capacity plays
// that part), no CUDA graph pools; max_split_size is unlimited unless given.
// What it leaves out: CUDA events and record_stream (the replay's host streams carry no work,
// so a freed block is free at once, as PyTorch's is when no other stream used it), the
// free-memory callbacks, and the statistics' split into pools. This is a measuring instrument,
// not an allocator to use: it does not order streams.
//
// Thread safety: one mutex per resource (PyTorch holds one per device). Alignment: 512 B, the
// most it guarantees. Owns its upstream; every segment goes back to it at destruction.
// Complexity: O(log n) per allocation and free in the blocks held.
//
// Misuse (a foreign pointer, a second free, a size that rounds to another request's) is
// reported through the error handler and changes nothing.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <vram/core/alignment.hpp>
#include <vram/core/error.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/throw.hpp>

namespace vram::peers {

template <class Upstream>
class torch_caching_model {
 public:
  // PyTorch's constants, under its names.
  static constexpr std::size_t min_block_size = 512;                     // kMinBlockSize
  static constexpr std::size_t small_size = std::size_t{1} << 20;        // kSmallSize
  static constexpr std::size_t small_buffer = std::size_t{2} << 20;      // kSmallBuffer
  static constexpr std::size_t large_buffer = std::size_t{20} << 20;     // kLargeBuffer
  static constexpr std::size_t min_large_alloc = std::size_t{10} << 20;  // kMinLargeAlloc
  static constexpr std::size_t round_large = std::size_t{2} << 20;       // kRoundLarge
  /// max_split_size's default: no limit.
  static constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();
  static_assert(small_buffer % min_block_size == 0 && small_buffer > small_size);
  static_assert(large_buffer % round_large == 0 && large_buffer >= min_large_alloc);
  static_assert(min_large_alloc > small_size && round_large % min_block_size == 0);

  /// Every block is a multiple of it and starts at a multiple of it.
  static constexpr std::size_t alignment = min_block_size;

  [[nodiscard]] static constexpr const char* name() noexcept { return "torch_caching_model"; }

  /// PyTorch's round_size (roundup_power2_divisions off).
  [[nodiscard]] static constexpr std::size_t round_size(std::size_t bytes) noexcept {
    return bytes < min_block_size ? min_block_size : align_up(bytes, min_block_size);
  }
  /// PyTorch's get_allocation_size: the segment a rounded `size` gets when no block fits.
  [[nodiscard]] static constexpr std::size_t allocation_size(std::size_t size) noexcept {
    if (size <= small_size) return small_buffer;
    if (size < min_large_alloc) return large_buffer;
    return align_up(size, round_large);
  }

  /// `max_split_size`: PYTORCH_CUDA_ALLOC_CONF's max_split_size_mb in bytes. Throws
  /// vram::invalid_argument unless it exceeds kLargeBuffer, as PyTorch's parser requires.
  explicit torch_caching_model(Upstream upstream, std::size_t max_split_size = unlimited)
      : upstream_(std::move(upstream)), max_split_size_(max_split_size) {
    if (max_split_size <= large_buffer)
      detail::throw_invalid_argument(name(), "max_split_size must exceed kLargeBuffer (20 MiB), as in PyTorch");
  }
  torch_caching_model(const torch_caching_model&) = delete;
  torch_caching_model& operator=(const torch_caching_model&) = delete;
  ~torch_caching_model() {
    for (const auto& [ptr, seg] : segments_) upstream_.deallocate_sync(ptr, seg.size, alignment);
  }

  /// Throws out_of_memory when the upstream refuses the segment even after the cached
  /// segments were released (they stay released); invalid_argument for an alignment above
  /// 512 B or a request beyond max_request_bytes.
  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (align > alignment) detail::throw_invalid_argument(name(), "alignment above 512 bytes (kMinBlockSize)");
    if (bytes == 0) return nullptr;
    std::lock_guard lock(mutex_);
    const std::size_t size = round_size(bytes);
    const bool small = size <= small_size;
    const std::uintptr_t stream = s.key();
    auto found = take_free_block(small, stream, size);
    if (found == blocks_.end()) found = new_segment(small, stream, size, bytes, s);
    block& b = found->second;
    if (should_split(b, size)) {
      block rest{b.segment, b.size - size, stream, small, false, 0};
      b.size = size;
      auto r = blocks_.emplace_hint(std::next(found), found->first + size, rest);
      pools_[small].insert(key_of(*r));
    }
    b.allocated = true;
    b.requested = bytes;
    live_ += b.size;
    requested_ += bytes;
    ++allocations_;
    peak_live_ = std::max(peak_live_, live_);
    peak_requested_ = std::max(peak_requested_, requested_);
    return found->first;
  }

  /// Returns the block to the pool of the stream it was allocated on (PyTorch's block->stream),
  /// merged with its free neighbours; the freeing stream is not consulted.
  void deallocate(stream_ref, void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    if (p == nullptr || bytes == 0) return;
    std::unique_lock lock(mutex_);
    auto it = blocks_.find(static_cast<char*>(p));
    if (it == blocks_.end() || !it->second.allocated || round_size(bytes) != round_size(it->second.requested)) {
      misuse kind = it == blocks_.end() ? misuse::foreign_pointer
                    : !it->second.allocated ? misuse::double_free
                                            : misuse::wrong_size;
      std::size_t expected = kind == misuse::wrong_size ? round_size(it->second.requested) : 0;
      lock.unlock();
      report_misuse({kind, name(), p, bytes, expected});
      return;
    }
    block& b = it->second;
    live_ -= b.size;
    requested_ -= b.requested;
    ++deallocations_;
    b.allocated = false;
    b.requested = 0;
    if (auto next = std::next(it); next != blocks_.end() && mergeable(b, next->second)) {
      pools_[b.small].erase(key_of(*next));
      b.size += next->second.size;
      blocks_.erase(next);
    }
    if (it != blocks_.begin())
      if (auto prev = std::prev(it); mergeable(prev->second, b)) {
        pools_[b.small].erase(key_of(*prev));
        prev->second.size += b.size;
        blocks_.erase(it);
        it = prev;
      }
    pools_[it->second.small].insert(key_of(*it));
  }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) { return allocate({}, bytes, align); }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate({}, p, bytes, align);
  }
  friend bool operator==(const torch_caching_model& a, const torch_caching_model& b) noexcept { return &a == &b; }

  /// Calls f(bytes) for every free block of both pools.
  template <class F>
  void for_each_free_block(F&& f) const {
    std::lock_guard lock(mutex_);
    for (const auto& pool : pools_)
      for (const free_key& k : pool) f(k.size);
  }

  /// torch.cuda.empty_cache(): every free segment that is not split goes back upstream.
  void release_cached_segments() noexcept {
    std::lock_guard lock(mutex_);
    release_cached_blocks();
  }

  /// Throws std::logic_error unless: the blocks tile every segment exactly, each with its
  /// segment's stream and pool; no two free neighbours are left unmerged; the pools' sets hold
  /// exactly the free blocks; a small segment is kSmallBuffer; the byte counts agree.
  void check_invariants() const {
    std::lock_guard lock(mutex_);
    auto fail = [](const char* what) { throw std::logic_error(std::string("torch_caching_model invariant: ") + what); };
    std::size_t live = 0, reserved = 0, free_blocks = 0;
    auto it = blocks_.begin();
    for (const auto& [base, seg] : segments_) {
      reserved += seg.size;
      if (seg.small && seg.size != small_buffer) fail("a small segment that is not kSmallBuffer");
      if (!seg.small && seg.size % round_large != 0) fail("a large segment that is not a multiple of kRoundLarge");
      char* at = base;
      bool previous_free = false;
      for (; it != blocks_.end() && it->first < base + seg.size; ++it) {
        const block& b = it->second;
        if (it->first != at) fail("blocks overlap or leave a gap in a segment");
        if (b.segment != base || b.stream != seg.stream || b.small != seg.small) fail("a block's segment, stream or pool");
        if (b.size == 0 || b.size % min_block_size != 0) fail("block size");
        if (!b.allocated && previous_free) fail("free neighbours not merged");
        if (b.allocated) live += b.size;
        else if (pools_[b.small].count(key_of(*it)) != 1) fail("a free block missing from its pool");
        else ++free_blocks;
        previous_free = !b.allocated;
        at += b.size;
      }
      if (at != base + seg.size) fail("blocks do not end at their segment's end");
    }
    if (it != blocks_.end()) fail("a block outside every segment");
    if (pools_[0].size() + pools_[1].size() != free_blocks) fail("a pool holds a block that is not free");
    if (live != live_) fail("live bytes disagree with the allocated blocks");
    if (reserved != reserved_) fail("reserved bytes disagree with the segments");
  }

  [[nodiscard]] vram::stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_locked();
  }

 private:
  struct block {
    char* segment = nullptr;  // the segment's base
    std::size_t size = 0;
    std::uintptr_t stream = 0;  // the segment's stream: a block is reused only on it
    bool small = false;         // in the small pool
    bool allocated = false;
    std::size_t requested = 0;  // allocated: what the caller asked for
  };
  struct segment {
    std::size_t size = 0;
    std::uintptr_t stream = 0;
    bool small = false;
  };
  /// BlockComparatorSize's order: stream, then size, then address.
  struct free_key {
    std::uintptr_t stream;
    std::size_t size;
    char* ptr;
    friend auto operator<=>(const free_key&, const free_key&) = default;
  };
  using block_map = std::map<char*, block>;

  static free_key key_of(const typename block_map::value_type& b) noexcept {
    return {b.second.stream, b.second.size, b.first};
  }
  /// try_merge_blocks' condition: `next` follows `b` in the same segment and both are free.
  static bool mergeable(const block& b, const block& next) noexcept {
    return !b.allocated && !next.allocated && b.segment == next.segment;
  }
  [[nodiscard]] bool unsplit(const typename block_map::value_type& b) const noexcept {
    return b.first == b.second.segment && b.second.size == segments_.at(b.first).size;
  }
  [[nodiscard]] bool should_split(const block& b, std::size_t size) const noexcept {
    const std::size_t remaining = b.size - size;
    return b.small ? remaining >= min_block_size : size < max_split_size_ && remaining > small_size;
  }

  /// get_free_block: the best fit on the stream, removed from its pool; end() if none.
  typename block_map::iterator take_free_block(bool small, std::uintptr_t stream, std::size_t size) {
    auto& pool = pools_[small];
    auto it = pool.lower_bound({stream, size, nullptr});
    if (it == pool.end() || it->stream != stream) return blocks_.end();
    if (size < max_split_size_ && it->size >= max_split_size_) return blocks_.end();
    if (size >= max_split_size_ && it->size >= size + large_buffer) return blocks_.end();
    auto b = blocks_.find(it->ptr);
    pool.erase(it);
    return b;
  }

  /// alloc_block with malloc's retries; the segment's one block, not in its pool.
  typename block_map::iterator new_segment(bool small, std::uintptr_t stream, std::size_t size, std::size_t bytes,
                                           stream_ref s) {
    const std::size_t alloc_size = allocation_size(size);
    char* p = try_upstream(alloc_size);
    if (p == nullptr && release_available_cached_blocks(small, stream, size)) p = try_upstream(alloc_size);
    if (p == nullptr) {
      release_cached_blocks();
      p = try_upstream(alloc_size);
    }
    if (p == nullptr) {
      ++ooms_;
      detail::throw_out_of_memory(name(), bytes, s, stats_locked());
    }
    segments_.emplace(p, segment{alloc_size, stream, small});
    reserved_ += alloc_size;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++segments_allocated_;
    return blocks_.emplace(p, block{p, alloc_size, stream, small, false, 0}).first;
  }

  char* try_upstream(std::size_t size) {
    try {
      return static_cast<char*>(upstream_.allocate_sync(size, alignment));
    } catch (const out_of_memory&) {
      return nullptr;
    }
  }

  /// release_block: an unsplit free segment back to the upstream.
  void release(char* base) noexcept {
    auto b = blocks_.find(base);
    pools_[b->second.small].erase(key_of(*b));
    const std::size_t size = b->second.size;
    blocks_.erase(b);
    segments_.erase(base);
    upstream_.deallocate_sync(base, size, alignment);
    reserved_ -= size;
    ++segments_released_;
  }

  /// release_available_cached_blocks: nothing unless max_split_size is set; then the smallest
  /// unsplit free block of the stream of at least max(size, max_split_size), else the largest
  /// ones of max_split_size or more down until that much is released.
  bool release_available_cached_blocks(bool small, std::uintptr_t stream, std::size_t size) {
    if (max_split_size_ == unlimited) return false;
    auto& pool = pools_[small];
    const std::size_t want = std::max(size, max_split_size_);
    auto it = pool.lower_bound({stream, want, nullptr});
    if (it != pool.end() && it->stream == stream) {
      if (!unsplit(*blocks_.find(it->ptr))) return false;  // PyTorch cannot free it either
      release(it->ptr);
      return true;
    }
    std::size_t released = 0;
    std::vector<char*> oversize;  // largest first
    for (auto r = std::make_reverse_iterator(it); r != pool.rend() && r->stream == stream && r->size >= max_split_size_;
         ++r)
      if (unsplit(*blocks_.find(r->ptr))) oversize.push_back(r->ptr);
    for (char* p : oversize) {
      if (released >= want) break;
      released += segments_.at(p).size;
      release(p);
    }
    return released >= want;
  }

  /// release_cached_blocks: every unsplit free segment of both pools, all streams.
  void release_cached_blocks() noexcept {
    std::vector<char*> whole;
    for (const auto& pool : pools_)
      for (const free_key& k : pool)
        if (unsplit(*blocks_.find(k.ptr))) whole.push_back(k.ptr);
    for (char* p : whole) release(p);
  }

  vram::stats stats_locked() const {
    vram::stats st{.live_bytes = live_, .requested_bytes = requested_, .reserved_bytes = reserved_,
                   .peak_live_bytes = peak_live_, .peak_requested_bytes = peak_requested_,
                   .peak_reserved_bytes = peak_reserved_, .live_allocations = allocations_ - deallocations_,
                   .total_allocations = allocations_, .total_deallocations = deallocations_,
                   .free_bytes = reserved_ - live_};
    for (const auto& pool : pools_)
      for (const free_key& k : pool) {
        ++st.free_blocks;
        st.largest_free_block = std::max(st.largest_free_block, k.size);
      }
    st.upstream_allocations = segments_allocated_;
    st.upstream_deallocations = segments_released_;
    st.ooms = ooms_;
    return st;
  }

  Upstream upstream_;
  const std::size_t max_split_size_;
  mutable std::mutex mutex_;
  block_map blocks_;                         // every block of every segment, by address
  std::set<free_key> pools_[2];              // [0] large_blocks, [1] small_blocks: exactly the free blocks
  std::map<char*, segment> segments_;        // by base; reserved_ == sum of their sizes
  std::size_t reserved_ = 0, peak_reserved_ = 0;
  std::size_t live_ = 0, requested_ = 0, peak_live_ = 0, peak_requested_ = 0;  // live_ == sum of allocated blocks
  std::size_t allocations_ = 0, deallocations_ = 0;
  std::size_t segments_allocated_ = 0, segments_released_ = 0, ooms_ = 0;
};

}  // namespace vram::peers

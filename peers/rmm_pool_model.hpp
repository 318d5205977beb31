#pragma once
// vram::peers::rmm_pool_model: the algorithm of RMM's pool (pool_memory_resource over
// stream_ordered_memory_resource with a coalescing_free_list), rebuilt as a peer for
// vram-replay, so that its placement and host cost are measured in the same run as vram's own
// allocators instead of quoted from another machine or another day.
//
// What it reproduces (PEERS.md, "RMM"):
// - one mutex per resource; every request rounded up to 256 bytes;
// - one free list per stream: a std::list ordered by address; best fit scans the whole list
//   (the smallest block that fits, the first of equals), a free searches linearly for its
//   place and merges with the neighbours it touches unless a neighbour starts an upstream
//   allocation (upstream allocations never merge); allocated blocks in a std::set by address;
// - an allocation tries its stream's list, then each other stream's list, then merges the
//   other lists into its own one by one until a block fits, then grows: by max(request,
//   pool size) (doubling, no maximum), halving the attempt down to the request while the
//   upstream refuses; the remainder of a split block goes back to the list it came from;
// - nothing returns upstream before destruction.
// What it leaves out: CUDA events. RMM records one on the freeing stream at every free and
// makes the allocating stream wait on it before it takes another stream's block. The replay's
// host streams carry no work, so that order is moot there, and its figures omit the cost of
// cudaEventRecord (a driver call on every free). This is a measuring instrument, not an
// allocator to use: it does not order streams.
//
// Misuse (a foreign pointer, a size that rounds to another block's) is reported through the
// error handler and changes nothing (RMM only asserts in debug builds).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <vram/core/alignment.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/throw.hpp>

namespace vram::peers {

template <class Upstream>
class rmm_pool_model {
 public:
  /// RMM's CUDA_ALLOCATION_ALIGNMENT: every size is rounded up to it, and no larger
  /// alignment can be asked for.
  static constexpr std::size_t alignment = 256;

  [[nodiscard]] static constexpr const char* name() noexcept { return "rmm_pool_model"; }

  /// A pool that starts with `initial_size` bytes (0: none; the first request grows it).
  explicit rmm_pool_model(Upstream upstream, std::size_t initial_size = 0) : upstream_(std::move(upstream)) {
    if (initial_size > 0) {
      std::size_t size = round(initial_size);
      lists_[0].insert(grow(size, size, stream_ref{}));
    }
  }
  rmm_pool_model(const rmm_pool_model&) = delete;
  rmm_pool_model& operator=(const rmm_pool_model&) = delete;
  ~rmm_pool_model() {
    for (const block& b : upstream_blocks_) upstream_.deallocate_sync(b.ptr, b.size, alignment);
  }

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (align > alignment) detail::throw_invalid_argument(name(), "alignment above 256 bytes (RMM's limit)");
    if (bytes == 0) return nullptr;
    std::lock_guard lock(mutex_);
    const std::size_t size = round(bytes);
    block b = take(size, bytes, s);
    live_ += size;
    requested_ += bytes;
    ++allocations_;
    peak_live_ = std::max(peak_live_, live_);
    peak_requested_ = std::max(peak_requested_, requested_);
    return b.ptr;
  }

  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    if (p == nullptr || bytes == 0) return;
    std::unique_lock lock(mutex_);
    auto it = allocated_.find(static_cast<char*>(p));
    if (it == allocated_.end() || it->size != round(bytes)) {
      misuse kind = it == allocated_.end() ? misuse::foreign_pointer : misuse::wrong_size;
      std::size_t expected = it == allocated_.end() ? 0 : it->size;
      lock.unlock();
      report_misuse({kind, name(), p, bytes, expected});
      return;
    }
    block b = *it;
    allocated_.erase(it);
    lists_[s.key()].insert(b);
    live_ -= b.size;
    requested_ -= b.requested;
    ++deallocations_;
  }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) { return allocate({}, bytes, align); }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate({}, p, bytes, align);
  }
  friend bool operator==(const rmm_pool_model& a, const rmm_pool_model& b) noexcept { return &a == &b; }

  /// Throws std::logic_error unless: each free list is in address order with no two blocks
  /// that should have merged; free and allocated blocks tile the upstream allocations exactly
  /// (no overlap, no gap); the byte counts agree.
  void check_invariants() const {
    std::lock_guard lock(mutex_);
    auto fail = [](const char* what) { throw std::logic_error(std::string("rmm_pool_model invariant: ") + what); };
    std::vector<block> all(allocated_.begin(), allocated_.end());
    std::size_t live = 0;
    for (const block& b : allocated_) live += b.size;
    if (live != live_) fail("live bytes disagree with the allocated blocks");
    for (const auto& [key, list] : lists_) {
      for (auto it = list.blocks.begin(); it != list.blocks.end(); ++it) {
        if (it->size == 0 || it->size % alignment != 0) fail("free block size");
        if (auto next = std::next(it); next != list.blocks.end()) {
          if (next->ptr <= it->ptr) fail("free list out of address order");
          if (it->touches(*next)) fail("free neighbours not merged");
        }
        all.push_back(*it);
      }
    }
    std::sort(all.begin(), all.end(), by_address{});
    std::vector<block> heads(upstream_blocks_);
    std::sort(heads.begin(), heads.end(), by_address{});
    std::size_t i = 0, total = 0;
    for (const block& h : heads) {  // the blocks from i on must tile h exactly
      if (i == all.size() || all[i].ptr != h.ptr || !all[i].head) fail("an upstream allocation's first block");
      char* at = h.ptr;
      for (; i < all.size() && all[i].ptr < h.ptr + h.size; ++i) {
        if (all[i].ptr != at) fail("blocks overlap or leave a gap");
        if (all[i].head != (at == h.ptr)) fail("head flag");
        at += all[i].size;
      }
      if (at != h.ptr + h.size) fail("blocks overrun an upstream allocation");
      total += h.size;
    }
    if (i != all.size()) fail("a block outside every upstream allocation");
    if (total != pool_size_) fail("pool size disagrees with the upstream allocations");
  }

  [[nodiscard]] vram::stats stats() const {
    std::lock_guard lock(mutex_);
    return stats_locked();
  }

  /// Calls f(bytes) for every block of every stream's free list.
  template <class F>
  void for_each_free_block(F&& f) const {
    std::lock_guard lock(mutex_);
    for (const auto& [key, list] : lists_)
      for (const block& b : list.blocks) f(b.size);
  }

 private:
  struct block {
    char* ptr = nullptr;
    std::size_t size = 0;
    bool head = false;  // starts an upstream allocation: nothing merges into it from below
    std::size_t requested = 0;  // allocated: what the caller asked for (for stats only)

    [[nodiscard]] bool touches(const block& next) const noexcept { return ptr + size == next.ptr && !next.head; }
  };
  struct by_address {
    using is_transparent = void;
    bool operator()(const block& a, const block& b) const noexcept { return a.ptr < b.ptr; }
    bool operator()(const block& a, const char* p) const noexcept { return a.ptr < p; }
    bool operator()(const char* p, const block& b) const noexcept { return p < b.ptr; }
  };

  /// RMM's coalescing_free_list. Invariant: blocks in increasing address order, no two of
  /// them touching (they would have merged) unless the second starts an upstream allocation.
  struct free_list {
    std::list<block> blocks;

    /// Inserts b in address order, merging it with the neighbours it touches. O(n).
    void insert(block b) {
      auto next = std::find_if(blocks.begin(), blocks.end(), [&](const block& x) { return b.ptr < x.ptr; });
      auto prev = next == blocks.begin() ? blocks.end() : std::prev(next);
      bool merge_prev = prev != blocks.end() && prev->touches(b);
      bool merge_next = next != blocks.end() && b.touches(*next);
      if (merge_prev && merge_next) {
        prev->size += b.size + next->size;
        blocks.erase(next);
      } else if (merge_prev) {
        prev->size += b.size;
      } else if (merge_next) {
        next->ptr = b.ptr;
        next->size += b.size;
        next->head = b.head;
      } else {
        blocks.insert(next, b);
      }
    }

    /// Removes and returns the smallest block of at least `size` bytes (the lowest address of
    /// equals), or a block of size 0. O(n): a scan of the whole list.
    block take_best_fit(std::size_t size) {
      auto best = blocks.end();
      for (auto it = blocks.begin(); it != blocks.end(); ++it)
        if (it->size >= size && (best == blocks.end() || it->size < best->size)) best = it;
      if (best == blocks.end()) return {};
      block b = *best;
      blocks.erase(best);
      return b;
    }
  };

  static std::size_t round(std::size_t bytes) noexcept { return align_up(bytes, alignment); }

  /// A block of `size` bytes for stream s, in RMM's order: own list, others' lists, others
  /// merged into its own, growth.
  block take(std::size_t size, std::size_t requested, stream_ref s) {
    const std::uintptr_t key = s.key();
    auto own = lists_.find(key);
    if (own != lists_.end())
      if (block b = own->second.take_best_fit(size); b.size != 0) return split(b, size, requested, own->second);
    for (auto& [k, list] : lists_)
      if (k != key)
        if (block b = list.take_best_fit(size); b.size != 0) return split(b, size, requested, list);
    free_list& mine = lists_[key];
    for (auto it = lists_.begin(); it != lists_.end();) {
      if (it->first == key) {
        ++it;
        continue;
      }
      for (const block& b : it->second.blocks) mine.insert(b);
      it = lists_.erase(it);
      if (block b = mine.take_best_fit(size); b.size != 0) return split(b, size, requested, mine);
    }
    return split(grow(std::max(size, pool_size_), size, s), size, requested, mine);
  }

  /// Hands out the first `size` bytes of b; the rest goes back to `list`.
  block split(block b, std::size_t size, std::size_t requested, free_list& list) {
    allocated_.insert({b.ptr, size, b.head, requested});
    if (b.size > size) list.insert({b.ptr + size, b.size - size, false});
    return {b.ptr, size, b.head, requested};
  }

  /// One upstream allocation of `attempt` bytes, halved down to `need` while the upstream
  /// refuses; out_of_memory when even `need` is refused, with no block or byte changed (the
  /// other streams' lists may have been merged into the caller's by then, as in RMM).
  block grow(std::size_t attempt, std::size_t need, stream_ref s) {
    upstream_blocks_.reserve(upstream_blocks_.size() + 1);  // so recording it cannot throw
    for (;;) {
      try {
        auto* p = static_cast<char*>(upstream_.allocate_sync(attempt, alignment));
        block b{p, attempt, true};
        upstream_blocks_.push_back(b);
        pool_size_ += attempt;
        return b;
      } catch (const out_of_memory&) {
        if (attempt == need) detail::throw_out_of_memory(name(), need, s, stats_locked());
        attempt = std::max(need, attempt / 2);
      }
    }
  }

  vram::stats stats_locked() const {
    vram::stats st;
    st.live_bytes = live_;
    st.requested_bytes = requested_;
    st.reserved_bytes = pool_size_;
    st.peak_live_bytes = peak_live_;
    st.peak_requested_bytes = peak_requested_;
    st.peak_reserved_bytes = pool_size_;  // the pool never shrinks
    st.live_allocations = allocated_.size();
    st.total_allocations = allocations_;
    st.total_deallocations = deallocations_;
    st.free_bytes = pool_size_ - live_;
    for (const auto& [key, list] : lists_)
      for (const block& b : list.blocks) {
        ++st.free_blocks;
        st.largest_free_block = std::max(st.largest_free_block, b.size);
      }
    st.upstream_allocations = upstream_blocks_.size();
    return st;
  }

  Upstream upstream_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, free_list> lists_;  // by stream key
  std::set<block, by_address> allocated_;
  std::vector<block> upstream_blocks_;
  std::size_t pool_size_ = 0;  // bytes held from the upstream (== sum of upstream_blocks_)
  std::size_t live_ = 0, requested_ = 0, peak_live_ = 0, peak_requested_ = 0;
  std::size_t allocations_ = 0, deallocations_ = 0;
};

}  // namespace vram::peers

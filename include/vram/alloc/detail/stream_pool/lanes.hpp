#pragma once
// detail::stream_pool::lane and lane_table: stream_pool's per-stream fast path. A lane holds
// one stream's bins (exact-size caches of recently freed small blocks), the map of every block
// it owns, and the ledger of the live blocks allocated on its stream, all under its own small
// lock, so threads on their own streams share no lock and write no common cache line. The
// table finds a stream's lane without a lock; lanes are created under the heap mutex and live
// as long as their pool.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <vram/core/alignment.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/alloc/detail/stream_pool/heap.hpp>
#include <vram/alloc/detail/stream_pool/size_classes.hpp>
#include <vram/alloc/detail/stream_pool/stream_marker.hpp>
#include <vram/detail/flat_map.hpp>
#include <vram/detail/biased_lock.hpp>

namespace vram::detail::stream_pool {

using live_map = flat_map<block*>;

/// The counters of the live blocks booked to one lane (under its lock) or to the heap
/// (under the heap mutex): no counter is shared by two lanes, so threads on their own
/// streams write no common cache line. live == sum of sizes <= peak_live; requested == sum
/// of `requested` <= peak_requested.
struct ledger {
  std::size_t live = 0, peak_live = 0;
  std::size_t requested = 0, peak_requested = 0;
  std::size_t allocations = 0, deallocations = 0;
  /// Books a block; `credit_live` / `credit_requested`: what was unbooked elsewhere and is
  /// still counted here (a lane's heap_credit), so that the peaks stay exact.
  [[gnu::always_inline]] void book(std::size_t size, std::size_t bytes, std::size_t credit_live = 0, std::size_t credit_requested = 0) noexcept {
    // A peak is written only when it moves: a bin hit stores less for the lane lock's
    // exchange to wait on.
    live += size;
    if (live - credit_live > peak_live) peak_live = live - credit_live;
    requested += bytes;
    if (requested - credit_requested > peak_requested) peak_requested = requested - credit_requested;
    ++allocations;
  }
  [[gnu::always_inline]] void unbook(std::size_t size, std::size_t bytes) noexcept {
    live -= size;
    requested -= bytes;
    ++deallocations;
  }
};

/// What the heap unbooked from a lane's ledger without taking the lane's lock: heap blocks
/// booked to the lane and freed under the heap mutex (a lock fewer on every heap free).
/// Written only under the heap mutex (a load and a store, no read-modify-write), read on
/// the lane's path with relaxed loads. The lane's true figures are its ledger's minus these;
/// both only grow, and unsigned wrap-around keeps the differences exact. A bin booking
/// that reads a credit before a concurrent free stores it is ordered before that free, so
/// the lane's peaks stay exact.
struct heap_credit {
  std::atomic<std::size_t> live{0}, requested{0}, deallocations{0};
  void add(std::size_t size, std::size_t bytes) noexcept {  // pre: heap mutex held
    live.store(live.load(std::memory_order_relaxed) + size, std::memory_order_relaxed);
    requested.store(requested.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
    deallocations.store(deallocations.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
};

/// A size class's cache in a lane: a stack of cached blocks in storage the lane reserved at
/// its creation (bin_capacity slots), so a push never allocates. Invariant: count <= capacity.
struct bin {
  static constexpr std::size_t probe = 4;  // entries looked at for an exact size

  block** slots = nullptr;
  std::size_t count = 0;
  [[nodiscard]] block** begin() const noexcept { return slots; }
  [[nodiscard]] block** end() const noexcept { return slots + count; }
  [[gnu::always_inline]] void push(block* b) noexcept { slots[count++] = b; }  // pre: count < capacity
  /// Takes out b, which this bin holds, wherever it is: O(count).
  void remove(block* b) noexcept {
    for (std::size_t i = count; i > 0; --i)
      if (slots[i - 1] == b) {
        slots[i - 1] = slots[--count];
        return;
      }
  }
  /// Takes the most recently cached block of exactly `size` bytes, or nullptr. A class up to
  /// linear_max holds one size; above, a class holds several and the last few are looked at.
  [[gnu::always_inline]] block* pop(std::size_t size) noexcept {
    if (size <= size_classes::linear_max) return count != 0 ? slots[--count] : nullptr;
    for (std::size_t i = count, stop = count > probe ? count - probe : 0; i > stop; --i)
      if (block* b = slots[i - 1]; b->size == size) {
        slots[i - 1] = slots[--count];
        return b;
      }
    return nullptr;
  }
};

/// One stream's fast path. Its map holds every block the lane owns, live or cached (a bin
/// hit or a cached free touches no map). Its ledger counts the live blocks allocated on its
/// stream, on its bins and on the heap. Invariant: cached_bytes == sum of sizes in bins.
struct alignas(64) lane {  // its own cache lines: threads on other streams never touch them
  lane(std::uintptr_t k, stream_ref s, std::size_t bin_capacity)
      : key(k), stream(s), bin_storage(std::make_unique<block*[]>(size_classes::count * bin_capacity)) {
    for (std::size_t i = 0; i < size_classes::count; ++i) bins[i].slots = bin_storage.get() + i * bin_capacity;
  }
  mutable biased_lock mutex;  // biased to the thread that allocates on the stream
  std::uintptr_t key;
  freeing_stream stream;
  std::unique_ptr<block*[]> bin_storage;
  std::array<bin, size_classes::count> bins;
  live_map live;
  std::size_t cached_bytes = 0;
  ledger books;         // the live blocks booked to this lane, gross of `credit`
  heap_credit credit;   // booked here, freed through the heap

  // Counting is per ledger (a lane's under its lock, the heap's under the heap mutex; a heap
  // free credits the lane instead, without its lock: heap_credit): no atomic
  // read-modify-write on the bin path. Every member below: pre: this lane's lock held.
  // Everything the bin path calls is always inlined (here, in bin, ledger, flat_map::find,
  // size_classes::index and biased_lock::try_enter and leave): stream_pool's allocate() and
  // deallocate() must stay free of calls on it. Left to GCC, these stay inline in a bare
  // pool's loop but are outlined once the pool is inlined into an adaptor over it (the
  // inliner's budget for the caller runs out), and the pair under statistics_adaptor pays
  // several ns for the calls. (thread_slot::get is left to GCC here: always inlined, it cost
  // the bare pair 0.6 ns at -O2, scripts/pair-ab; the adaptors over the pool call
  // thread_slot::get_inline instead, which their pairs need.)

  /// Books a block of this lane.
  [[gnu::always_inline]] void book(std::size_t size, std::size_t bytes) noexcept {
    books.book(size, bytes, credit.live.load(std::memory_order_relaxed),
               credit.requested.load(std::memory_order_relaxed));
  }
  /// Books b, just taken from the heap for this lane, live for `requested`.
  void take(block* b, std::size_t requested) noexcept {
    b->requested = requested;
    b->booked = this;
    book(b->size, requested);
  }
  /// A bin hit: the cached block of exactly `size` bytes, booked live for `requested`; or
  /// nullptr (nothing changed).
  [[gnu::always_inline]] block* bin_take(std::size_t size, std::size_t requested) noexcept {
    block* b = bins[size_classes::index(size)].pop(size);
    if (b != nullptr) {
      cached_bytes -= size;
      b->requested = requested;  // no longer cached(); it stays in the lane's map: no map update
                                 // on a bin hit (b->booked is this lane already: a lane's
                                 // blocks are booked to it)
      book(b->size, requested);
    }
    return b;
  }
  /// Caches live block b (of this lane, freed well-formed on its stream) in its bin; false
  /// (nothing changed) when b is not `size` bytes, the bin holds `capacity` blocks or the
  /// cache would exceed `max_bytes`. `size` is what the caller expects b's size to be: on the
  /// bin path it comes from the free's own arguments, so that finding the bin does not wait
  /// for b's line (the pair is bound by that chain of loads, not by its instructions).
  [[gnu::always_inline]] bool bin_give(block* b, std::size_t size, std::size_t capacity, std::size_t max_bytes) noexcept {
    auto& into = bins[size_classes::index(size)];
    if (b->size != size || into.count >= capacity || cached_bytes + size > max_bytes) return false;
    books.unbook(size, b->requested);
    b->requested = 0;  // cached(); it stays in the lane's map
    into.push(b);
    cached_bytes += size;
    return true;
  }
  /// Adds this lane's figures to `st` (live, requested, counts, its binned blocks as free
  /// blocks) and its ledger's peaks to `peak_live` / `peak_requested`. Pre: the heap mutex held.
  void add_to(vram::stats& st, std::size_t& peak_live, std::size_t& peak_requested) const noexcept {
    ledger n = net();
    st.live_bytes += n.live;
    peak_live += n.peak_live;
    st.total_allocations += n.allocations;
    st.total_deallocations += n.deallocations;
    st.requested_bytes += n.requested;
    peak_requested += n.peak_requested;
    for (const auto& in : bins) {
      st.free_blocks += in.count;
      for (const block* b : in) st.largest_free_block = std::max(st.largest_free_block, b->size);
    }
  }

  /// What check() counted: the lane's live blocks and its cached (binned) ones.
  struct census {
    std::size_t live_blocks = 0, live_bytes = 0, cached_blocks = 0, cached_bytes = 0;
  };
  /// Checks the lane's invariants against its blocks, calling fail(what) on the first broken
  /// one: its map holds only its own lane-owned blocks; its ledger (net of the heap's credit)
  /// equals its live blocks plus `heap_live` / `heap_requested` (the heap-live blocks booked
  /// to it); every binned block is cached, of its bin's class and in the map; cached_bytes is
  /// the sum of the binned sizes. Pre: the heap mutex held too.
  template <class Fail>
  census check(Fail&& fail, std::size_t heap_live, std::size_t heap_requested) const {
    census c;
    std::size_t in_map_cached = 0, requested = heap_requested, live_bytes = heap_live;
    live.for_each([&](std::uintptr_t a, block* b) {
      if (b->addr != a || b->state != block_state::lane || b->booked != this) fail("lane live map");
      if (b->cached()) {
        ++in_map_cached;
        return;
      }
      // What the bin path relies on: a live lane block is its request rounded to the quantum.
      if (b->size != align_up(b->requested, size_classes::quantum)) fail("lane block of another size than its request");
      ++c.live_blocks;
      c.live_bytes += b->size;
      live_bytes += b->size;
      requested += b->requested;
    });
    ledger books = net();
    if (requested != books.requested || live_bytes != books.live) fail("lane ledger disagrees with its blocks");
    if (books.peak_requested < books.requested || books.peak_live < books.live) fail("lane peaks");
    for (std::size_t i = 0; i < size_classes::count; ++i)
      for (block* b : bins[i]) {
        if (b->state != block_state::lane || !b->cached() || size_classes::index(b->size) != i) fail("bin holds a wrong block");
        if (const_cast<live_map&>(live).find(b->addr) == nullptr) fail("cached block not in the lane's map");
        c.cached_bytes += b->size;
        ++c.cached_blocks;
      }
    if (c.cached_blocks != in_map_cached) fail("bins disagree with the lane's map");
    if (c.cached_bytes != cached_bytes) fail("lane cached bytes");
    return c;
  }

  /// The ledger net of the heap's credit (pre: the heap mutex held too).
  [[nodiscard]] ledger net() const noexcept {
    ledger n = books;
    n.live -= credit.live.load(std::memory_order_relaxed);
    n.requested -= credit.requested.load(std::memory_order_relaxed);
    n.deallocations += credit.deallocations.load(std::memory_order_relaxed);
    return n;
  }
};

/// The lanes of one pool: an open-addressed table of stream keys, read without a lock
/// (slots are claimed under the heap mutex with a release store of the key, and never freed
/// before the pool is destroyed), and the lanes in creation order for walks.
class lane_table {
 public:
  static constexpr std::size_t capacity = 64;

  lane_table() { list_.reserve(capacity); }

  /// The lane of `key`, or nullptr. Lock-free.
  [[nodiscard]] lane* find(std::uintptr_t key) const noexcept {
    for (std::size_t i = 0, slot = home(key); i < capacity; ++i, slot = (slot + 1) % capacity) {
      std::uintptr_t k = keys_[slot].load(std::memory_order_acquire);
      if (k == key + 1) return lanes_[slot].get();
      if (k == 0) return nullptr;
    }
    return nullptr;
  }
  /// The lane of `s`, created if absent; nullptr when the table is full. Pre: heap mutex held.
  lane* add(stream_ref s, std::size_t bin_capacity) {
    std::uintptr_t key = s.key();
    for (std::size_t i = 0, slot = home(key); i < capacity; ++i, slot = (slot + 1) % capacity) {
      std::uintptr_t k = keys_[slot].load(std::memory_order_relaxed);
      if (k == key + 1) return lanes_[slot].get();
      if (k == 0) {
        lanes_[slot] = std::make_unique<lane>(key, s, bin_capacity);
        list_.push_back(lanes_[slot].get());  // capacity reserved: cannot throw
        keys_[slot].store(key + 1, std::memory_order_release);
        return lanes_[slot].get();
      }
    }
    return nullptr;
  }
  /// The lanes in creation order (the lock order of all_lanes_held). Pre: heap mutex held.
  [[nodiscard]] const std::vector<lane*>& list() const noexcept { return list_; }
  /// f(lane) for every lane, each under its own lock in turn. Pre: heap mutex held.
  template <class F>
  void for_each(F&& f) const {
    for (lane* l : list_) {
      std::lock_guard lock(l->mutex);
      f(*l);
    }
  }

 private:
  static std::size_t home(std::uintptr_t key) noexcept {
    return static_cast<std::size_t>(((key >> 4) * 0x9E3779B97F4A7C15ull) >> 58);  // 6 bits: capacity
  }
  static_assert(capacity == 64);

  std::array<std::atomic<std::uintptr_t>, capacity> keys_{};  // stream key + 1; 0: empty slot
  std::array<std::unique_ptr<lane>, capacity> lanes_;
  std::vector<lane*> list_;
};

/// Every lane's lock, held together for as long as it lives (a view no bin path can change
/// mid-way). Taken in creation order after the heap mutex; no other path holds two lane
/// locks, so the order cannot deadlock. Pre: heap mutex held for its whole life.
class all_lanes_held {
 public:
  explicit all_lanes_held(const lane_table& lanes) noexcept : lanes_(lanes.list()) {
    for (lane* l : lanes_) l->mutex.lock();
  }
  ~all_lanes_held() {
    for (lane* l : lanes_) l->mutex.unlock();
  }
  all_lanes_held(const all_lanes_held&) = delete;
  all_lanes_held& operator=(const all_lanes_held&) = delete;
  template <class F>
  void each(F&& f) const {
    for (lane* l : lanes_) f(*l);
  }

 private:
  const std::vector<lane*>& lanes_;
};

/// A thread's last lane lookup in one pool. Pool ids are never reused and lanes live as long
/// as their pool, so a hit (same pool id, same stream key) is always a valid lane.
struct lane_cache {
  std::uint64_t pool = 0;
  std::uintptr_t key = 0;
  lane* l = nullptr;
};

}  // namespace vram::detail::stream_pool

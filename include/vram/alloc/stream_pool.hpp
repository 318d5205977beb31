#pragma once
// vram::stream_pool: the general-purpose, stream-ordered pool (best fit with coalescing,
// size-class fast path, stream-ordered reuse, growth and release). Design: docs/stream_pool.md.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/observer.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/throw.hpp>
#include <vram/alloc/stream_pool_options.hpp>
#include <vram/alloc/detail/stream_pool/cached_blocks.hpp>
#include <vram/alloc/detail/stream_pool/check.hpp>
#include <vram/alloc/detail/stream_pool/heap.hpp>
#include <vram/alloc/detail/stream_pool/lanes.hpp>
#include <vram/alloc/detail/stream_pool/mutex.hpp>
#include <vram/alloc/detail/stream_pool/size_classes.hpp>
#include <vram/alloc/detail/stream_pool/stats.hpp>
#include <vram/alloc/detail/stream_pool/stranding.hpp>
#include <vram/alloc/detail/stream_pool/stream_marker.hpp>
#include <vram/source/host_source.hpp>  // for the static_assert below

namespace vram {

namespace detail::stream_pool {
/// A process-wide unique id per stream_pool (never reused, so threads' cached lookups of a
/// destroyed pool can never match a new one at the same address).
inline std::uint64_t next_pool_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail::stream_pool

/// A stream-ordered memory pool over any upstream resource.
///
/// Purpose: the allocator most users want. Requests are rounded to 256 bytes and served by
/// best fit (smallest adequate free block, lowest address among equals) from free blocks
/// carved out of large upstream chunks; freed blocks coalesce with free neighbours at once.
/// Requests up to `small_max` are first served from a per-stream bin: an exact-size cache of
/// recently freed blocks (a LIFO pop under that stream's own lock, no rounding beyond 256 B).
/// A cached block that a heap free leaves alone inside large free space goes back to the heap
/// (where it coalesces) and its bin gets a block placed by best fit instead, so that a bin
/// never hands out an address that keeps large free space apart (docs/stream_pool.md).
/// With a contiguous upstream the free block at the top is taken last, so in-place growth
/// extends it. On the shared real traces this stays within 0.02 of an ideal online best fit.
///
/// Streams: a block freed on stream S is keyed to S and reused on S at once (stream order
/// makes that safe). Another stream T takes it only after `T` waits on a marker recorded on
/// S at steal time (cudaStreamWaitEvent on CUDA; a waiting task on host streams); only the
/// synchronous stream (allocate_sync) blocks the calling thread for that. Before growing, the
/// pool records a marker on each stream holding free blocks and, once it is seen complete
/// (queried, never waited for), re-keys the blocks freed before it to "any stream", so
/// idle streams never strand memory. Blocks freed on the synchronous stream serve everyone.
/// Streams that freed blocks into the pool must outlive it or be idle when it grows: CUDA
/// streams are recorded with cudaEventRecord (host streams are tracked through their shared
/// state, so a destroyed host_stream is harmless). Synchronize a CUDA stream that freed
/// blocks before destroying it: a new stream may get the same handle, and blocks are keyed by
/// handle (as in RMM and PyTorch).
///
/// Thread safety: all members may be called concurrently. Each stream has a "lane" (bins,
/// live-block map, counters) under its own small lock, biased to the thread that uses it
/// (detail/biased_lock.hpp: that thread takes it with no locked instruction); the best-fit
/// heap has one mutex taken only on bin misses, large requests, frees that overflow a bin,
/// growth and release. Threads that each use their own stream share no lock and no written
/// cache line on the small-size path: each lane keeps its own ledger of the live blocks
/// allocated on its stream.
///
/// Statistics: stats() adds the ledgers up, so current figures (live, requested, counts) are
/// exact. Peaks are exact when one stream was used (one ledger); with several streams,
/// peak_live_bytes and peak_requested_bytes are the sum of the streams' peaks, capped by the
/// reserved peak: an upper bound (a statistics_adaptor in front gives exact peaks for all).
///
/// Alignment: every block is 256-byte aligned; larger alignments are served from the heap.
/// Upstream: held by value and owned; chunks go back to it in release() and the destructor.
/// With a contiguous upstream (has_contiguous_growth, contiguous() true: cuda_vmm_source,
/// simulated_device_source in contiguous mode) adjacent chunks merge, so the pool grows in
/// place and release() can return any granularity-aligned free piece.
/// Complexity: bin hit O(1); heap allocation and free O(log k) at worst in the size class
/// concerned (segregated lists with bitmaps; a class of many blocks is ordered by a set too),
/// plus O(s) when the stream has nothing that fits and s other streams hold free blocks (the
/// steal search); growth and release O(chunks + blocks touched). bench.pool_worst_case
/// measures both worst cases.
/// Zero bytes: allocate returns nullptr; deallocate(nullptr, ...) does nothing.
/// Misuse (foreign pointer, double free, wrong size) is reported through report_misuse and
/// changes nothing.
template <class Upstream, class Observer = no_observer>
class stream_pool : public forward_properties<stream_pool<Upstream, Observer>, Upstream> {
  using classes = detail::stream_pool::size_classes;
  static constexpr std::size_t quantum = classes::quantum;
  static constexpr std::size_t default_growth_step = std::size_t{64} << 20;
  using block = detail::stream_pool::block;
  using block_state = detail::stream_pool::block_state;
  using stream_info = detail::stream_pool::stream_info;
  using lane = detail::stream_pool::lane;
  using bin = detail::stream_pool::bin;
  using ledger = detail::stream_pool::ledger;
  using live_map = detail::stream_pool::live_map;
  using all_lanes_held = detail::stream_pool::all_lanes_held;
  using marker = detail::stream_pool::stream_marker;

 public:
  explicit stream_pool(Upstream upstream = Upstream{}, stream_pool_options options = {}, Observer observer = {})
      : upstream_(std::move(upstream)),
        observer_(std::move(observer)),
        options_(options),
        heap_(contiguous_upstream(upstream_), upstream_granularity(upstream_)) {
    if (options_.small_max > classes::max_small)
      detail::throw_invalid_argument(name(), "small_max above the largest size class (1 MiB)");
    if (options_.maximum_size != 0 && options_.initial_size > options_.maximum_size)
      detail::throw_invalid_argument(name(), "initial_size above maximum_size");
    if (options_.initial_size != 0) {
      std::lock_guard lock(heap_mutex_);
      grow_by(align_up(options_.initial_size, heap_.granularity()), heap_.any_stream());
    }
  }

  stream_pool(const stream_pool&) = delete;
  stream_pool& operator=(const stream_pool&) = delete;

  /// Gives every chunk back. Waits (blocking) for the work pending on streams that freed
  /// blocks, so nothing is returned while in use: host streams each, CUDA streams through one
  /// device synchronization (they may be destroyed by now). Live allocations are reported as misuse.
  ~stream_pool() {
    std::lock_guard lock(heap_mutex_);
    detail::stream_pool::flush_lanes(heap_, lanes_);
    if (std::size_t live = stats_locked().live_bytes; live != 0)
      report_misuse({misuse::live_at_destruction, name(), nullptr, live, 0});
    detail::stream_pool::wait_before_release(
        upstream_,
        [&](auto&& visit) {
          heap_.for_each_stream([&](std::uintptr_t key, stream_info& info) {
            if (key != 0 && !info.index.empty()) visit(info.stream);
          });
        },
        [&] { report_misuse({misuse::upstream_failure, name(), nullptr, 0, 0}); });
    heap_.clear([&](std::uintptr_t addr, std::size_t bytes) { give_back(addr, bytes); });
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "stream_pool"; }

  /// Allocates `bytes` ordered on `s`: usable by work enqueued on `s` after this call.
  /// Throws invalid_argument (bad alignment, absurd size), out_of_memory (the upstream or the
  /// maximum size is exhausted even after merging idle streams and releasing; nothing changed;
  /// its stranded() names the busy streams whose free blocks would have served it merged).
  [[gnu::always_inline]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    // The bin path, free of calls and always inlined (into the adaptors over the pool too,
    // where GCC would otherwise call it out of line): a valid small request on the calling
    // thread's last lane, its lock free, its bin holding the size. A request above small_max
    // goes to the heap in one call; everything else (a bin miss, a contended lane, zero
    // bytes, bad input) is out of line too.
    if (bytes - 1 < options_.small_max && align - 1 < quantum && (align & (align - 1)) == 0) [[likely]] {
      if (const auto& cache = last_lane_; cache.pool == id_ && cache.key == s.key()) [[likely]]
        if (lane* l = cache.l; auto in = l->mutex.try_enter()) [[likely]] {  // a hit's lane: never nullptr
          block* b = l->bin_take(align_up(bytes, quantum), bytes);
          l->mutex.leave(in);
          if (b == nullptr) [[unlikely]]
            return take_for_lane(*l, s, bytes);
          observer_.on_allocate(reinterpret_cast<void*>(b->addr), bytes, s);
          return reinterpret_cast<void*>(b->addr);
        }
    } else if (bytes > options_.small_max) {
      return allocate_from_heap(s, bytes, align);
    }
    return allocate_other(s, bytes, align);
  }

  /// Like allocate(), but returns nullptr where allocate() throws out_of_memory (still counted
  /// in stats().ooms and reported to the observer), for callers with a fallback.
  [[nodiscard]] void* try_allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    try {
      return allocate(s, bytes, align);
    } catch (const out_of_memory&) {
      return nullptr;
    }
  }

  /// Frees `p` (allocated with `bytes`) ordered on `s`: the block is reused on `s` at once
  /// and by other streams only after they wait for the work enqueued on `s` so far.
  [[gnu::always_inline]] void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    // The bin path, free of calls and always inlined like allocate()'s: a well-formed free of
    // a block of the calling thread's last lane, its lock free and its bin with room.
    // Everything else (nullptr, zero bytes, misuse, a full bin, another stream's block, a
    // contended lane) is out of line.
    // bytes 0 would match a cached block: bytes - 1 < small_max excludes it too.
    if (bytes - 1 < options_.small_max && align <= quantum && p != nullptr) [[likely]] {
      if (const auto& cache = last_lane_; cache.pool == id_ && cache.key == s.key()) [[likely]]
        if (lane* l = cache.l; auto in = l->mutex.try_enter()) [[likely]] {  // a hit's lane: never nullptr
          bool cached = false;
          if (block** found = l->live.find(reinterpret_cast<std::uintptr_t>(p)))
            cached = (*found)->requested == bytes && !l->stream.stale(s) &&
                     l->bin_give(*found, align_up(bytes, quantum), options_.bin_capacity, options_.lane_cache_bytes);
          l->mutex.leave(in);
          if (cached) [[likely]] {
            observer_.on_deallocate(p, bytes, s);
            return;
          }
        }
    } else if (bytes > options_.small_max) {
      return deallocate_slow(s, p, bytes);  // a heap block (or misuse)
    }
    deallocate_other(s, p, bytes, align <= quantum);
  }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align);
  }

  /// Returns free memory to the upstream: whole free chunks, and with a contiguous upstream
  /// every granularity-aligned free piece. Only memory free for every stream is returned
  /// (blocks of streams with pending work stay until those streams are seen idle).
  /// Returns the bytes given back. Called automatically before out-of-memory.
  std::size_t release() {
    std::lock_guard lock(heap_mutex_);
    detail::stream_pool::flush_lanes(heap_, lanes_);
    heap_.merge_idle_streams();
    return release_locked();
  }

  /// True when `p` is a live allocation of this pool, on any stream.
  [[nodiscard]] bool owns(const void* p) const {
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(heap_mutex_);
    if (const_cast<live_map&>(heap_live_).find(addr)) return true;
    bool found = false;
    lanes_.for_each([&](lane& l) {
      if (found) return;  // a block is in one lane's map at most
      block** b = l.live.find(addr);
      found = b != nullptr && !(*b)->cached();
    });
    return found;
  }

  /// A consistent snapshot (takes every lock briefly).
  [[nodiscard]] vram::stats stats() const {
    std::lock_guard lock(heap_mutex_);
    return stats_locked();
  }

  /// Calls f(bytes) for every free block: every stream's in the heap, and those cached in the
  /// bins (free, not coalesced until the bins flush). For reports (vram-replay's free blocks at
  /// peak): O(free blocks), under the heap mutex and each lane's lock in turn.
  template <class F>
  void for_each_free_block(F&& f) const {
    std::lock_guard lock(heap_mutex_);
    heap_.for_each_stream(
        [&](std::uintptr_t, const stream_info& info) { info.index.for_each([&](const block* b) { f(b->size); }); });
    lanes_.for_each([&](const lane& l) {
      for (const auto& bin : l.bins)
        for (const block* b : bin) f(b->size);
    });
  }

  /// Verifies the structures: every reserved byte is in exactly one block, blocks tile their
  /// chunks, the free index, the live maps and the bins agree with the blocks, no two adjacent
  /// free blocks with the same stream key. Throws std::logic_error. Full walk under VRAM_DEBUG,
  /// the counter equation otherwise. May be called while other threads use the pool: it holds
  /// the heap mutex and every lane's lock for the whole check, so it sees one consistent state
  /// (those threads wait for it, on their bin paths too).
  void check_invariants() const {
    std::lock_guard lock(heap_mutex_);
    all_lanes_held lanes(lanes_);
    auto fail = [](const char* what) { throw std::logic_error(std::string("stream_pool invariant: ") + what); };
    vram::stats st = stats_locked(lanes);  // free bytes: reserved minus live, by construction
    if (st.live_bytes > st.reserved_bytes) fail("live above reserved");
    if (st.peak_live_bytes < st.live_bytes || st.peak_reserved_bytes < st.reserved_bytes) fail("peak below current");
#if VRAM_DEBUG
    detail::stream_pool::check_structures(heap_, lanes, const_cast<live_map&>(heap_live_), heap_ledger_, st);
#endif
  }

  [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] const stream_pool_options& options() const noexcept { return options_; }
  [[nodiscard]] Observer& observer() noexcept { return observer_; }

  friend bool operator==(const stream_pool& a, const stream_pool& b) noexcept { return &a == &b; }

 private:
  static constinit thread_local detail::stream_pool::lane_cache last_lane_;  // defined after the class: nvcc 13 rejects an in-class
                                             // initializer of a thread_local of a nested type

  // ---- lanes --------------------------------------------------------------------------

  /// The calling thread's last lane if it is `key`'s, else nullptr (no search).
  lane* cached_lane(std::uintptr_t key) const noexcept {
    const auto& cache = last_lane_;
    return cache.pool == id_ && cache.key == key ? cache.l : nullptr;
  }

  lane* find_lane(std::uintptr_t key) const noexcept {
    if (lane* l = cached_lane(key)) [[likely]]
      return l;
    lane* l = lanes_.find(key);
    if (l != nullptr) last_lane_ = {id_, key, l};
    return l;
  }

  /// The lane of `s`, created on first use; nullptr when the lane table is full.
  lane* lane_for(stream_ref s) {
    if (lane* l = find_lane(s.key())) [[likely]]
      return l;
    return add_lane(s);
  }
  [[gnu::noinline]] lane* add_lane(stream_ref s) {  // out of line: keeps lane_for small enough to inline
    std::lock_guard lock(heap_mutex_);
    return lanes_.add(s, options_.bin_capacity);
  }

  // ---- allocate()'s slower paths, out of line so that its bin path stays short --------

  /// Everything allocate() does not do inline: bad input, zero bytes, a lane not in the
  /// thread's cache or contended, the heap.
  [[gnu::noinline]] void* allocate_other(stream_ref s, std::size_t bytes, std::size_t align) {
    detail::check_request(name(), bytes, align);
    if (bytes == 0) return nullptr;
    if (bytes <= options_.small_max && align <= quantum) {
      if (lane* l = lane_for(s)) {
        block* b;
        {
          std::lock_guard lock(l->mutex);
          b = l->bin_take(align_up(bytes, quantum), bytes);
        }
        if (b == nullptr) return take_for_lane(*l, s, bytes);
        observer_.on_allocate(reinterpret_cast<void*>(b->addr), bytes, s);
        return reinterpret_cast<void*>(b->addr);
      }
    }
    return allocate_from_heap(s, bytes, align);
  }

  /// A bin miss: carves an exact block for `bytes` (rounded to the quantum) from the heap for lane l.
  [[gnu::noinline]] void* take_for_lane(lane& l, stream_ref s, std::size_t bytes) {
    std::optional<marker> wait_on;
    block* b;
    {
      std::lock_guard heap_lock(heap_mutex_);
      b = heap_take(s, align_up(bytes, quantum), quantum, bytes, wait_on);
      std::lock_guard lock(l.mutex);
      try {
        l.live.insert(b->addr, b);
      } catch (...) {
        heap_.free(b, *b->stream);  // back under its own key: it may have been stolen
        throw;
      }
      b->state = block_state::lane;
      l.take(b, bytes);
    }
    if (wait_on) wait_on->make_wait(s);
    observer_.on_allocate(reinterpret_cast<void*>(b->addr), bytes, s);
    return reinterpret_cast<void*>(b->addr);
  }

  /// Everything deallocate() does not do inline: nullptr, misuse, a full bin, a stale
  /// stream record, a lane not in the thread's cache or contended, heap blocks.
  /// `small`: within small_max, alignment at most the quantum (a candidate for the lanes).
  [[gnu::noinline]] void deallocate_other(stream_ref s, void* p, std::size_t bytes, bool small) noexcept {
    if (p == nullptr) return;
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    if (small) {
      if (lane* l = find_lane(s.key())) {
        std::unique_lock lock(l->mutex);
        if (block** found = l->live.find(addr)) {
          block* b = *found;
          if (b->cached() || b->requested != bytes) [[unlikely]] {
            misuse_report r{b->cached() ? misuse::double_free : misuse::wrong_size, name(), p, bytes,
                            b->cached() ? 0 : b->requested};
            lock.unlock();
            report_misuse(r);
            return;
          }
          if (l->stream.stale(s)) l->stream.refresh(s);
          if (l->bin_give(b, b->size, options_.bin_capacity, options_.lane_cache_bytes)) {
            lock.unlock();
            observer_.on_deallocate(p, bytes, s);
            return;
          }
        }
      }
    }
    deallocate_slow(s, p, bytes);
  }

  /// Above small_max or a large alignment: a block of the heap, booked to the stream's lane.
  [[gnu::noinline]] void* allocate_from_heap(stream_ref s, std::size_t bytes, std::size_t align) {
    detail::check_request(name(), bytes, align);  // bytes != 0: callers send zero elsewhere
    lane* l = lane_for(s);  // books the block (counters only); before the heap mutex: it may take it
    std::optional<marker> wait_on;
    block* b;
    {
      std::lock_guard heap_lock(heap_mutex_);
      b = heap_take(s, align_up(bytes, quantum), std::max(align, quantum), bytes, wait_on);
      try {
        heap_live_.insert(b->addr, b);
      } catch (...) {
        heap_.free(b, *b->stream);  // back under its own key: it may have been stolen
        throw;
      }
      b->state = block_state::live;
      b->requested = bytes;
      b->booked = l;
      if (l != nullptr) {
        std::lock_guard lock(l->mutex);
        l->book(b->size, bytes);
      } else {
        heap_ledger_.book(b->size, bytes);
      }
    }
    if (wait_on) wait_on->make_wait(s);
    observer_.on_allocate(reinterpret_cast<void*>(b->addr), bytes, s);
    return reinterpret_cast<void*>(b->addr);
  }

  // ---- statistics -------------------------------------------------------------------

  vram::stats stats_locked() const {  // pre: heap_mutex_ held
    return detail::stream_pool::collect_stats(heap_, heap_ledger_, ooms_, [&](auto&& f) { lanes_.for_each(f); });
  }
  vram::stats stats_locked(const all_lanes_held& lanes) const {  // pre: heap_mutex_ and every lane held
    return detail::stream_pool::collect_stats(heap_, heap_ledger_, ooms_, [&](auto&& f) { lanes.each(f); });
  }

  // ---- the heap (everything below: heap_mutex_ held) ----------------------------------

  /// A free block of `size` bytes aligned to `align`, taken out of the heap (state left to
  /// the caller). Tries, in order: own/global best fit, another stream's (with a wait),
  /// merging bins and idle streams, growth, release + growth; then throws out_of_memory.
  block* heap_take(stream_ref s, std::size_t size, std::size_t align, std::size_t requested,
                   std::optional<marker>& wait_on) {
    std::uintptr_t key = s.key();
    const stream_info& own = heap_.info_of(key);
    std::size_t need = size + (align > quantum ? align - quantum : 0);
    block* b = heap_.find_fit(own, need);
    if (b == nullptr) b = heap_.steal(key, need, wait_on);
    if (b == nullptr || heap_.is_wilderness(b)) {  // before growing or taking the top, coalesce what can be
      detail::stream_pool::flush_lanes(heap_, lanes_);
      if (heap_.others_hold_free(key)) heap_.merge_idle_streams();
      wait_on.reset();
      b = heap_.find_fit(own, need);
      if (b == nullptr) b = heap_.steal(key, need, wait_on);
    }
    if (b == nullptr) b = grow(s, need, requested);
    return heap_.carve(b, size, align);
  }

  /// Grows so that a block of `need` bytes usable on s exists, and returns it.
  block* grow(stream_ref s, std::size_t need, std::size_t requested) {
    stream_info& own = heap_.info_of(s.key());
    // In-place growth: with a contiguous upstream a free block at the top of the highest
    // chunk, usable on s, only needs topping up (if the upstream places the new range there).
    std::size_t credit = 0;
    stream_info* top_stream = &heap_.any_stream();
    if (const block* top = heap_.top_to_extend(own, need)) {
      credit = top->size;
      top_stream = top->stream;
    }
    const std::size_t granularity = heap_.granularity();
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::size_t missing = align_up(need - credit, granularity);
      std::size_t step =
          options_.growth_step != 0 ? options_.growth_step : (heap_.contiguous() ? 0 : default_growth_step);
      std::size_t bytes = std::max(missing, align_up(step, granularity));
      if (options_.maximum_size != 0) {  // a capped pool reaches exactly its maximum (RMM #1957)
        std::size_t room = options_.maximum_size > heap_.reserved() ? options_.maximum_size - heap_.reserved() : 0;
        bytes = std::min(bytes, room);
      }
      if (bytes >= missing && try_grow(bytes, credit != 0 ? *top_stream : heap_.any_stream())) {
        if (block* b = heap_.find_fit(own, need)) return b;
        credit = 0;  // the new range landed elsewhere: grow by the whole need
        continue;
      }
      if (release_locked() == 0) break;  // nothing to give back: out of memory
      credit = 0;
    }
    ++ooms_;
    vram::stats snapshot = stats_locked();
    observer_.on_out_of_memory(requested, s, snapshot);
    // Name the cap when it is what refused: the room left under it is less than the block.
    bool capped = options_.maximum_size != 0 && need > options_.maximum_size - std::min(heap_.reserved(), options_.maximum_size);
    // And the free blocks other streams' queued work keeps from merging (heap_take merged the
    // idle streams first, so what is still keyed to a stream waits for its work).
    detail::throw_out_of_memory(name(), requested, s, snapshot, capped ? options_.maximum_size : 0, "maximum_size",
                                detail::stream_pool::find_stranding(heap_, s.key(), need));
  }

  /// Takes `bytes` from the upstream; false (nothing changed) when it has none.
  bool try_grow(std::size_t bytes, stream_info& stream) {
    try {
      grow_by(bytes, stream);
      return true;
    } catch (const std::bad_alloc&) {  // out_of_memory included; other upstream errors propagate
      return false;
    }
  }

  /// Adds `bytes` from the upstream to the heap as one free block keyed to `stream`. Throws
  /// what the upstream throws (nothing changed).
  void grow_by(std::size_t bytes, stream_info& stream) {
    void* p = nullptr;
    heap_.grow_by(bytes, stream, [&](std::size_t n) { return p = upstream_.allocate_sync(n, quantum); });
    observer_.on_grow(p, bytes);
  }

  /// Gives back what release() promises; returns the bytes released.
  std::size_t release_locked() {
    return heap_.release([&](std::uintptr_t addr, std::size_t bytes) { give_back(addr, bytes); });
  }

  void give_back(std::uintptr_t addr, std::size_t bytes) noexcept {
    upstream_.deallocate_sync(reinterpret_cast<void*>(addr), bytes, quantum);
    observer_.on_release(reinterpret_cast<void*>(addr), bytes);
  }

  /// Frees through the heap: heap-live blocks, lane blocks freed on another stream, bins
  /// that are full; and detects misuse.
  [[gnu::noinline]] void deallocate_slow(stream_ref s, void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return;
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::unique_lock lock(heap_mutex_);
    block* b = nullptr;
    std::size_t expected = 0;  // the recorded size when it differs from `bytes`
    bool cached = false;       // addr is a block cached in a bin: a second free
    if (std::size_t slot = heap_live_.locate(addr); slot != live_map::npos) {
      if (heap_live_.at(slot)->requested != bytes) {
        expected = heap_live_.at(slot)->requested;
      } else {
        b = heap_live_.at(slot);
        heap_live_.erase_at(slot);
        give_heap_live(b);
      }
    } else {
      lanes_.for_each([&](lane& l) {
        block** in_lane = b != nullptr || expected != 0 || cached ? nullptr : l.live.find(addr);
        if (in_lane == nullptr) return;
        if ((*in_lane)->cached()) {
          cached = true;
          return;
        }
        if ((*in_lane)->requested != bytes) {
          expected = (*in_lane)->requested;
          return;
        }
        b = *in_lane;
        l.live.erase(addr);
        l.books.unbook(b->size, b->requested);
      });
    }
    if (b == nullptr) {
      misuse kind = expected != 0 ? misuse::wrong_size
                                  : (cached || heap_.free_block_at(addr) ? misuse::double_free : misuse::foreign_pointer);
      lock.unlock();
      report_misuse({kind, name(), p, bytes, expected});
      return;
    }
    stream_info& info = heap_.info_of(s.key());
    if (&info != &heap_.any_stream()) info.stream.refresh(s);  // before keying a block to s
    block* f = heap_.free(b, info);
    using detail::stream_pool::lane_then_free;  // a cached block beside f: maybe alone in large free space
    if (lane_then_free(f->prev, &block::prev) || lane_then_free(f->next, &block::next))
      detail::stream_pool::place_again_alone(heap_, f);
    lock.unlock();
    observer_.on_deallocate(p, bytes, s);
  }

  void give_heap_live(block* b) noexcept {  // pre: heap mutex held
    if (lane* l = b->booked) {
      l->credit.add(b->size, b->requested);  // no lane lock: see heap_credit
    } else {
      heap_ledger_.unbook(b->size, b->requested);
    }
  }

  /// Whether the upstream grows in place, and its page (the heap's growth and release unit).
  static bool contiguous_upstream(const Upstream& u) noexcept {
    if constexpr (has_contiguous_growth<Upstream>) return u.contiguous();
    return false;
  }
  static std::size_t upstream_granularity(const Upstream& u) noexcept {
    if constexpr (has_contiguous_growth<Upstream>) return std::max(quantum, u.granularity());
    return quantum;
  }

  [[no_unique_address]] Upstream upstream_;
  [[no_unique_address]] Observer observer_;
  stream_pool_options options_;

  const std::uint64_t id_ = detail::stream_pool::next_pool_id();  // names this pool in threads' lane caches
  detail::stream_pool::lane_table lanes_;  // slots claimed under heap_mutex_, never freed before destruction

  // Lock order: heap_mutex_, then a lane's lock (all_lanes_held: every lane, in creation order).
  mutable detail::stream_pool::heap_mutex heap_mutex_;
  detail::stream_pool::heap heap_;  // guarded by heap_mutex_
  live_map heap_live_;              // live blocks not served by a lane (guarded by heap_mutex_)
  // reserved == live bytes of all ledgers + the sizes of indexed blocks + sum of lanes' cached_bytes
  ledger heap_ledger_;  // heap-live blocks booked to no lane (their stream had none: over 64 streams)
  std::size_t ooms_ = 0;
};

template <class Upstream, class Observer>
constinit thread_local detail::stream_pool::lane_cache stream_pool<Upstream, Observer>::last_lane_{};

static_assert(resource<stream_pool<host_source>>);
static_assert(resource_with<stream_pool<host_source>, host_accessible>);
static_assert(has_try_allocate<stream_pool<host_source>> && has_release<stream_pool<host_source>> &&
              has_stats<stream_pool<host_source>> && has_owns<stream_pool<host_source>> &&
              has_check_invariants<stream_pool<host_source>>);

}  // namespace vram

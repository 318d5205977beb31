#pragma once
// vram::stream_pool: the general-purpose, stream-ordered pool (best fit with coalescing,
// size-class fast path, stream-ordered reuse, growth and release). Design: docs/stream_pool.md.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/observer.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/alloc/detail/stream_pool/flat_map.hpp>
#include <vram/alloc/detail/stream_pool/free_index.hpp>
#include <vram/alloc/detail/stream_pool/mutex.hpp>
#include <vram/alloc/detail/stream_pool/size_classes.hpp>
#include <vram/alloc/detail/stream_pool/spin_lock.hpp>
#include <vram/alloc/detail/stream_pool/stream_marker.hpp>
#include <vram/detail/throw.hpp>
#include <vram/source/host_source.hpp>  // for the static_assert below

namespace vram {

namespace detail {
/// A process-wide unique id per stream_pool (never reused, so threads' cached lookups of a
/// destroyed pool can never match a new one at the same address).
inline std::uint64_t pool_next_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

/// How a stream_pool grows, caps and caches.
struct stream_pool_options {
  /// Bytes taken from the upstream at construction (0: grow on demand).
  std::size_t initial_size = 0;
  /// The most bytes the pool holds from its upstream (0: as much as the upstream gives).
  std::size_t maximum_size = 0;
  /// Bytes added per growth, never less than the request. 0 (auto): with a contiguous
  /// upstream, exactly what is missing (rounded to its granularity: growth is in place, so
  /// small steps cost nothing in fragmentation); otherwise 64 MiB.
  std::size_t growth_step = 0;
  /// Largest request served from the per-stream bins (0: no bins). At most 1 MiB. Bins are
  /// exact-size caches of recently freed blocks: they add no rounding, but a cached block
  /// does not coalesce until the bins are flushed (before the pool grows or takes its top
  /// block), and LIFO reuse places blocks differently from best fit. On the shared traces
  /// bins up to 32 KiB cost nothing in reserved bytes and 64 KiB and above cost up to 7 %
  /// (pangu_2.6B; docs/PERFORMANCE.md), hence 16 KiB. Raise it for speed at larger sizes.
  std::size_t small_max = std::size_t{16} << 10;
  /// Per stream, the most bytes of small blocks kept in bins (beyond that they go back to
  /// the shared best-fit heap, where they coalesce).
  std::size_t lane_cache_bytes = std::size_t{32} << 20;
  /// Per stream and size class, the most blocks kept in a bin.
  std::size_t bin_capacity = 64;
};

/// A stream-ordered memory pool over any upstream resource.
///
/// Purpose: the allocator most users want. Requests are rounded to 256 bytes and served by
/// best fit (smallest adequate free block, lowest address among equals) from free blocks
/// carved out of large upstream chunks; freed blocks coalesce with free neighbours at once.
/// Requests up to `small_max` are first served from a per-stream bin: an exact-size cache of
/// recently freed blocks (a LIFO pop under that stream's own lock, no rounding beyond 256 B).
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
/// live-block map, counters) under its own small lock; the best-fit heap has one mutex taken
/// only on bin misses, large requests, frees that overflow a bin, growth and release. Threads
/// that each use their own stream share no lock and no written cache line on the small-size
/// path: each lane keeps its own ledger of the live blocks allocated on its stream.
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
/// Complexity: bin hit O(1); heap allocation O(1 + s) (segregated lists with bitmaps, plus a
/// walk of one size class) with s streams holding free blocks (the steal search); a free
/// O(length of one size class); growth and release O(chunks + blocks touched).
/// Zero bytes: allocate returns nullptr; deallocate(nullptr, ...) does nothing.
/// Misuse (foreign pointer, double free, wrong size) is reported through report_misuse and
/// changes nothing.
template <class Upstream, class Observer = no_observer>
class stream_pool : public forward_properties<stream_pool<Upstream, Observer>, Upstream> {
  using classes = detail::stream_pool::size_classes;
  static constexpr std::size_t quantum = classes::quantum;
  static constexpr std::size_t max_lanes = 64;
  static constexpr std::size_t default_growth_step = std::size_t{64} << 20;
  static constexpr std::size_t bin_probe = 4;  // bin entries looked at for an exact size

 public:
  explicit stream_pool(Upstream upstream = Upstream{}, stream_pool_options options = {}, Observer observer = {})
      : upstream_(std::move(upstream)), observer_(std::move(observer)), options_(options) {
    if (options_.small_max > classes::max_small)
      detail::throw_invalid_argument(name(), "small_max above the largest size class (1 MiB)");
    if (options_.maximum_size != 0 && options_.initial_size > options_.maximum_size)
      detail::throw_invalid_argument(name(), "initial_size above maximum_size");
    info0_ = &streams_[0];  // present from the start: merging iterates streams_ while keying blocks to 0
    lane_list_.reserve(max_lanes);
    if constexpr (has_contiguous_growth<Upstream>) {
      contiguous_ = upstream_.contiguous();
      granularity_ = std::max(quantum, upstream_.granularity());
    }
    if (options_.initial_size != 0) {
      std::lock_guard lock(heap_mutex_);
      try {
        grow_by(align_up(options_.initial_size, granularity_), *info0_);
      } catch (...) {  // the destructor will not run: free the node grow_by recycled
        while (spare_ != nullptr) delete std::exchange(spare_, spare_->next);
        throw;
      }
    }
  }

  stream_pool(const stream_pool&) = delete;
  stream_pool& operator=(const stream_pool&) = delete;

  /// Gives every chunk back. Waits (blocking) for the work pending on streams that freed
  /// blocks, so nothing is returned while in use. Live allocations are reported as misuse.
  ~stream_pool() {
    std::lock_guard lock(heap_mutex_);
    flush_lanes();
    if (std::size_t live = stats_locked().live_bytes; live != 0)
      report_misuse({misuse::live_at_destruction, name(), nullptr, live, 0});
    for (auto& [key, info] : streams_) {
      if (key == 0 || info.index.empty()) continue;
      try {
        info.stream.record().make_wait(stream_ref{});
      } catch (...) {
        report_misuse({misuse::upstream_failure, name(), nullptr, 0, 0});
      }
    }
    for (auto& [addr, c] : chunks_) {
      for (block* b = c->first; b != nullptr;) {
        block* next = b->next;
        delete b;
        b = next;
      }
      upstream_.deallocate_sync(reinterpret_cast<void*>(c->addr), c->size, quantum);
      observer_.on_release(reinterpret_cast<void*>(c->addr), c->size);
      delete c;
    }
    while (spare_ != nullptr) delete std::exchange(spare_, spare_->next);
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "stream_pool"; }

  /// Allocates `bytes` ordered on `s`: usable by work enqueued on `s` after this call.
  /// Throws invalid_argument (bad alignment, absurd size), out_of_memory (the upstream or the
  /// maximum size is exhausted even after merging streams and releasing; nothing changed).
  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    // The bin path, free of calls so that it stays small enough to inline: a valid
    // small request on the calling thread's last lane, its lock free, its bin holding the
    // size. A request above small_max goes to the heap in one call; everything else (a bin
    // miss, a contended lane, zero bytes, bad input) is out of line too.
    if (bytes - 1 < options_.small_max && align - 1 < quantum && (align & (align - 1)) == 0) [[likely]] {
      if (lane* l = cached_lane(s.key()); l != nullptr && l->mutex.try_lock()) [[likely]] {
        block* b = bin_take(*l, align_up(bytes, quantum), bytes);
        l->mutex.unlock();
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
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    // The bin path, free of calls like allocate()'s: a well-formed free of a block
    // of the calling thread's last lane, its lock free and its bin with room. Everything else
    // (nullptr, misuse, a full bin, another stream's block, a contended lane) is out of line.
    if (bytes > options_.small_max) return deallocate_slow(s, p, bytes);  // a heap block (or misuse)
    bool small = align <= quantum;  // with bytes <= small_max: may be a lane's block
    if (small && p != nullptr) [[likely]] {
      if (lane* l = cached_lane(s.key()); l != nullptr && l->mutex.try_lock()) [[likely]] {
        bool cached = false;
        if (block** found = l->live.find(reinterpret_cast<std::uintptr_t>(p)))
          cached = !(*found)->cached && (*found)->requested == bytes && !l->stream.stale(s) && bin_give(*l, *found);
        l->mutex.unlock();
        if (cached) [[likely]] {
          observer_.on_deallocate(p, bytes, s);
          return;
        }
      }
    }
    deallocate_other(s, p, bytes, small);
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
    flush_lanes();
    merge_idle_streams();
    return release_locked();
  }

  /// True when `p` is a live allocation of this pool, on any stream.
  [[nodiscard]] bool owns(const void* p) const {
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(heap_mutex_);
    if (const_cast<live_map&>(heap_live_).find(addr)) return true;
    bool found = false;
    for_each_lane([&](lane& l) {
      if (found) return;  // a block is in one lane's map at most
      block** b = l.live.find(addr);
      found = b != nullptr && !(*b)->cached;
    });
    return found;
  }

  /// A consistent snapshot (takes every lock briefly).
  [[nodiscard]] vram::stats stats() const {
    std::lock_guard lock(heap_mutex_);
    return stats_locked();
  }

  /// Verifies the structures: every reserved byte is in exactly one block, blocks tile their
  /// chunks, the free index, the live maps and the bins agree with the blocks, no two adjacent
  /// free blocks with the same stream key. Throws std::logic_error. Full walk under VRAM_DEBUG,
  /// the counter equation otherwise. May be called while other threads use the pool: it holds
  /// the heap mutex and every lane's lock for the whole check, so it sees one consistent state
  /// (those threads wait for it, on their bin paths too).
  void check_invariants() const {
    std::lock_guard lock(heap_mutex_);
    all_lanes_held lanes(lane_list_);
    auto fail = [](const char* what) { throw std::logic_error(std::string("stream_pool invariant: ") + what); };
    vram::stats st = stats_locked(lanes);  // free bytes: reserved minus live, by construction
    if (st.live_bytes > st.reserved_bytes) fail("live above reserved");
    if (st.peak_live_bytes < st.live_bytes || st.peak_reserved_bytes < st.reserved_bytes) fail("peak below current");
#if VRAM_DEBUG
    std::size_t reserved = 0, free_bytes = 0, free_count = 0, live_bytes = 0, live_count = 0, lane_blocks = 0;
    std::map<const stream_info*, std::size_t> free_per_stream;
    std::map<std::uintptr_t, const block*> heap_booked;  // heap-live blocks booked to a lane
    std::size_t heap_unbooked = 0, heap_unbooked_requested = 0;
    for (auto& [addr, c] : chunks_) {
      if (addr != c->addr || c->first == nullptr || c->first->prev != nullptr) fail("chunk head");
      reserved += c->size;
      std::uintptr_t at = c->addr;
      const block* last = nullptr;
      for (const block* b = c->first; b != nullptr; b = b->next) {
        if (b->addr != at || b->size == 0 || b->size % quantum != 0 || b->owner != c) fail("blocks do not tile the chunk");
        if (b->prev != last) fail("list links");
        at += b->size;
        last = b;
        switch (b->state) {
          case block_state::free:
            ++free_count;
            free_bytes += b->size;
            ++free_per_stream[b->stream];
            if (!b->stream->index.contains(b)) fail("free block not indexed");
            if (b->next && b->next->state == block_state::free && b->next->stream == b->stream)
              fail("adjacent free blocks with one key not coalesced");
            break;
          case block_state::live:
            ++live_count;
            live_bytes += b->size;
            if (const_cast<live_map&>(heap_live_).find(b->addr) == nullptr) fail("live block not in the live map");
            if (b->booked != nullptr) {
              heap_booked.emplace(b->addr, b);
            } else {
              heap_unbooked += b->size;
              heap_unbooked_requested += b->requested;
            }
            break;
          case block_state::lane: ++lane_blocks; break;
        }
      }
      if (last != c->last || at != c->addr + c->size) fail("chunk tail");
    }
    if (reserved != reserved_) fail("chunk sizes != reserved");
    std::size_t lane_live = 0, lane_cached = 0;
    lanes.each([&](lane& l) {
      std::size_t in_map_cached = 0, requested = 0, live_in_lane = 0;
      l.live.for_each([&](std::uintptr_t a, block* b) {
        if (b->addr != a || b->state != block_state::lane || b->booked != &l) fail("lane live map");
        if (b->cached) {
          ++in_map_cached;
          return;
        }
        ++lane_live;
        live_bytes += b->size;
        live_in_lane += b->size;
        requested += b->requested;
      });
      for (const auto& [a, b] : heap_booked)
        if (b->booked == &l) {
          live_in_lane += b->size;
          requested += b->requested;
        }
      ledger books = l.net();
      if (requested != books.requested || live_in_lane != books.live) fail("lane ledger disagrees with its blocks");
      if (books.peak_requested < books.requested || books.peak_live < books.live) fail("lane peaks");
      std::size_t bytes = 0, in_bins = 0;
      for (std::size_t i = 0; i < classes::count; ++i)
        for (block* b : l.bins[i]) {
          if (b->state != block_state::lane || !b->cached || classes::index(b->size) != i) fail("bin holds a wrong block");
          if (l.live.find(b->addr) == nullptr) fail("cached block not in the lane's map");
          bytes += b->size;
          ++in_bins;
        }
      if (in_bins != in_map_cached) fail("bins disagree with the lane's map");
      lane_cached += in_bins;
      if (bytes != l.cached_bytes) fail("lane cached bytes");
      free_bytes += bytes;
      free_count += in_bins;
    });
    if (free_bytes != st.free_bytes || free_count != st.free_blocks) fail("free bytes or blocks disagree with the blocks");
    if (live_bytes != st.live_bytes) fail("live bytes disagree with the blocks");
    if (heap_live_.size() != live_count) fail("heap live map disagrees with the blocks");
    if (heap_unbooked != heap_ledger_.live || heap_unbooked_requested != heap_ledger_.requested)
      fail("heap ledger disagrees with its blocks");
    if (lane_live + lane_cached != lane_blocks) fail("lanes disagree with the blocks");
    for (auto& [key, info] : streams_)
      if (info.index.size() != free_per_stream[&info]) fail("per-stream free counts");
#endif
  }

  [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] const stream_pool_options& options() const noexcept { return options_; }
  [[nodiscard]] Observer& observer() noexcept { return observer_; }

  friend bool operator==(const stream_pool& a, const stream_pool& b) noexcept { return &a == &b; }

 private:
  // A lane-owned block (in a bin or in a lane's live map) is `lane` either way: the heap reads
  // neighbours' states under its own mutex, so lanes never write the state on their path.
  enum class block_state : std::uint8_t { free, live, lane };
  struct chunk;
  struct block;
  struct lane;
  struct stream_info;

  /// A block of a chunk, host-side. Within a chunk, blocks are linked in address order and
  /// tile it: first->addr == chunk.addr, b->addr + b->size == b->next->addr.
  struct block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::size_t requested = 0;  // live: what the caller asked for
    block* prev = nullptr;
    block* next = nullptr;      // also links spare nodes
    chunk* owner = nullptr;
    stream_info* stream = nullptr;  // free: the stream it is reusable on (info0_: any); its index lists it
    std::uint64_t epoch = 0;    // free: the stream's free counter when it was freed
    block_state state = block_state::free;
    bool cached = false;        // lane-owned: in a bin (written and read under the lane's lock only)
    std::uint32_t free_class = 0;  // free: its class in the index (set and read by the index)
    lane* booked = nullptr;     // live: whose ledger counts it (a lane-owned block: its lane; nullptr: the heap's)
    block* free_prev = nullptr;  // free: links of its stream key's best-fit index
    block* free_next = nullptr;
  };

  /// A range held from the upstream (with a contiguous upstream, adjacent ranges are one chunk).
  struct chunk {
    std::uintptr_t addr;
    std::size_t size;
    block* first;
    block* last;
  };


  /// What the heap knows about a stream that freed blocks.
  struct stream_info {
    detail::stream_pool::freeing_stream stream;
    detail::stream_pool::free_index<block> index;  // its free blocks (key 0: usable by every stream)
    std::uint64_t epoch = 0;       // incremented per free on this stream
    std::optional<detail::stream_pool::stream_marker> pending;  // recorded at steal or merge time
    std::uint64_t pending_epoch = 0;             // blocks with epoch <= this precede `pending`
  };

  using live_map = detail::stream_pool::flat_map<block*>;

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
    void book(std::size_t size, std::size_t bytes, std::size_t credit_live = 0, std::size_t credit_requested = 0) noexcept {
      live += size;
      peak_live = std::max(peak_live, live - credit_live);
      requested += bytes;
      peak_requested = std::max(peak_requested, requested - credit_requested);
      ++allocations;
    }
    void unbook(std::size_t size, std::size_t bytes) noexcept {
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
    block** slots = nullptr;
    std::size_t count = 0;
    [[nodiscard]] block** begin() const noexcept { return slots; }
    [[nodiscard]] block** end() const noexcept { return slots + count; }
    void push(block* b) noexcept { slots[count++] = b; }  // pre: count < capacity
    /// Takes the most recently cached block of exactly `size` bytes, or nullptr. A class up to
    /// linear_max holds one size; above, a class holds several and the last few are looked at.
    block* pop(std::size_t size) noexcept {
      if (size <= classes::linear_max) return count != 0 ? slots[--count] : nullptr;
      for (std::size_t i = count, stop = count > bin_probe ? count - bin_probe : 0; i > stop; --i)
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
        : key(k), stream(s), bin_storage(std::make_unique<block*[]>(classes::count * bin_capacity)) {
      for (std::size_t i = 0; i < classes::count; ++i) bins[i].slots = bin_storage.get() + i * bin_capacity;
    }
    mutable detail::stream_pool::spin_lock mutex;
    std::uintptr_t key;
    detail::stream_pool::freeing_stream stream;
    std::unique_ptr<block*[]> bin_storage;
    std::array<bin, classes::count> bins;
    live_map live;
    std::size_t cached_bytes = 0;
    ledger books;         // the live blocks booked to this lane, gross of `credit`
    heap_credit credit;   // booked here, freed through the heap

    /// Books a block of this lane (pre: its lock held).
    void book(std::size_t size, std::size_t bytes) noexcept {
      books.book(size, bytes, credit.live.load(std::memory_order_relaxed),
                 credit.requested.load(std::memory_order_relaxed));
    }
    /// The ledger net of the heap's credit (pre: its lock and the heap mutex held).
    [[nodiscard]] ledger net() const noexcept {
      ledger n = books;
      n.live -= credit.live.load(std::memory_order_relaxed);
      n.requested -= credit.requested.load(std::memory_order_relaxed);
      n.deallocations += credit.deallocations.load(std::memory_order_relaxed);
      return n;
    }
  };

  /// The calling thread's last lane lookup. Pool ids are never reused and lanes live as long
  /// as their pool, so a hit (same pool id, same stream key) is always a valid lane.
  struct lane_cache {
    std::uint64_t pool = 0;
    std::uintptr_t key = 0;
    lane* l = nullptr;
  };
  static constinit thread_local lane_cache last_lane_;  // defined after the class: nvcc 13 rejects an in-class
                                             // initializer of a thread_local of a nested type

  // ---- lanes --------------------------------------------------------------------------

  static std::size_t lane_home(std::uintptr_t key) noexcept {
    return static_cast<std::size_t>(((key >> 4) * 0x9E3779B97F4A7C15ull) >> 58);  // 6 bits: max_lanes
  }
  static_assert(max_lanes == 64);

  /// The calling thread's last lane if it is `key`'s, else nullptr (no search).
  lane* cached_lane(std::uintptr_t key) const noexcept {
    const lane_cache& cache = last_lane_;
    return cache.pool == id_ && cache.key == key ? cache.l : nullptr;
  }

  lane* find_lane(std::uintptr_t key) const noexcept {
    if (lane* l = cached_lane(key)) [[likely]]
      return l;
    lane_cache& cache = last_lane_;
    for (std::size_t i = 0, slot = lane_home(key); i < max_lanes; ++i, slot = (slot + 1) % max_lanes) {
      std::uintptr_t k = lane_keys_[slot].load(std::memory_order_acquire);
      if (k == key + 1) {
        cache = lane_cache{id_, key, lanes_[slot].get()};
        return cache.l;
      }
      if (k == 0) return nullptr;
    }
    return nullptr;
  }

  /// The lane of `s`, created on first use; nullptr when the lane table is full.
  lane* lane_for(stream_ref s) {
    if (lane* l = find_lane(s.key())) [[likely]]
      return l;
    return add_lane(s);
  }
  [[gnu::noinline]] lane* add_lane(stream_ref s) {  // out of line: keeps lane_for small enough to inline
    std::uintptr_t key = s.key();
    std::lock_guard lock(heap_mutex_);
    for (std::size_t i = 0, slot = lane_home(key); i < max_lanes; ++i, slot = (slot + 1) % max_lanes) {
      std::uintptr_t k = lane_keys_[slot].load(std::memory_order_relaxed);
      if (k == key + 1) return lanes_[slot].get();
      if (k == 0) {
        lanes_[slot] = std::make_unique<lane>(key, s, options_.bin_capacity);
        lane_list_.push_back(lanes_[slot].get());  // capacity reserved: cannot throw
        lane_keys_[slot].store(key + 1, std::memory_order_release);
        return lanes_[slot].get();
      }
    }
    return nullptr;
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
          b = bin_take(*l, align_up(bytes, quantum), bytes);
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
    std::optional<detail::stream_pool::stream_marker> wait_on;
    block* b;
    {
      std::lock_guard heap_lock(heap_mutex_);
      b = heap_take(s, align_up(bytes, quantum), quantum, bytes, wait_on);
      std::lock_guard lock(l.mutex);
      try {
        l.live.insert(b->addr, b);
      } catch (...) {
        heap_free(b, *b->stream);  // back under its own key: it may have been stolen
        throw;
      }
      b->state = block_state::lane;
      b->cached = false;
      lane_take(l, b, bytes);
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
          if (b->cached || b->requested != bytes) [[unlikely]] {
            misuse_report r{b->cached ? misuse::double_free : misuse::wrong_size, name(), p, bytes,
                            b->cached ? 0 : b->requested};
            lock.unlock();
            report_misuse(r);
            return;
          }
          if (l->stream.stale(s)) l->stream.refresh(s);
          if (bin_give(*l, b)) {
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
    std::optional<detail::stream_pool::stream_marker> wait_on;
    block* b;
    {
      std::lock_guard heap_lock(heap_mutex_);
      b = heap_take(s, align_up(bytes, quantum), std::max(align, quantum), bytes, wait_on);
      try {
        heap_live_.insert(b->addr, b);
      } catch (...) {
        heap_free(b, *b->stream);  // back under its own key: it may have been stolen
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

  template <class F>
  void for_each_lane(F&& f) const {  // pre: heap_mutex_ held (it guards lane_list_)
    for (lane* l : lane_list_) {
      std::lock_guard lock(l->mutex);
      f(*l);
    }
  }

  /// Every lane's lock, held together for as long as it lives (a view no bin path can change
  /// mid-way). Taken in lane_list_ order after the heap mutex; no other path holds two lane
  /// locks, so the order cannot deadlock. Pre: heap_mutex_ held for its whole life.
  class all_lanes_held {
   public:
    explicit all_lanes_held(const std::vector<lane*>& lanes) noexcept : lanes_(lanes) {
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

  /// Moves every cached block back to the heap (pre: heap_mutex_ held).
  void flush_lanes() noexcept {
    for_each_lane([&](lane& l) {
      if (l.cached_bytes == 0) return;
      auto& info = info_of(l.key);
      if (l.key != 0) info.stream = l.stream;
      for (auto& bin : l.bins) {
        for (block* b : bin) {
          l.live.erase(b->addr);
          b->cached = false;
          heap_free(b, info);
        }
        bin.count = 0;
      }
      l.cached_bytes = 0;
    });
  }

  // ---- bins ---------------------------------------------------------------------------

  /// A bin hit: the cached block of exactly `size` bytes, booked live for `requested`; or
  /// nullptr (nothing changed). Pre: l's lock held.
  block* bin_take(lane& l, std::size_t size, std::size_t requested) noexcept {
    block* b = l.bins[classes::index(size)].pop(size);
    if (b != nullptr) {
      b->cached = false;  // stays in the lane's map: no map update on a bin hit
      l.cached_bytes -= size;
      b->requested = requested;  // b->booked is l already: a lane's blocks are booked to it
      l.book(b->size, requested);
    }
    return b;
  }
  /// Caches live block b (of lane l, freed well-formed on l's stream) in its bin; false
  /// (nothing changed) when the bin or the lane's cache is full. Pre: l's lock held.
  bool bin_give(lane& l, block* b) noexcept {
    auto& bin = l.bins[classes::index(b->size)];
    if (bin.count >= options_.bin_capacity || l.cached_bytes + b->size > options_.lane_cache_bytes) return false;
    lane_give(l, b);
    b->cached = true;  // stays in the lane's map, marked cached
    bin.push(b);
    l.cached_bytes += b->size;
    return true;
  }

  // ---- accounting ---------------------------------------------------------------------

  // Counting is per ledger (a lane's under its lock, the heap's under the heap mutex; a heap
  // free credits the lane instead, without its lock: heap_credit): no atomic
  // read-modify-write on the bin path.
  void lane_take(lane& l, block* b, std::size_t requested) noexcept {  // pre: l's lock held
    b->requested = requested;
    b->booked = &l;
    l.book(b->size, requested);
  }
  void lane_give(lane& l, block* b) noexcept {  // pre: l's lock held
    l.books.unbook(b->size, b->requested);
  }

  vram::stats stats_locked() const {  // pre: heap_mutex_ held
    return stats_over([&](auto&& f) { for_each_lane(f); });
  }
  vram::stats stats_locked(const all_lanes_held& lanes) const {  // pre: heap_mutex_ and every lane held
    return stats_over([&](auto&& f) { lanes.each(f); });
  }

  /// The figures, with `each_lane(f)` calling f on every lane under its lock (pre: heap_mutex_ held).
  template <class EachLane>
  vram::stats stats_over(EachLane&& each_lane) const {
    vram::stats st;
    st.live_bytes = heap_ledger_.live;
    st.requested_bytes = heap_ledger_.requested;
    std::size_t peak_live = heap_ledger_.peak_live;
    std::size_t peak_requested = heap_ledger_.peak_requested;
    st.reserved_bytes = reserved_;
    st.peak_reserved_bytes = peak_reserved_;
    st.total_allocations = heap_ledger_.allocations;
    st.total_deallocations = heap_ledger_.deallocations;
    for (auto& [key, info] : streams_) {
      st.free_blocks += info.index.size();
      if (const block* b = info.index.largest()) st.largest_free_block = std::max(st.largest_free_block, b->size);
    }
    each_lane([&](lane& l) {
      ledger books = l.net();
      st.live_bytes += books.live;
      peak_live += books.peak_live;
      st.total_allocations += books.allocations;
      st.total_deallocations += books.deallocations;
      st.requested_bytes += books.requested;
      peak_requested += books.peak_requested;
      for (const auto& bin : l.bins) {
        st.free_blocks += bin.count;
        for (const block* b : bin) st.largest_free_block = std::max(st.largest_free_block, b->size);
      }
    });
    // Every reserved byte is live or free (in an index or a bin): the free bytes need no counter.
    st.free_bytes = reserved_ - st.live_bytes;
    // Peaks: the sum of the ledgers' peaks bounds the true peak from above, and is exact when
    // one ledger was ever used (one stream). The reserved peak bounds the live peak too, and
    // the live peak the requested one (a block is never smaller than its request).
    st.peak_live_bytes = std::max(st.live_bytes, std::min(peak_live, peak_reserved_));
    st.peak_requested_bytes = std::max(st.requested_bytes, std::min(peak_requested, st.peak_live_bytes));
    st.live_allocations = st.total_allocations - st.total_deallocations;
    st.upstream_allocations = upstream_allocations_;
    st.upstream_deallocations = upstream_deallocations_;
    st.ooms = ooms_;
    return st;
  }

  // ---- the heap (everything below: heap_mutex_ held) ----------------------------------

  /// streams_[key], remembering the last key looked up (unordered_map nodes are stable).
  stream_info& info_of(std::uintptr_t key) {
    if (key == 0) return *info0_;
    if (key != last_info_key_ || last_info_ == nullptr) {
      last_info_ = &streams_[key];
      last_info_key_ = key;
    }
    return *last_info_;
  }

  /// A node holding `init`: a recycled one when there is one. (Taking `init` rather than
  /// resetting the node and then setting fields lets the compiler write each field once,
  /// instead of a `rep stos` over the whole node followed by the stores.)
  block* new_block(const block& init = {}) {
    if (spare_ != nullptr) {
      block* b = std::exchange(spare_, spare_->next);
      *b = init;
      return b;
    }
    return new block(init);
  }
  void delete_block(block* b) noexcept {
    b->next = spare_;
    spare_ = b;
  }

  void index_insert(block* b) {
    b->state = block_state::free;
    b->stream->index.insert(b);
  }
  void index_erase(block* b) noexcept { b->stream->index.erase(b); }

  /// Whether free neighbour n may join a free block keyed `key`: the same key, or (`widen`)
  /// n is usable by every stream (key 0) and the block is a stream's. The union is keyed to
  /// that stream (usable by every stream is the weaker promise), so a block freed on a stream
  /// merges with the fresh or merged memory around it instead of leaving a seam at every key
  /// change. A key-0 block never absorbs a stream's block: fresh memory must stay usable by
  /// the stream that grew the pool.
  bool joins(const block* n, const stream_info* stream, bool widen) const noexcept {
    return n != nullptr && n->state == block_state::free &&
           (n->stream == stream || (widen && stream != info0_ && n->stream == info0_));
  }
  /// b (not indexed) absorbs its joinable free neighbours; returns the survivor. The union
  /// keeps b's key (a stream's block takes key-0 neighbours over; a key-0 block joins only
  /// key-0 ones), so absorbing on one side never makes the other side joinable: one walk to
  /// the left, then one to the right. A side may hold several joinable blocks in a row
  /// (0 | S | 0 | S runs form when key-0 blocks are freed beside a stream's).
  block* coalesce(block* b, bool widen = true) noexcept {
    const stream_info* key = b->stream;
    while (joins(b->prev, key, widen)) {
      block* p = b->prev;
      index_erase(p);
      absorb(p, b);
      b = p;
    }
    while (joins(b->next, key, widen)) {
      block* n = b->next;
      index_erase(n);
      absorb(b, n);
    }
    return b;
  }
  /// a (not indexed) takes over its successor n; the union keeps the stream key of either (0
  /// only if both are 0) and the epoch of the parts with that key.
  void absorb(block* a, block* n) noexcept {
    if (a->stream == n->stream) {
      a->epoch = std::max(a->epoch, n->epoch);
    } else if (a->stream == info0_) {
      a->stream = n->stream;
      a->epoch = n->epoch;
    }
    a->size += n->size;
    a->next = n->next;
    if (n->next) n->next->prev = a;
    if (n->owner->last == n) n->owner->last = a;
    delete_block(n);
  }

  /// Returns b to the free index of `info`'s stream, coalescing.
  void heap_free(block* b, stream_info& info) noexcept {
    b->stream = &info;
    b->epoch = ++info.epoch;
    b->state = block_state::free;
    index_insert(coalesce(b));
  }

  /// Best fit on `key` for `need` bytes, or end. With a contiguous upstream the free block at
  /// the top of the highest chunk (the "wilderness", which in-place growth extends) is taken
  /// only when no other block fits: carving small blocks out of it would pin the top and
  /// make the next large request grow instead of extending it.
  block* fit(const stream_info& stream, std::size_t need) {
    const auto& index = stream.index;
    block* b = index.best_fit(need);
    if (b != nullptr && is_wilderness(b))
      if (block* next = index.next(b)) return next;
    return b;
  }

  /// The smallest adequate block usable on `stream` without waiting (its own or global).
  block* find_fit(const stream_info& stream, std::size_t need) {
    block* any = fit(*info0_, need);
    if (&stream == info0_) return any;
    block* own = fit(stream, need);
    if (own == nullptr || any == nullptr) return own != nullptr ? own : any;
    // As if one index held both: the smaller block wins, then the lower address; the
    // wilderness loses to any other block.
    bool own_first = is_wilderness(own) != is_wilderness(any)
                         ? !is_wilderness(own)
                         : (own->size != any->size ? own->size < any->size : own->addr < any->addr);
    return own_first ? own : any;
  }
  bool is_wilderness(const block* b) const noexcept { return contiguous_ && b == top_->last; }
  /// Call after chunks_ changed: keeps top_ (the highest chunk) current.
  void chunks_changed() noexcept { top_ = chunks_.empty() ? nullptr : chunks_.rbegin()->second; }

  /// The smallest adequate block of another stream, and a marker the caller must wait on.
  block* steal(std::uintptr_t key, std::size_t need, std::optional<detail::stream_pool::stream_marker>& wait_on) {
    block* best = nullptr;
    for (auto& [k, info] : streams_) {
      if (k == key || k == 0 || info.index.empty()) continue;
      block* b = fit(info, need);
      if (b != nullptr && (best == nullptr || b->size < best->size)) best = b;
    }
    if (best == nullptr) return nullptr;
    auto& info = *best->stream;
    if (!info.pending || best->epoch > info.pending_epoch) {
      info.pending = info.stream.record();
      info.pending_epoch = info.epoch;
    }
    wait_on = info.pending;
    return best;
  }

  /// True when a stream other than `key` holds free blocks (merging blocks of `key` itself
  /// cannot give a request on `key` anything: they are already usable on it and coalesce
  /// with the key-0 memory around them).
  bool others_hold_free(std::uintptr_t key) const noexcept {
    for (const auto& [k, info] : streams_)
      if (k != 0 && k != key && !info.index.empty()) return true;
    return false;
  }

  /// For each stream holding free blocks: record a marker if none is pending; when the
  /// pending marker is complete, re-key the blocks freed before it to "any stream".
  void merge_idle_streams() {
    for (auto& [k, info] : streams_) {
      // Two rounds: an old marker may cover only some blocks; a fresh one covers the rest.
      for (int round = 0; round < 2 && k != 0 && !info.index.empty(); ++round) {
        if (!info.pending) {
          info.pending = info.stream.record();
          info.pending_epoch = info.epoch;
        }
        if (!info.pending->query()) break;
        std::vector<block*> ready;
        std::uint64_t before = info.pending_epoch;  // (a structured binding: not capturable before C++20's fix in clang 16)
        info.index.for_each([&](block* b) {
          if (b->epoch <= before) ready.push_back(b);
        });
        info.pending.reset();
        for (block* b : ready) {  // only key-0 neighbours join: blocks still keyed k wait their turn
          index_erase(b);
          b->stream = info0_;
          index_insert(coalesce(b, false));
        }
      }
    }
  }

  /// A free block of `size` bytes aligned to `align`, taken out of the heap (state left to
  /// the caller). Tries, in order: own/global best fit, another stream's (with a wait),
  /// merging bins and idle streams, growth, release + growth; then throws out_of_memory.
  block* heap_take(stream_ref s, std::size_t size, std::size_t align, std::size_t requested,
                   std::optional<detail::stream_pool::stream_marker>& wait_on) {
    std::uintptr_t key = s.key();
    const stream_info& own = info_of(key);
    std::size_t need = size + (align > quantum ? align - quantum : 0);
    block* b = find_fit(own, need);
    if (b == nullptr) b = steal(key, need, wait_on);
    if (b == nullptr || is_wilderness(b)) {  // before growing or taking the top, coalesce what can be
      flush_lanes();
      if (others_hold_free(key)) merge_idle_streams();
      wait_on.reset();
      b = find_fit(own, need);
      if (b == nullptr) b = steal(key, need, wait_on);
    }
    if (b == nullptr) b = grow(s, need, requested);
    return carve(b, size, align);
  }

  /// Splits `size` bytes at `align` out of free block b; the rest stays free with b's key.
  block* carve(block* b, std::size_t size, std::size_t align) {
    index_erase(b);
    std::uintptr_t start = align_up(b->addr, align);
    if (start != b->addr) {  // keep the front as a free block
      block* rest = split(b, start - b->addr);
      rest->state = block_state::live;
      index_insert(b);
      b = rest;
    }
    b->state = block_state::live;  // out of the free structures until the caller sets the state
    if (b->size - size >= quantum) index_insert(split(b, size));
    return b;
  }

  /// Cuts b after `front` bytes; returns the new successor block (same key and epoch).
  block* split(block* b, std::size_t front) {
    block* n = new_block({.addr = b->addr + front,
                          .size = b->size - front,
                          .prev = b,
                          .next = b->next,
                          .owner = b->owner,
                          .stream = b->stream,
                          .epoch = b->epoch});
    if (b->next) b->next->prev = n;
    b->next = n;
    b->size = front;
    if (b->owner->last == b) b->owner->last = n;
    return n;
  }

  /// Grows so that a block of `need` bytes usable on s exists, and returns it.
  block* grow(stream_ref s, std::size_t need, std::size_t requested) {
    stream_info& own = info_of(s.key());
    // In-place growth: with a contiguous upstream a free block at the top of the highest
    // chunk, usable on s, only needs topping up (if the upstream places the new range there).
    std::size_t credit = 0;
    stream_info* top_stream = info0_;
    if (contiguous_ && !chunks_.empty()) {
      block* top = top_->last;
      if (top->state == block_state::free && (top->stream == info0_ || top->stream == &own) && top->size < need) {
        credit = top->size;
        top_stream = top->stream;
      }
    }
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::size_t missing = align_up(need - credit, granularity_);
      std::size_t step = options_.growth_step != 0 ? options_.growth_step : (contiguous_ ? 0 : default_growth_step);
      std::size_t bytes = std::max(missing, align_up(step, granularity_));
      if (options_.maximum_size != 0) {  // a capped pool reaches exactly its maximum (RMM #1957)
        std::size_t room = options_.maximum_size > reserved_ ? options_.maximum_size - reserved_ : 0;
        bytes = std::min(bytes, room);
      }
      if (bytes >= missing && try_grow(bytes, credit != 0 ? *top_stream : *info0_)) {
        if (block* b = find_fit(own, need)) return b;
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
    bool capped = options_.maximum_size != 0 && need > options_.maximum_size - std::min(reserved_, options_.maximum_size);
    detail::throw_out_of_memory(name(), requested, s, snapshot, capped ? options_.maximum_size : 0, "maximum_size");
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

  /// Adds [p, p+bytes) from the upstream as one free block keyed to `stream`; merges it into
  /// adjacent chunks when the upstream is contiguous. Throws what the upstream throws.
  void grow_by(std::size_t bytes, stream_info& stream) {
    block* nb = new_block();
    void* p;
    try {
      p = upstream_.allocate_sync(bytes, quantum);
    } catch (...) {
      delete_block(nb);
      throw;
    }
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    nb->addr = addr;
    nb->size = bytes;
    nb->stream = &stream;
    nb->epoch = &stream != info0_ ? stream.epoch : 0;
    chunk* c = nullptr;
    if (contiguous_) {
      auto after = chunks_.lower_bound(addr);
      if (after != chunks_.begin()) {
        chunk* before = std::prev(after)->second;
        if (before->addr + before->size == addr) {  // extend the chunk below
          c = before;
          c->last->next = nb;
          nb->prev = c->last;
          c->last = nb;
          c->size += bytes;
        }
      }
      if (c == nullptr) {
        c = new chunk{addr, bytes, nb, nb};
        after = chunks_.emplace_hint(after, addr, c);
        ++after;
      }
      if (after != chunks_.end() && after->first == addr + bytes) {  // absorb the chunk above
        chunk* above = after->second;
        for (block* b = above->first; b != nullptr; b = b->next) b->owner = c;
        c->last->next = above->first;
        above->first->prev = c->last;
        c->last = above->last;
        c->size += above->size;
        chunks_.erase(after);
        delete above;
      }
    } else {
      c = new chunk{addr, bytes, nb, nb};
      chunks_.emplace(addr, c);
    }
    nb->owner = c;
    chunks_changed();
    reserved_ += bytes;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    ++upstream_allocations_;
    index_insert(coalesce(nb));
    observer_.on_grow(p, bytes);
  }

  /// Gives back what release() promises; returns the bytes released.
  std::size_t release_locked() {
    std::vector<block*> candidates;
    info0_->index.for_each([&](block* b) { candidates.push_back(b); });
    std::size_t released = 0;
    for (block* b : candidates) {
      chunk* c = b->owner;
      if (!contiguous_) {
        if (c->first != b || c->last != b) continue;
        index_erase(b);
        chunks_.erase(c->addr);
        chunks_changed();
        give_back(c->addr, c->size);
        released += c->size;
        delete_block(b);
        delete c;
        continue;
      }
      std::uintptr_t lo = align_up(b->addr, granularity_), hi = align_down(b->addr + b->size, granularity_);
      if (hi <= lo) continue;
      released += hi - lo;
      cut(b, lo, hi);
    }
    return released;
  }

  /// Contiguous upstream: returns [lo, hi) (granule-aligned, inside free block b) and splits
  /// b's chunk around the hole.
  void cut(block* b, std::uintptr_t lo, std::uintptr_t hi) {
    chunk* c = b->owner;
    std::uintptr_t c_end = c->addr + c->size, b_end = b->addr + b->size;
    index_erase(b);
    block* before = b->prev;
    block* after = b->next;
    block* old_last = c->last;
    block* head = nullptr;
    block* tail = nullptr;
    if (hi < b_end) {
      tail = new_block();
      tail->addr = hi;
      tail->size = b_end - hi;
      tail->stream = b->stream;
      tail->epoch = b->epoch;
    }
    if (lo > b->addr) {
      head = b;
      head->size = lo - b->addr;
    } else {
      delete_block(b);
    }
    // The part below the hole stays in c.
    block* low_last = head ? head : before;
    if (low_last) {
      low_last->next = nullptr;
      c->last = low_last;
      c->size = lo - c->addr;
    } else {
      chunks_.erase(c->addr);
      delete c;
      c = nullptr;
    }
    // The part above the hole becomes a new chunk.
    block* high_first = tail ? tail : after;
    if (high_first) {
      chunk* h = new chunk{hi, c_end - hi, high_first, tail && !after ? tail : old_last};
      if (tail) {
        tail->next = after;
        if (after) after->prev = tail;
      }
      high_first->prev = nullptr;
      for (block* x = high_first; x != nullptr; x = x->next) x->owner = h;
      chunks_.emplace(hi, h);
    }
    chunks_changed();
    if (head) index_insert(head);
    if (tail) index_insert(tail);
    give_back(lo, hi - lo);
  }

  void give_back(std::uintptr_t addr, std::size_t bytes) noexcept {
    upstream_.deallocate_sync(reinterpret_cast<void*>(addr), bytes, quantum);
    reserved_ -= bytes;
    ++upstream_deallocations_;
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
      for_each_lane([&](lane& l) {
        block** in_lane = b != nullptr || expected != 0 || cached ? nullptr : l.live.find(addr);
        if (in_lane == nullptr) return;
        if ((*in_lane)->cached) {
          cached = true;
          return;
        }
        if ((*in_lane)->requested != bytes) {
          expected = (*in_lane)->requested;
          return;
        }
        b = *in_lane;
        l.live.erase(addr);
        lane_give(l, b);
      });
    }
    if (b == nullptr) {
      misuse kind = expected != 0 ? misuse::wrong_size
                                  : (cached || free_block_at(addr) ? misuse::double_free : misuse::foreign_pointer);
      lock.unlock();
      report_misuse({kind, name(), p, bytes, expected});
      return;
    }
    stream_info& info = info_of(s.key());
    if (&info != info0_) info.stream.refresh(s);  // before keying a block to s
    heap_free(b, info);
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

  /// True when addr starts a free block (a second free of a block); pre: addr is in no map.
  bool free_block_at(std::uintptr_t addr) const noexcept {
    auto it = chunks_.upper_bound(addr);
    if (it == chunks_.begin()) return false;
    const chunk* c = std::prev(it)->second;
    if (addr >= c->addr + c->size) return false;
    for (const block* b = c->first; b != nullptr && b->addr <= addr; b = b->next)
      if (b->addr == addr) return b->state != block_state::live;  // lane: not in a live map, so in a bin
    return false;
  }

  [[no_unique_address]] Upstream upstream_;
  [[no_unique_address]] Observer observer_;
  stream_pool_options options_;
  bool contiguous_ = false;
  std::size_t granularity_ = quantum;

  const std::uint64_t id_ = detail::pool_next_id();  // names this pool in threads' lane caches

  // Lanes: slots are claimed under heap_mutex_ and never freed before destruction.
  std::array<std::atomic<std::uintptr_t>, max_lanes> lane_keys_{};  // stream key + 1; 0: empty slot
  std::array<std::unique_ptr<lane>, max_lanes> lanes_;
  std::vector<lane*> lane_list_;  // the lanes in creation order, for walks (guarded by heap_mutex_)

  // The heap, guarded by heap_mutex_. Lock order: heap_mutex_, then a lane's lock.
  mutable detail::stream_pool::heap_mutex heap_mutex_;
  // Free blocks are indexed per stream key (stream_info::index).
  std::map<std::uintptr_t, chunk*> chunks_;      // by address; sum of sizes == reserved_
  chunk* top_ = nullptr;                         // the highest chunk (its last block: the wilderness)
  live_map heap_live_;                           // live blocks not served by a lane
  std::unordered_map<std::uintptr_t, stream_info> streams_;
  stream_info* info0_ = nullptr;      // &streams_[0] (nodes of an unordered_map are stable)
  stream_info* last_info_ = nullptr;  // info_of's memo: &streams_[last_info_key_], a stream's key
  std::uintptr_t last_info_key_ = 0;
  block* spare_ = nullptr;                       // recycled block nodes
  // reserved_ == live bytes of all ledgers + the sizes of indexed blocks + sum of lanes' cached_bytes
  std::size_t reserved_ = 0;
  std::size_t peak_reserved_ = 0;
  ledger heap_ledger_;  // heap-live blocks booked to no lane (their stream had none: over 64 streams)
  std::size_t upstream_allocations_ = 0;
  std::size_t upstream_deallocations_ = 0;
  std::size_t ooms_ = 0;
};

template <class Upstream, class Observer>
constinit thread_local typename stream_pool<Upstream, Observer>::lane_cache stream_pool<Upstream, Observer>::last_lane_{};

static_assert(resource<stream_pool<host_source>>);
static_assert(resource_with<stream_pool<host_source>, host_accessible>);
static_assert(has_try_allocate<stream_pool<host_source>> && has_release<stream_pool<host_source>> &&
              has_stats<stream_pool<host_source>> && has_owns<stream_pool<host_source>> &&
              has_check_invariants<stream_pool<host_source>>);

}  // namespace vram

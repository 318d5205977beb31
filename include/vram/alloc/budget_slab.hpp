#pragma once
// vram::budget_slab: a hard device budget, carved into size-class slabs and page runs, that
// spills to (mapped, pinned) host memory instead of failing when the budget is full.
// One file past 650 lines because what is left here is the class's own code: its page table,
// partial lists, thread caches' registry and spill side are one state under one mutex, which
// every member below reads. The parts that stand alone are beside it (detail/budget_slab/:
// constants, size classes, the page table entry and the free-run index; the per-thread caches).

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/config.hpp>
#include <vram/core/error.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/event.hpp>
#include <vram/core/observer.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/throw.hpp>
#include <vram/alloc/detail/budget_slab/pages.hpp>
#include <vram/alloc/detail/budget_slab/thread_cache.hpp>
#include <vram/source/host_source.hpp>
#if VRAM_HAS_CUDA
#  include <vram/source/cuda_pinned_source.hpp>
#endif

namespace vram {

/// Where an allocation of a budget_slab lives.
enum class residency : std::uint8_t {
  none,    ///< not an allocation of this slab
  device,  ///< inside the device budget
  host,    ///< spilled to the Spill source
};

/// The budgets of a budget_slab.
struct budget_slab_options {
  /// Device bytes, taken from the Device source once, at construction (rounded down to whole
  /// 64 KiB pages); never more.
  std::size_t device_budget = 0;
  /// Bytes that may be live on the spill side at once; beyond it, out_of_memory.
  std::size_t spill_budget = ~std::size_t{0};
};

#if VRAM_HAS_CUDA
using default_spill_source = cuda_pinned_source;
#else
using default_spill_source = host_source;
#endif

/// A fixed device budget with spill to host memory: the allocator for serving a model in a
/// bounded share of a GPU, degrading to slower memory instead of crashing.
///
/// - The whole budget is reserved from `Device` at construction, in one allocation, and cut
///   into 64 KiB pages (a reservation, so no other tenant can take it later; nothing beyond it
///   is ever taken from the device). Requests up to 32 KiB come from size classes (powers of
///   two from 256 B): a slab is one page with a bitmap of its blocks, and each class keeps a
///   list of its slabs with a free block, so a hit is O(1). Larger requests take a run of whole
///   pages (best fit over a size-ordered index of free runs, O(log n), merged on free); single
///   pages (a new slab, a request of 32..64 KiB) come from a cache of 64 free pages in O(1),
///   flushed into the runs (merged) when a larger run is not found.
/// - When the budget cannot serve a request, the pressure callback (if any) runs first, so the
///   caller may free or evict cold data; if it returns true the device is tried again. Then
///   the request is served from `Spill` (cuda_pinned_source by default: mapped host memory
///   that a kernel can still use over the bus; host_source without CUDA), counted in
///   stats().spills / spilled_bytes / peak_spilled_bytes. Spilled memory is freed back to
///   `Spill`, so once device memory is freed, later requests go to the device again.
/// - Beyond the spill budget too: vram::out_of_memory naming both budgets.
/// - residency(p) says where an allocation lives.
/// - Thread caches: a size-class block freed at the default alignment goes to a small cache of
///   the freeing thread (per class at most 16 blocks and 64 KiB: 316 KiB a thread at most),
///   and that thread's next request of the class takes it back; neither touches the lock, so a
///   pair costs no atomic read-modify-write. A full class list gives its older half back to
///   the slabs; a thread's whole cache goes back before it spills and when it exits. Blocks in
///   other threads' caches are not available to a thread (they are free, but held): at worst
///   a request spills while other threads hold up to 316 KiB each.
///
/// Thread safety: all members may be called concurrently (one spin lock around the
/// bookkeeping, and the thread caches above; Spill is called and the pressure callback runs
/// outside the lock). The device budget cannot be exceeded even transiently (it is a single
/// reservation), and the spill budget is charged before Spill is called and released only
/// after Spill has a freed block back, so neither concurrent spills nor a slow spill free
/// (cudaFreeHost) can overshoot it: a spill that needs room still being freed is refused.
/// Stats: exact once the threads that use the slab are quiet (counts, live and requested
/// bytes, spills); while they run, stats() adds each thread cache's counters as last written.
/// Peaks (peak_live_bytes, peak_requested_bytes) are kept under the lock, which counts cached
/// blocks as live (with the size their allocation from the slab named): they may be off the
/// true peaks by the bytes the caches held at the time.
/// free_blocks / largest_free_block describe the slabs and pages, not the caches.
/// Streams: memory is ready when allocate returns. deallocate(s, p, ...) synchronizes `s`
/// before the block can be handed out again (to any stream); free with deallocate_sync after
/// your own synchronization to avoid that wait. (For stream-ordered reuse without waits, use
/// stream_pool.)
/// Alignment: at least 256; up to 64 KiB on the device (a request is served from the class
/// of max(bytes, align)); a larger alignment is an invalid argument.
/// Upstreams: both held by value; the reservation is returned in the destructor.
/// Zero bytes: allocate returns nullptr; deallocate(nullptr, ...) does nothing.
/// Misuse on deallocate (foreign pointer, double free, size of another class or run, a
/// spilled pointer freed twice) is reported and changes nothing. Each block has an atomic
/// state (free, live, cached), so a second free of a block that sits in any thread's cache is
/// caught too (two frees of one block racing each other on two threads are not). The size check on the
/// device is per size class (the class of the size given must be the block's class; the
/// size recorded at allocation is what leaves requested_bytes); runs and spilled blocks
/// check the exact size.
template <class Device, class Spill = default_spill_source, class Observer = no_observer>
  requires resource<Device> && resource<Spill>
class budget_slab {
  using page = detail::budget_slab::page;

 public:
  budget_slab(Device device, Spill spill, budget_slab_options options, Observer observer = {})
      : device_(std::move(device)), spill_(std::move(spill)), observer_(std::move(observer)),
        spill_budget_(options.spill_budget) {
    namespace ds = detail::budget_slab;
    std::size_t reserve = align_down(options.device_budget, ds::page_bytes);
    if (reserve == 0) detail::throw_invalid_argument(name(), "device_budget must be at least one page (64 KiB)");
    if (reserve > max_request_bytes) detail::throw_invalid_argument(name(), "absurd device_budget");
    // Pages must start page-aligned, so every class block and run is aligned to its size up
    // to a page. The reservation is asked for at page alignment; a Device that refuses that
    // alignment (cuda_device_source: 256 B) is asked at its default, and if its base is not
    // page-aligned the pages start at the first aligned address: the budget loses one page.
    reservation_align_ = ds::page_bytes;
    try {
      reservation_ = static_cast<char*>(device_.allocate_sync(reserve, reservation_align_));
    } catch (const vram::invalid_argument&) {
      reservation_align_ = default_alignment;
      reservation_ = static_cast<char*>(device_.allocate_sync(reserve, reservation_align_));
    }
    reservation_bytes_ = reserve;
    auto raw = reinterpret_cast<std::uintptr_t>(reservation_);
    base_ = reservation_ + (align_up(raw, ds::page_bytes) - raw);
    page_count_ = (reserve - static_cast<std::size_t>(base_ - reservation_)) / ds::page_bytes;
    if (page_count_ == 0) {
      device_.deallocate_sync(reservation_, reservation_bytes_, reservation_align_);
      detail::throw_invalid_argument(name(), "device_budget of one page on a Device whose base is not 64 KiB-aligned");
    }
    try {
      pages_.resize(page_count_);
      blocks_.resize(page_count_);
      class_tag_ = std::make_unique<std::atomic<std::uint8_t>[]>(page_count_);
      runs_.give(0, page_count_);
    } catch (...) {
      device_.deallocate_sync(reservation_, reservation_bytes_, reservation_align_);
      throw;
    }
    partial_.fill(ds::none);
    counters_.reserved_bytes = counters_.peak_reserved_bytes = device_budget();
    counters_.upstream_allocations = 1;
    observer_.on_grow(reservation_, reservation_bytes_);
  }

  budget_slab(Device device, budget_slab_options options)
    requires std::default_initializable<Spill> && std::default_initializable<Observer>
      : budget_slab(std::move(device), Spill{}, options) {}

  budget_slab(const budget_slab&) = delete;
  budget_slab& operator=(const budget_slab&) = delete;

  ~budget_slab() {
    // Detach the thread caches (a thread that exits later must not flush into a dead slab).
    // Not under lock_: a thread exiting now holds its cache's retire_mutex and then takes lock_.
    std::vector<std::shared_ptr<detail::budget_slab::thread_cache>> caches;
    {
      std::lock_guard lock(lock_);
      caches.swap(caches_);
    }
    for (auto& c : caches) {
      std::lock_guard guard(c->retire_mutex);
      c->slab = nullptr;
    }
    vram::stats s = counters_;
    for (auto& c : caches) add_cache_counters(s, *c);
    if (s.total_allocations != s.total_deallocations)
      report_misuse({misuse::live_at_destruction, name(), nullptr, s.live_bytes, 0});
    for (auto& [p, e] : spilled_) spill_.deallocate_sync(p, e.bytes, e.align);
    observer_.on_release(reservation_, reservation_bytes_);
    device_.deallocate_sync(reservation_, reservation_bytes_, reservation_align_);
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "budget_slab"; }

  /// Allocates from the device budget, else (after the pressure callback) from Spill.
  /// Throws invalid_argument (bad alignment or size), out_of_memory (both budgets exhausted).
  [[nodiscard]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    // The hot path: 1..32 KiB at the default alignment, from this thread's cache (no lock).
    // Everything else (a slab's block under the lock, runs, pressure, spill): allocate_slow.
    if (bytes - 1 < detail::budget_slab::max_class && align == default_alignment) [[likely]] {
      if (void* p = take_cached(detail::budget_slab::class_of(bytes), bytes)) [[likely]] {
        observer_.on_allocate(p, bytes, s);
        return p;
      }
    }
    return allocate_slow(s, bytes, align);
  }

 private:
  /// allocate() when the hot path did not serve: checks, new slabs, runs, pressure, spill.
  [[gnu::noinline]] void* allocate_slow(stream_ref s, std::size_t bytes, std::size_t align) {
    detail::check_request(name(), bytes, align);
    if (align > detail::budget_slab::page_bytes) [[unlikely]]
      detail::throw_invalid_argument(name(), "alignment above the slab page (64 KiB)");
    if (bytes == 0) return nullptr;
    void* p = allocate_device(bytes, align);
    if (p == nullptr && flush_own_cache()) p = allocate_device(bytes, align);  // this thread's cached blocks first
    if (p == nullptr && pressure_ && pressure_(bytes)) p = allocate_device(bytes, align);
    if (p == nullptr) p = allocate_spill(s, bytes, align);
    observer_.on_allocate(p, bytes, s);
    return p;
  }

 public:
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    if (!s.is_synchronous()) {
      try {
        synchronize(s);  // the block may be handed to another stream next
      } catch (...) {
        report_misuse({misuse::upstream_failure, name(), p, bytes, 0});
        return;  // the stream failed: leak the block rather than reuse memory a kernel may touch
      }
    }
    deallocate_sync(p, bytes, align);
    observer_.on_deallocate(p, bytes, s);
  }

  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align);
  }

  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    // The hot path: a size-class block into this thread's cache (no lock).
    if (in_budget(p) && put_cached(p, bytes, align)) [[likely]]
      return;
    deallocate_slow(p, bytes, align);
  }

  /// Where `p` lives: device (inside the budget's range), host (a live spilled block), none.
  [[nodiscard]] vram::residency residency(const void* p) const {
    if (in_budget(p)) return vram::residency::device;
    std::lock_guard lock(lock_);
    return spilled_.contains(const_cast<void*>(p)) ? vram::residency::host : vram::residency::none;
  }

 private:
  /// deallocate_sync() when the cache did not take the block: under the lock (a slab's block
  /// or a run, or misuse reported), or a spilled block.
  [[gnu::noinline]] void deallocate_slow(void* p, std::size_t bytes, std::size_t align) noexcept {
    if (in_budget(p)) {
      std::lock_guard lock(lock_);
      free_device(p, bytes, align);
      return;
    }
    if (p != nullptr) free_spilled(p, bytes);
  }

  /// deallocate_sync() of a pointer outside the budget: a spilled block, or misuse.
  [[gnu::noinline]] void free_spilled(void* p, std::size_t bytes) noexcept {
    spill_entry e;
    {
      std::lock_guard lock(lock_);
      auto it = spilled_.find(p);
      if (it == spilled_.end()) {
        report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
        return;
      }
      if (it->second.bytes != bytes) {
        report_misuse({misuse::wrong_size, name(), p, bytes, it->second.bytes});
        return;
      }
      e = it->second;
      spilled_.erase(it);
      counters_.spilled_bytes -= bytes;
      counters_.live_bytes -= bytes;
      counters_.requested_bytes -= bytes;
      counters_.reserved_bytes -= bytes;
      ++counters_.total_deallocations;
      ++counters_.upstream_deallocations;
    }
    // The charge is released once Spill has the memory back (a pinned free is slow): until
    // then the block still counts against the spill budget, so no instant exceeds it.
    spill_.deallocate_sync(p, e.bytes, e.align);
    std::lock_guard lock(lock_);
    spill_charged_ -= bytes;
  }

 public:
  /// True when `p` is a live allocation of this slab.
  [[nodiscard]] bool owns(const void* p) const {
    std::lock_guard lock(lock_);
    if (!in_budget(p)) return spilled_.contains(const_cast<void*>(p));
    auto [i, off] = locate(p);
    const page& pg = pages_[i];
    if (pg.type == page::kind::run_head) return off == 0;
    if (pg.type != page::kind::slab) return false;
    std::size_t cb = detail::budget_slab::class_bytes(pg.cls);
    std::size_t k = off >> detail::budget_slab::class_shift(pg.cls);
    return (off & (cb - 1)) == 0 && bit(pg, k) &&
           blocks_[i]->state[k].load(std::memory_order_relaxed) == detail::budget_slab::block_state::live;
  }

  /// Runs before spilling with the bytes requested; may free memory of this slab (or evict
  /// elsewhere). Return true to have the device tried again. Set before concurrent use.
  void set_pressure_callback(std::function<bool(std::size_t)> callback) { pressure_ = std::move(callback); }

  /// Changes the spill budget; live spilled blocks above a lowered budget stay valid (and are
  /// freed normally), only new spills are refused until the spilled bytes fit under it.
  void set_spill_budget(std::size_t bytes) noexcept {
    std::lock_guard lock(lock_);
    spill_budget_ = bytes;
  }
  [[nodiscard]] std::size_t spill_budget() const noexcept {
    std::lock_guard lock(lock_);
    return spill_budget_;
  }
  /// The device bytes this slab manages (the budget rounded down to whole pages).
  [[nodiscard]] std::size_t device_budget() const noexcept { return page_count_ * detail::budget_slab::page_bytes; }

  /// A snapshot: live_bytes counts both sides (device blocks as rounded, spilled as asked);
  /// reserved_bytes == device_budget() + spilled_bytes; free/largest/blocks describe the device.
  [[nodiscard]] vram::stats stats() const {
    std::lock_guard lock(lock_);
    vram::stats s = snapshot_locked();
    s.largest_free_block = runs_.largest() * detail::budget_slab::page_bytes;
    s.free_blocks = runs_.runs() + free_class_blocks_;
    if (s.largest_free_block == 0 && free_class_blocks_ != 0) s.largest_free_block = largest_free_class_block();
    return s;
  }

  /// Verifies pages, slabs, runs, lists and totals; throws std::logic_error. Under VRAM_DEBUG.
  /// Exact when the threads that use the slab are quiet: their caches change without the
  /// lock, so a check while they run may see a state no single instant had.
  void check_invariants() const {
#if VRAM_DEBUG
    namespace ds = detail::budget_slab;
    std::lock_guard lock(lock_);
    std::vector<char> covered(page_count_, 0);  // 1 free, 2 slab, 3 run
    std::size_t device_live = 0, free_blocks = 0, live_blocks = 0, cached_bytes = 0;
    std::size_t counted = 0, requested = 0;  // what counters_ holds; what the callers asked for
    for (auto [first, n] : runs_.by_address()) {
      if (first + n > page_count_) fail("a free run leaves the budget");
      for (std::size_t i = first; i < first + n; ++i) {
        if (covered[i]) fail("free runs overlap");
        covered[i] = 1;
      }
      if (pages_[first].type == page::kind::slab || pages_[first].type == page::kind::run_head)
        fail("a free run starts at a used page");
    }
    std::size_t free_pages = 0;
    for (auto [first, n] : runs_.by_address()) free_pages += n;
    for (const std::size_t* c = runs_.cached_begin(); c != runs_.cached_end(); ++c) {
      if (*c >= page_count_) fail("a cached free page outside the budget");
      if (covered[*c]) fail("a cached free page is also in a run (or cached twice)");
      if (pages_[*c].type == page::kind::slab || pages_[*c].type == page::kind::run_head)
        fail("a cached free page is in use");
      covered[*c] = 1;
      ++free_pages;
    }
    if (free_pages != runs_.free_pages()) fail("free page count != runs + cached pages");
    for (std::size_t i = 0; i < page_count_; ++i) {
      const page& pg = pages_[i];
      if (covered[i] == 1) continue;
      if (pg.type == page::kind::slab && covered[i] == 0) {
        std::size_t cb = ds::class_bytes(pg.cls), blocks = ds::page_bytes / cb, pop = 0;
        for (auto w : pg.bits) pop += static_cast<std::size_t>(std::popcount(w));
        if (pop != pg.used || pg.used > blocks) fail("slab used count != live bits");
        if (pg.listed != (pg.used < blocks)) fail("a slab with a free block is not listed (or a full one is)");
        device_live += pg.used * cb;
        free_blocks += blocks - pg.used;
        live_blocks += pg.used;
        if (blocks_[i] == nullptr || class_tag_[i].load() != pg.cls + 1u) fail("a slab without its class tag or block states");
        for (std::size_t k = 0; k < blocks; ++k) {
          auto st = blocks_[i]->state[k].load();
          if ((st != ds::block_state::free) != bit(pg, k)) fail("a block's state disagrees with its bitmap bit");
          if (st == ds::block_state::cached) cached_bytes += cb;
          if (st != ds::block_state::free) counted += blocks_[i]->counted[k];
          if (st == ds::block_state::live) requested += blocks_[i]->requested[k].load();
        }
        covered[i] = 2;
      } else if (pg.type == page::kind::run_head && covered[i] == 0) {
        if (pg.run_pages == 0 || i + pg.run_pages > page_count_) fail("a run leaves the budget");
        if (ds::page_bytes * pg.run_pages < pg.requested) fail("a run smaller than its request");
        for (std::size_t k = i; k < i + pg.run_pages; ++k) {
          if (covered[k]) fail("a run overlaps something");
          covered[k] = 3;
        }
        device_live += pg.run_pages * ds::page_bytes;
        counted += pg.requested;
        requested += pg.requested;
        ++live_blocks;
      }
    }
    for (std::size_t i = 0; i < page_count_; ++i) {
      if (!covered[i]) fail("a page is neither free, a slab nor in a run");
      if (covered[i] != 2 && class_tag_[i].load() != 0) fail("a class tag on a page that is not a slab");
    }
    // Exact when the caches' owner threads are quiet (as every check in the tests is).
    std::size_t held = 0;
    for (const auto& c : caches_)
      held += c->held_bytes();
    if (held != cached_bytes) fail("bytes held by the thread caches != blocks in the cached state");
    for (std::size_t c = 0; c < ds::class_count; ++c)
      for (std::size_t i = partial_[c], prev = ds::none; i != ds::none; prev = i, i = pages_[i].next)
        if (pages_[i].type != page::kind::slab || pages_[i].cls != c || pages_[i].prev != prev || !pages_[i].listed)
          fail("a class list is broken");
    std::size_t spilled = 0;
    for (auto& [p, e] : spilled_) spilled += e.bytes;
    if (spilled != counters_.spilled_bytes || spilled > spill_charged_) fail("spilled bytes disagree");
    if (device_live + spilled != counters_.live_bytes) fail("live_bytes != device blocks + spilled");
    if (device_live > device_budget()) fail("over the device budget");
    if (counters_.reserved_bytes != device_budget() + spilled) fail("reserved != budget + spilled");
    if (free_blocks != free_class_blocks_) fail("free class block count");
    if (counters_.total_allocations - counters_.total_deallocations != live_blocks + spilled_.size())
      fail("total_allocations - total_deallocations != device blocks + spilled blocks");
    if (counters_.peak_live_bytes < counters_.live_bytes || counters_.peak_requested_bytes < counters_.requested_bytes)
      fail("a live total above its peak");
    if (counted + spilled != counters_.requested_bytes) fail("requested_bytes != the sizes counted for the blocks");
    if (requested + spilled != snapshot_locked().requested_bytes) fail("requested bytes != the live blocks' requests");
#endif
  }

  [[nodiscard]] const Device& upstream() const noexcept { return device_; }
  [[nodiscard]] const Spill& spill_upstream() const noexcept { return spill_; }
  [[nodiscard]] Observer& observer() noexcept { return observer_; }

  friend bool operator==(const budget_slab& a, const budget_slab& b) noexcept { return &a == &b; }
  // Device memory or host memory: only what both sides provide can be promised.
  template <class P>
    requires has_property<Device, P> && has_property<Spill, P>
  friend constexpr void get_property(const budget_slab&, P) noexcept {}

 private:
  struct spill_entry {
    std::size_t bytes = 0;
    std::size_t align = 0;
  };

  [[noreturn]] static void fail(const char* what) { throw std::logic_error(std::string("budget_slab: ") + what); }

  [[nodiscard]] bool in_budget(const void* p) const noexcept {
    auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(base_);
    return a >= b && a - b < page_count_ * detail::budget_slab::page_bytes;
  }
  [[nodiscard]] std::pair<std::size_t, std::size_t> locate(const void* p) const noexcept {
    auto off = static_cast<std::size_t>(static_cast<const char*>(p) - base_);
    return {off / detail::budget_slab::page_bytes, off % detail::budget_slab::page_bytes};
  }
  static bool bit(const page& pg, std::size_t k) noexcept { return (pg.bits[k / 64] >> (k % 64)) & 1u; }

  // The counters kept per operation: live and requested bytes, their peaks, the two totals.
  // live_allocations and free_bytes are derived in snapshot_locked().
  void note_device_alloc(std::size_t footprint, std::size_t bytes) noexcept {
    counters_.live_bytes += footprint;
    counters_.requested_bytes += bytes;
    ++counters_.total_allocations;
    counters_.peak_live_bytes = std::max(counters_.peak_live_bytes, counters_.live_bytes);
    counters_.peak_requested_bytes = std::max(counters_.peak_requested_bytes, counters_.requested_bytes);
  }
  void note_device_free(std::size_t footprint, std::size_t bytes) noexcept {
    counters_.live_bytes -= footprint;
    counters_.requested_bytes -= bytes;
    ++counters_.total_deallocations;
  }

  /// counters_ with the derived fields filled in. Pre: lock held.
  [[nodiscard]] vram::stats snapshot_locked() const noexcept {
    vram::stats s = counters_;
    s.requested_bytes += requested_carried_;
    for (const auto& c : caches_) add_cache_counters(s, *c);
    // The peaks are kept over counters_ (see the class comment): never below the current figures.
    s.peak_live_bytes = std::max(s.peak_live_bytes, s.live_bytes);
    s.peak_requested_bytes = std::max(s.peak_requested_bytes, s.requested_bytes);
    s.live_allocations = s.total_allocations - s.total_deallocations;
    s.free_bytes = device_budget() - (s.live_bytes - s.spilled_bytes);
    return s;
  }

  /// Adds what the operations served by cache `c` changed to `s` (a snapshot while its owner runs).
  static void add_cache_counters(vram::stats& s, const detail::budget_slab::thread_cache& c) noexcept {
    const std::size_t allocations = c.allocations.load(std::memory_order_relaxed);
    s.live_bytes -= c.held_bytes();
    s.requested_bytes += c.requested_bytes.load(std::memory_order_relaxed);
    s.total_allocations += allocations;
    s.total_deallocations += allocations + c.held_blocks();
  }

  // ---- thread caches: no lock, no atomic read-modify-write ---------------------------------

  /// This thread's cache for this slab, or nullptr when it has none yet.
  [[nodiscard]] detail::budget_slab::thread_cache* own_cache() const noexcept {
    auto& last = detail::budget_slab::tls_last_cache;
    if (last.slab_id == id_) [[likely]]
      return last.cache;
    return find_own_cache();
  }
  [[gnu::noinline]] detail::budget_slab::thread_cache* find_own_cache() const noexcept {
    for (auto& [id, c] : detail::budget_slab::tls_caches.owned)
      if (id == id_) {
        detail::budget_slab::tls_last_cache = {id_, c.get()};
        return c.get();
      }
    return nullptr;
  }
  /// Makes this thread's cache (on its first free into this slab); nullptr when memory is short.
  [[gnu::noinline]] detail::budget_slab::thread_cache* make_own_cache() noexcept {
    auto& set = detail::budget_slab::tls_caches;
    try {
      set.forget_retired();
      set.owned.reserve(set.owned.size() + 1);
      auto c = std::make_shared<detail::budget_slab::thread_cache>();
      c->slab = this;
      c->retire = &retire_cache;
      {
        std::lock_guard lock(lock_);
        caches_.push_back(c);
      }
      set.owned.emplace_back(id_, c);  // cannot throw: reserved
      detail::budget_slab::tls_last_cache = {id_, c.get()};
      return c.get();
    } catch (...) {
      return nullptr;
    }
  }

  /// allocate()'s first try: the newest cached block of class `cls`, or nullptr.
  [[gnu::always_inline]] void* take_cached(std::size_t cls, std::size_t bytes) noexcept {
    namespace ds = detail::budget_slab;
    ds::thread_cache* c = own_cache();
    if (c == nullptr) return nullptr;
    const std::size_t n = c->count(cls);
    if (n == 0) return nullptr;
    void* p = c->blocks[cls][n - 1];
    c->set_count(cls, n - 1);
    auto [i, off] = locate(p);
    const std::size_t k = off >> ds::class_shift(cls);
    blocks_[i]->state[k].store(ds::block_state::live, std::memory_order_relaxed);
    blocks_[i]->requested[k].store(static_cast<std::uint16_t>(bytes), std::memory_order_relaxed);
    ds::owner_add(c->requested_bytes, bytes);
    ds::owner_add(c->allocations, std::size_t{1});
    return p;
  }

  /// deallocate()'s first try: a live block of a slab, freed with a size of its class, goes to
  /// this thread's cache (half of a full class list is flushed first). False, with nothing
  /// changed, for anything else: the locked path then frees it or reports the misuse.
  [[gnu::always_inline]] bool put_cached(void* p, std::size_t bytes, std::size_t align) noexcept {
    namespace ds = detail::budget_slab;
    auto [i, off] = locate(p);
    const std::uint8_t tag = class_tag_[i].load(std::memory_order_acquire);
    if (tag == 0) return false;  // not a slab (a run, a free page)
    const std::size_t cls = tag - 1u, shift = ds::class_shift(cls), k = off >> shift;
    const std::size_t need = std::max(bytes, align);
    if ((off & ((std::size_t{1} << shift) - 1)) != 0 || need > ds::max_class || ds::class_of(need) != cls) return false;
    auto& state = blocks_[i]->state[k];
    if (state.load(std::memory_order_relaxed) != ds::block_state::live) return false;  // double free: reported there
    ds::thread_cache* c = own_cache();
    if (c == nullptr) [[unlikely]] {
      c = make_own_cache();
      if (c == nullptr) return false;
    }
    if (c->count(cls) == ds::cache_depth(cls)) [[unlikely]]
      flush_cache(*c, cls, ds::cache_depth(cls) / 2);
    state.store(ds::block_state::cached, std::memory_order_relaxed);
    const std::size_t n = c->count(cls);
    c->blocks[cls][n] = p;
    c->set_count(cls, n + 1);
    ds::owner_add(c->requested_bytes, std::size_t{0} - blocks_[i]->requested[k].load(std::memory_order_relaxed));
    return true;
  }

  /// Gives the oldest `n` cached blocks of class `cls` back to their slabs. Runs on the owner.
  void flush_cache(detail::budget_slab::thread_cache& c, std::size_t cls, std::size_t n) noexcept {
    std::lock_guard lock(lock_);
    flush_cache_locked(c, cls, n);
  }
  void flush_cache_locked(detail::budget_slab::thread_cache& c, std::size_t cls, std::size_t n) noexcept {
    namespace ds = detail::budget_slab;
    const std::size_t cb = ds::class_bytes(cls);
    for (std::size_t j = 0; j < n; ++j) {
      auto [i, off] = locate(c.blocks[cls][j]);
      const std::size_t k = off >> ds::class_shift(cls), counted = blocks_[i]->counted[k];
      release_block(i, k);
      // The block leaves the slab's counters (which counted it live) and the cache's (which
      // counted its free): the sums stay what the callers did.
      counters_.live_bytes -= cb;
      counters_.requested_bytes -= counted;
      ++counters_.total_deallocations;
      ds::owner_add(c.requested_bytes, counted);
    }
    std::copy(c.blocks[cls] + n, c.blocks[cls] + c.count(cls), c.blocks[cls]);
    c.set_count(cls, c.count(cls) - n);
  }

  /// Flushes this thread's whole cache (before spilling); true when it held anything.
  bool flush_own_cache() noexcept {
    detail::budget_slab::thread_cache* c = own_cache();
    if (c == nullptr) return false;
    bool any = false;
    std::lock_guard lock(lock_);
    for (std::size_t cls = 0; cls < detail::budget_slab::class_count; ++cls) {
      any = any || c->count(cls) != 0;
      flush_cache_locked(*c, cls, c->count(cls));
    }
    return any;
  }

  /// A thread with a cache of this slab exits (its cache's retire_mutex held): flush it, fold
  /// its counters into the slab's, and forget it.
  static void retire_cache(void* self, detail::budget_slab::thread_cache& c) noexcept {
    auto& slab = *static_cast<budget_slab*>(self);
    std::lock_guard lock(slab.lock_);
    for (std::size_t cls = 0; cls < detail::budget_slab::class_count; ++cls) slab.flush_cache_locked(c, cls, c.count(cls));
    // Emptied: what it changed is its allocations (each one a deallocation too) and its
    // requested bytes, which go to requested_carried_ (counters_ keeps what the bitmaps hold).
    const std::size_t allocations = c.allocations.load(std::memory_order_relaxed);
    slab.counters_.total_allocations += allocations;
    slab.counters_.total_deallocations += allocations;
    slab.requested_carried_ += c.requested_bytes.load(std::memory_order_relaxed);
    c.requested_bytes.store(0, std::memory_order_relaxed);  // folded: the destructor may still add this cache
    c.allocations.store(0, std::memory_order_relaxed);
    std::erase_if(slab.caches_, [&](const auto& e) { return e.get() == &c; });
    c.slab = nullptr;
  }

  /// Takes the lowest free block of slab `i` (of class `cls`, listed: it has one). Pre: lock held.
  void* pop_block(std::size_t i, std::size_t cls, std::size_t bytes) noexcept {
    namespace ds = detail::budget_slab;
    page& pg = pages_[i];
    std::size_t k = 0;
    for (std::size_t w = 0; w < ds::bitmap_words; ++w) {
      if (~pg.bits[w] != 0) {
        k = w * 64 + static_cast<std::size_t>(std::countr_one(pg.bits[w]));
        pg.bits[w] |= std::uint64_t{1} << (k % 64);
        break;
      }
    }
    blocks_[i]->state[k].store(ds::block_state::live, std::memory_order_relaxed);
    blocks_[i]->requested[k].store(static_cast<std::uint16_t>(bytes), std::memory_order_relaxed);
    blocks_[i]->counted[k] = static_cast<std::uint16_t>(bytes);
    if (++pg.used == ds::class_blocks(cls)) unlink(cls, i);
    --free_class_blocks_;
    note_device_alloc(ds::class_bytes(cls), bytes);
    return base_ + i * ds::page_bytes + (k << ds::class_shift(cls));
  }

  /// Returns block k of slab i to its bitmap (and an emptied slab to the pages, unless it is
  /// its class's last one: no thrash). Pre: lock held, the block is allocated in the bitmap.
  void release_block(std::size_t i, std::size_t k) noexcept {
    namespace ds = detail::budget_slab;
    page& pg = pages_[i];
    blocks_[i]->state[k].store(ds::block_state::free, std::memory_order_relaxed);
    pg.bits[k / 64] &= ~(std::uint64_t{1} << (k % 64));
    if (pg.used-- == ds::class_blocks(pg.cls)) link(pg.cls, i);
    ++free_class_blocks_;
    if (pg.used == 0 && !(partial_[pg.cls] == i && pg.next == ds::none)) {
      unlink(pg.cls, i);
      free_class_blocks_ -= ds::class_blocks(pg.cls);
      pg.type = page::kind::freed;
      class_tag_[i].store(0, std::memory_order_relaxed);
      give_pages(i, 1);
    }
  }

  /// From the budget, or nullptr when it has no room.
  void* allocate_device(std::size_t bytes, std::size_t align) {
    namespace ds = detail::budget_slab;
    std::size_t need = std::max(bytes, align);
    std::lock_guard lock(lock_);
    if (need <= ds::max_class) [[likely]] {
      std::size_t cls = ds::class_of(need);
      std::size_t i = partial_[cls];
      if (i == ds::none) [[unlikely]] {
        i = runs_.take(1);
        if (i == ds::none) return nullptr;
        if (blocks_[i] == nullptr) {  // the page's first time as a slab (the states stay: all free)
          try {
            blocks_[i] = std::make_unique<ds::slab_blocks>();
          } catch (...) {  // no host memory for the block states: serve this request from the spill side
            give_pages(i, 1);
            return nullptr;
          }
        }
        page& fresh = pages_[i];
        fresh = page{};
        fresh.type = page::kind::slab;
        fresh.cls = static_cast<std::uint8_t>(cls);
        link(cls, i);
        free_class_blocks_ += ds::class_blocks(cls);
        class_tag_[i].store(static_cast<std::uint8_t>(cls + 1), std::memory_order_release);  // after the states
      }
      return pop_block(i, cls, bytes);
    }
    std::size_t n = (bytes + ds::page_bytes - 1) / ds::page_bytes;
    if (n > page_count_) return nullptr;
    std::size_t i = runs_.take(n);  // may throw bad_alloc (a map node): nothing changed then
    if (i == ds::none) return nullptr;
    page& head = pages_[i];
    head.type = page::kind::run_head;
    head.run_pages = n;
    head.requested = bytes;
    note_device_alloc(n * ds::page_bytes, bytes);
    return base_ + i * ds::page_bytes;
  }

  /// Frees a device block, or reports misuse and changes nothing. Pre: lock held, in_budget(p).
  [[gnu::noinline]] void free_device(void* p, std::size_t bytes, std::size_t align) noexcept {
    namespace ds = detail::budget_slab;
    auto [i, off] = locate(p);
    page& pg = pages_[i];
    if (pg.type == page::kind::slab) {
      std::size_t cb = ds::class_bytes(pg.cls);
      std::size_t k = off >> ds::class_shift(pg.cls);
      if ((off & (cb - 1)) != 0) return report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
      // A block in a thread cache is allocated in the bitmap but already freed by the caller.
      if (!bit(pg, k) || blocks_[i]->state[k].load(std::memory_order_relaxed) != ds::block_state::live)
        return report_misuse({misuse::double_free, name(), p, bytes, 0});
      std::size_t need = std::max(bytes, align);
      if (need > ds::max_class || ds::class_of(need) != pg.cls)
        return report_misuse({misuse::wrong_size, name(), p, bytes, cb});
      // The counters hold `counted`; the caller's request may differ if a thread cache served
      // the block again since: the difference was counted by that cache and stays carried.
      const std::size_t counted = blocks_[i]->counted[k];
      note_device_free(cb, counted);
      requested_carried_ += counted - blocks_[i]->requested[k].load(std::memory_order_relaxed);
      release_block(i, k);
      return;
    }
    if (pg.type == page::kind::run_head && off == 0) {
      if (pg.requested != bytes) return report_misuse({misuse::wrong_size, name(), p, bytes, pg.requested});
      std::size_t n = pg.run_pages;
      pg.type = page::kind::freed;
      note_device_free(n * ds::page_bytes, bytes);
      give_pages(i, n);
      return;
    }
    bool was_block_start = off == 0 && pg.type == page::kind::freed;
    report_misuse({was_block_start ? misuse::double_free : misuse::foreign_pointer, name(), p, bytes, 0});
  }

  void give_pages(std::size_t first, std::size_t n) noexcept {
    try {
      runs_.give(first, n);
    } catch (...) {  // a map node could not be allocated: the pages stay out of use (reported)
      report_misuse({misuse::upstream_failure, name(), base_ + first * detail::budget_slab::page_bytes, n, 0});
    }
  }

  void* allocate_spill(stream_ref s, std::size_t bytes, std::size_t align) {
    {
      std::lock_guard lock(lock_);
      if (spill_budget_ < spill_charged_ || spill_budget_ - spill_charged_ < bytes) spill_failed_locked(s, bytes);
      spill_charged_ += bytes;  // charged before Spill is called: concurrent spills cannot overshoot
    }
    void* p = nullptr;
    try {
      p = spill_.allocate(s, bytes, align);
    } catch (const out_of_memory&) {
      std::lock_guard lock(lock_);
      spill_charged_ -= bytes;
      spill_failed_locked(s, bytes);
    } catch (...) {
      std::lock_guard lock(lock_);
      spill_charged_ -= bytes;
      throw;
    }
    std::unique_lock lock(lock_);
    try {
      spilled_.emplace(p, spill_entry{bytes, align});
    } catch (...) {  // no room to record it: give it back (outside the lock), then the charge
      lock.unlock();
      spill_.deallocate_sync(p, bytes, align);
      lock.lock();
      spill_charged_ -= bytes;
      throw;
    }
    ++counters_.spills;
    counters_.spilled_bytes += bytes;
    counters_.peak_spilled_bytes = std::max(counters_.peak_spilled_bytes, counters_.spilled_bytes);
    counters_.reserved_bytes += bytes;
    counters_.peak_reserved_bytes = std::max(counters_.peak_reserved_bytes, counters_.reserved_bytes);
    ++counters_.upstream_allocations;
    counters_.live_bytes += bytes;
    counters_.requested_bytes += bytes;
    ++counters_.total_allocations;
    counters_.peak_live_bytes = std::max(counters_.peak_live_bytes, counters_.live_bytes);
    counters_.peak_requested_bytes = std::max(counters_.peak_requested_bytes, counters_.requested_bytes);
    return p;
  }

  /// Pre: lock held (a std::lock_guard that the throw unwinds).
  [[noreturn]] void spill_failed_locked(stream_ref s, std::size_t bytes) {
    ++counters_.ooms;
    vram::stats snapshot = snapshot_locked();
    observer_.on_out_of_memory(bytes, s, snapshot);
    detail::throw_budgets_exhausted(name(), bytes, s, snapshot, device_budget(),
                                          spill_budget_ == ~std::size_t{0} ? detail::budget_slab::none : spill_budget_);
  }

  // The per-class lists of slabs with a free block (doubly linked through the page table).
  void link(std::size_t cls, std::size_t i) noexcept {
    page& pg = pages_[i];
    pg.prev = detail::budget_slab::none;
    pg.next = partial_[cls];
    if (pg.next != detail::budget_slab::none) pages_[pg.next].prev = i;
    partial_[cls] = i;
    pg.listed = true;
  }
  void unlink(std::size_t cls, std::size_t i) noexcept {
    page& pg = pages_[i];
    if (pg.prev != detail::budget_slab::none) pages_[pg.prev].next = pg.next;
    else partial_[cls] = pg.next;
    if (pg.next != detail::budget_slab::none) pages_[pg.next].prev = pg.prev;
    pg.prev = pg.next = detail::budget_slab::none;
    pg.listed = false;
  }

  [[nodiscard]] std::size_t largest_free_class_block() const noexcept {
    for (std::size_t c = detail::budget_slab::class_count; c-- > 0;)
      if (partial_[c] != detail::budget_slab::none) return detail::budget_slab::class_bytes(c);
    return 0;
  }

  [[no_unique_address]] Device device_;
  [[no_unique_address]] Spill spill_;
  [[no_unique_address]] Observer observer_;
  std::function<bool(std::size_t)> pressure_;

  char* reservation_ = nullptr;  // what Device gave: reservation_bytes_ bytes
  std::size_t reservation_bytes_ = 0;
  std::size_t reservation_align_ = 0;  // the alignment it was asked for (and is given back with)
  char* base_ = nullptr;         // the first page: page-aligned, inside the reservation
  std::size_t page_count_ = 0;   // base_ + page_count_ * page_bytes <= reservation_ + reservation_bytes_

  const std::uint64_t id_ = detail::budget_slab::next_slab_id.fetch_add(1, std::memory_order_relaxed);  // never reused
  // Read without the lock by the thread caches (written under it):
  std::unique_ptr<std::atomic<std::uint8_t>[]> class_tag_;  // per page: class + 1 while a slab, else 0
  std::vector<std::unique_ptr<detail::budget_slab::slab_blocks>> blocks_;  // per page, made when it first becomes a slab

  mutable detail::budget_slab::spinlock lock_;  // guards everything below
  std::vector<page> pages_;
  detail::budget_slab::free_runs runs_;  // free pages + slab pages + run pages == page_count_
  std::array<std::size_t, detail::budget_slab::class_count> partial_{};  // per class: first slab with a free block
  std::size_t free_class_blocks_ = 0;  // free blocks in all slabs
  std::unordered_map<void*, spill_entry> spilled_;  // live spilled blocks
  std::vector<std::shared_ptr<detail::budget_slab::thread_cache>> caches_;  // of the threads that freed into this slab
  std::size_t spill_budget_;
  std::size_t spill_charged_ = 0;  // spilled_bytes + spills in flight <= spill_budget_ (unless lowered)
  // live_bytes == device blocks allocated in the bitmaps (cached ones too) + spilled_bytes;
  // requested_bytes == sum of `counted` over the bitmaps' blocks + runs' requests + spilled_bytes;
  // reserved_bytes == device_budget() + spilled_bytes. stats() adds the caches' counters.
  // free_bytes == device_budget() - device blocks
  vram::stats counters_{};
  // Requested bytes counted outside counters_ (modular, like the caches' counters): retired
  // caches' counts, and for blocks a cache served again with another size and then freed
  // under the lock, counted - requested. Exactly: the callers' live requests ==
  // counters_.requested_bytes + requested_carried_ + the caches' requested_bytes.
  std::size_t requested_carried_ = 0;
};

static_assert(resource<budget_slab<host_source, host_source>>);

}  // namespace vram

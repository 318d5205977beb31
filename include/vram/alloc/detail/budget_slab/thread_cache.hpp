#pragma once
// Internals of vram::budget_slab: the per-thread caches of free size-class blocks, which let a
// thread's allocate/free pairs skip the slab's lock (no atomic read-modify-write on the way),
// and the per-block state that keeps double frees detectable while a block sits in a cache.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <vram/alloc/detail/budget_slab/pages.hpp>

namespace vram::detail::budget_slab {

// ---- tunable constants ----------------------------------------------------------------
/// A thread caches at most this many bytes of free blocks per size class ...
inline constexpr std::size_t cache_bytes_per_class = page_bytes;
/// ... and at most this many blocks per class.
inline constexpr std::size_t cache_max_depth = 16;

// ---- derived constants ----------------------------------------------------------------
/// Blocks of class cls a thread may cache: 16 of 256 B..4 KiB, 8 of 8 KiB, ... 2 of 32 KiB.
[[nodiscard]] constexpr std::size_t cache_depth(std::size_t cls) noexcept {
  return std::min(cache_max_depth, cache_bytes_per_class / class_bytes(cls));
}
static_assert(cache_depth(0) == cache_max_depth && cache_depth(class_count - 1) >= 2);

/// What a block of a slab is, to the lock-free paths (one byte per block, atomic).
enum class block_state : std::uint8_t {
  free = 0,    // in its slab's bitmap as free
  live = 1,    // the caller's
  cached = 2,  // in a thread cache: allocated in the bitmap, free to the caller (a free of it is a double free)
};

/// Per slab page (made when the page first becomes a slab, kept after), for each block:
/// - state: read and written by the thread caches without the lock;
/// - requested: the caller's size while it is live, written where it is handed out (from the
///   slab under the lock, from a thread cache by the taking thread) and read where it is freed
///   (a free of another size of its class is accepted: the recorded size is what leaves the
///   counts); atomic because check_invariants() reads it while caches run;
/// - counted: the size the slab's counters hold for it, from its allocation from the slab
///   until it goes back into the bitmap (under the lock only), so a flush or a locked free
///   takes exactly that out of them, whatever sizes the caches served the block with since.
struct slab_blocks {
  std::atomic<block_state> state[max_blocks] = {};
  std::atomic<std::uint16_t> requested[max_blocks] = {};
  std::uint16_t counted[max_blocks] = {};
};
static_assert(max_class <= 0xffff, "a class block's request fits in 16 bits");

/// Adds to a counter that only its owner thread writes: a load and a store, no locked
/// instruction. Other threads read it (relaxed): a snapshot, exact once the owner is quiet.
template <class T>
inline void owner_add(std::atomic<T>& a, T d) noexcept {
  a.store(a.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}

/// One thread's cache for one budget_slab. The block lists belong to the owner thread; the
/// counts and counters are written by the owner only and read by stats() on any thread. The
/// slab's own counters count a cached block as live; what the cache changed is derived:
///   live bytes:   - held_bytes()
///   allocations:  allocations (blocks handed out from the cache)
///   deallocations: allocations + held_blocks() (every block put in was taken out, is still in,
///                  or was flushed, and a flush moves its free to the slab's counters)
///   requested bytes: requested_bytes (taken out: +request; put in: -the block's recorded
///                  request; flushed: +the request the slab counted, which the flush takes off
///                  the slab's counters)
///   count(cls) <= cache_depth(cls);  blocks[cls][0, count(cls)) are in the cached state
struct thread_cache {
  void* blocks[class_count][cache_max_depth] = {};
  std::atomic<std::size_t> counts[class_count] = {};
  std::atomic<std::size_t> requested_bytes{0}, allocations{0};

  [[nodiscard]] std::size_t count(std::size_t cls) const noexcept { return counts[cls].load(std::memory_order_relaxed); }
  void set_count(std::size_t cls, std::size_t n) noexcept { counts[cls].store(n, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t held_blocks() const noexcept {
    std::size_t n = 0;
    for (std::size_t cls = 0; cls < class_count; ++cls) n += count(cls);
    return n;
  }
  [[nodiscard]] std::size_t held_bytes() const noexcept {
    std::size_t bytes = 0;
    for (std::size_t cls = 0; cls < class_count; ++cls) bytes += count(cls) * class_bytes(cls);
    return bytes;
  }

  // Retirement: the owner thread's exit flushes the cache into its slab unless the slab was
  // destroyed first; both take retire_mutex, so neither outlives the other mid-way.
  std::mutex retire_mutex;
  void* slab = nullptr;  // guarded by retire_mutex
  void (*retire)(void* slab, thread_cache& self) noexcept = nullptr;
};

/// The caches a thread owns, flushed when it exits.
struct thread_cache_set {
  std::vector<std::pair<std::uint64_t, std::shared_ptr<thread_cache>>> owned;  // (slab id, cache)

  thread_cache_set() = default;
  thread_cache_set(const thread_cache_set&) = delete;
  thread_cache_set& operator=(const thread_cache_set&) = delete;
  ~thread_cache_set() {
    for (auto& [id, c] : owned) {
      std::lock_guard guard(c->retire_mutex);
      if (c->slab != nullptr) c->retire(c->slab, *c);
    }
  }

  /// Drops the caches of slabs that were destroyed (their blocks went with the slab).
  void forget_retired() noexcept {
    std::erase_if(owned, [](auto& e) {
      std::lock_guard guard(e.second->retire_mutex);
      return e.second->slab == nullptr;
    });
  }
};

/// The hot path's lookup: the cache this thread used last, tagged by its slab's id (ids are
/// never reused, so a stale entry never matches a later slab at the same address).
struct last_thread_cache {
  std::uint64_t slab_id = 0;
  thread_cache* cache = nullptr;
};

inline thread_local constinit last_thread_cache tls_last_cache{};  // trivial: no guard on access
inline thread_local thread_cache_set tls_caches;                   // touched when a cache is made
inline std::atomic<std::uint64_t> next_slab_id{1};

}  // namespace vram::detail::budget_slab

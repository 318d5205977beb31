#pragma once
// detail::thread_slot: the calling thread's index among the shards of the adaptors that keep
// per-thread state (statistics_adaptor's counters, quota_adaptor's records and credit), and
// its name in a biased_lock (the thread a lock is biased to). One index per thread, shared by
// every adaptor and lock, so a shard is written by one thread and read by others.

#include <bitset>
#include <cstddef>
#include <mutex>

namespace vram::detail {

/// Threads that get a shard of their own; later threads share the overflow shard.
inline constexpr std::size_t thread_slots = 16;
/// The calling thread's shard in [0, thread_slots], thread_slots being the shared
/// overflow shard. Slots are handed back when a thread exits, so thread churn reuses them.
inline constexpr std::size_t unassigned_thread_slot = ~std::size_t{0};
// A trivially destructible thread_local on the hot path (no init guard). The slot is taken on
// first use and handed back by thread_slot::owner's destructor at thread exit, which also
// moves this thread to the overflow shard for any allocation made later during its exit.
inline thread_local std::size_t thread_slot_index = unassigned_thread_slot;

class thread_slot {
 public:
  /// Left to GCC where the pool calls it (lanes.hpp: always inlined there, it cost the bare
  /// pair 0.6 ns).
  static std::size_t get() noexcept { return get_inline(); }
  /// get(), always inlined: for the adaptors' paths, where GCC calls get() out of line once
  /// the pool is inlined under them (a quota_adaptor pair over the pool 1.2 ns dearer:
  /// bench.adaptor_overhead, pool/quota_adaptor).
  [[gnu::always_inline]] static std::size_t get_inline() noexcept {
    std::size_t i = thread_slot_index;
    if (i == unassigned_thread_slot) [[unlikely]] i = thread_slot_index = acquire();
    return i;
  }

 private:
  struct pool {
    std::mutex mutex;
    std::bitset<thread_slots> used;
  };
  static pool& the_pool() noexcept {
    static pool p;
    return p;
  }
  struct owner {
    std::size_t index = thread_slots;
    ~owner() {
      thread_slot_index = thread_slots;
      if (index == thread_slots) return;
      auto& p = the_pool();
      std::lock_guard lock(p.mutex);
      p.used[index] = false;
    }
  };
  [[gnu::noinline]] static std::size_t acquire() noexcept {
    thread_local owner o;
    auto& p = the_pool();
    std::lock_guard lock(p.mutex);
    for (std::size_t i = 0; i < thread_slots; ++i)
      if (!p.used[i]) {
        p.used[i] = true;
        o.index = i;
        return i;
      }
    return thread_slots;
  }
};

}  // namespace vram::detail

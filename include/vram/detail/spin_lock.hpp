#pragma once
// detail::spin_lock: for state held a few dozen instructions at a time, normally by one thread
// (biased_lock's lock for the threads off its bias: a stream_pool lane's bin pop and hash-map
// insert, a quota_adaptor thread shard's credit and records), so a test-and-test-and-set spin
// with yield is cheaper than a futex-based std::mutex: taking it is one exchange, releasing it
// a store.

#include <atomic>
#include <thread>

namespace vram::detail {

class spin_lock {
 public:
  /// One exchange when free (always inlined); the wait is out of line so that callers stay small.
  [[gnu::always_inline]] void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) [[likely]]
      return;
    lock_contended();
  }
  [[gnu::always_inline]] bool try_lock() noexcept { return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire); }
  [[gnu::always_inline]] void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  [[gnu::noinline]] void lock_contended() noexcept {
    for (;;) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins)
        if (spins >= 64) std::this_thread::yield();
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  std::atomic<bool> locked_{false};
};

}  // namespace vram::detail

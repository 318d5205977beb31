#pragma once
// detail::stream_pool::spin_lock: the lock of one stream_pool lane. Held for a few dozen instructions
// (a bin pop and a hash-map insert), normally by the one thread using that stream, so a
// test-and-test-and-set spin with yield is cheaper than a futex-based std::mutex.

#include <atomic>
#include <thread>

namespace vram::detail::stream_pool {

class spin_lock {
 public:
  /// One exchange when free (inlined); the wait is out of line so that callers stay small.
  void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) [[likely]]
      return;
    lock_contended();
  }
  bool try_lock() noexcept { return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

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

}  // namespace vram::detail::stream_pool

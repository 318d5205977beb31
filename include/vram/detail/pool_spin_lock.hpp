#pragma once
// detail::pool_spin_lock: the lock of one stream_pool lane. Held for a few dozen instructions
// (a bin pop and a hash-map insert), normally by the one thread using that stream, so a
// test-and-test-and-set spin with yield is cheaper than a futex-based std::mutex.

#include <atomic>
#include <thread>

namespace vram::detail {

class pool_spin_lock {
 public:
  void lock() noexcept {
    for (;;) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins)
        if (spins >= 64) std::this_thread::yield();
    }
  }
  bool try_lock() noexcept { return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace vram::detail

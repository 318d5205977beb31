#pragma once
// detail::stream_pool::heap_mutex: the heap lock of a stream_pool. An uncontended lock and unlock are one
// atomic instruction each, inlined (std::mutex calls into pthread for both). A contended lock spins briefly, then sleeps on the futex behind
// std::atomic::wait, so threads waiting while the holder calls a slow upstream (cudaMalloc)
// do not burn their cores.

#include <atomic>
#include <cstdint>

namespace vram::detail::stream_pool {

class heap_mutex {
 public:
  void lock() noexcept {
    std::uint32_t expected = unlocked;
    if (!state_.compare_exchange_strong(expected, locked, std::memory_order_acquire)) [[unlikely]]
      lock_contended();
  }
  bool try_lock() noexcept {
    std::uint32_t expected = unlocked;
    return state_.compare_exchange_strong(expected, locked, std::memory_order_acquire);
  }
  void unlock() noexcept {
    if (state_.exchange(unlocked, std::memory_order_release) == contended) [[unlikely]]
      state_.notify_one();
  }

 private:
  // unlocked, locked (no thread sleeps on it), contended (locked; a thread may sleep on it).
  static constexpr std::uint32_t unlocked = 0, locked = 1, contended = 2;

  [[gnu::noinline]] void lock_contended() noexcept {
    for (int spin = 0; spin < 64; ++spin) {  // a short hold (most are) ends while we spin
      std::uint32_t expected = unlocked;
      if (state_.load(std::memory_order_relaxed) == unlocked &&
          state_.compare_exchange_strong(expected, locked, std::memory_order_acquire))
        return;
    }
    // Taking it as `contended` makes our unlock wake the next sleeper (perhaps needlessly).
    while (state_.exchange(contended, std::memory_order_acquire) != unlocked)
      state_.wait(contended, std::memory_order_relaxed);
  }

  std::atomic<std::uint32_t> state_{unlocked};
};

}  // namespace vram::detail::stream_pool

#pragma once
// detail::biased_lock: a lock that one thread, its owner, takes almost every time and others
// rarely (a quota_adaptor thread shard: its own thread allocates and frees; others free a
// block it recorded or take its credit back). While the lock is biased the owner enters with
// no locked instruction: it announces itself with a plain store and checks that the bias still
// holds. Any other thread revokes the bias first: it clears the bias, runs a process-wide
// memory barrier (heavy_barrier below), and waits for the owner to leave. The barrier is what
// makes the owner's unfenced store-then-load safe: it orders them on the owner's CPU, so
// either the revoker sees the announcement, or the owner sees the bias gone and takes the
// spin_lock. The owner pays two plain stores and a load an entry, a revocation one system
// call (about 0.4 to a few microseconds). The owner biases the lock again after
// `rebias_after` entries through the spin_lock with no other thread between, so a thread
// that keeps coming costs at most one barrier per that many owner entries.
// Where the barrier is unavailable (not Linux, or the kernel refuses it) the lock is never
// biased and every entry takes the spin_lock.

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <thread>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <vram/detail/spin_lock.hpp>

namespace vram::detail {

/// A full memory barrier on every running thread of this process (Linux membarrier,
/// MEMBARRIER_CMD_PRIVATE_EXPEDITED, registered once per process).
struct heavy_barrier {
  /// True when run() may be called: this process is registered for the barrier.
  [[nodiscard]] static bool available() noexcept {
#if defined(__linux__)
    static const bool registered = register_process();
    return registered;
#else
    return false;
#endif
  }

  /// Pre: available(). Registration carries over fork(), so the call cannot fail then; a
  /// failure all the same would leave a biased owner unordered, so it ends the process.
  static void run() noexcept {
#if defined(__linux__)
    if (::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
    if (register_process() && ::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
#endif
    std::fputs("vram: membarrier failed after it had been registered\n", stderr);
    std::terminate();
  }

 private:
#if defined(__linux__)
  static bool register_process() noexcept {
    return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  }
#endif
};

class biased_lock {
 public:
  /// Owner entries through the spin_lock, none by another thread between, that bias it again.
  /// Debug builds bias again soon, so that tests meet many revocations.
#if VRAM_DEBUG
  static constexpr std::uint32_t rebias_after = 8;
#else
  static constexpr std::uint32_t rebias_after = 4096;
#endif

  /// The owner's entry; true: entered on the bias (leave with owner_unlock(true)). Only the
  /// owner may call it, and one thread at a time may be the owner (a thread that hands its
  /// role over must do so with a happens-before edge, as thread_slot's mutex gives).
  [[gnu::always_inline]] bool owner_lock() noexcept {
    owner_in_.store(true, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (biased_.load(std::memory_order_acquire)) [[likely]]
      return true;
    owner_in_.store(false, std::memory_order_release);
    owner_lock_slow();
    return false;
  }
  [[gnu::always_inline]] void owner_unlock(bool on_bias) noexcept {
    if (on_bias) [[likely]]
      owner_in_.store(false, std::memory_order_release);
    else
      lock_.unlock();
  }

  /// Any other thread's entry (also the owner's, where it cannot tell it is the owner).
  void lock() noexcept {
    lock_.lock();
    quiet_ = 0;
    if (biased_.load(std::memory_order_relaxed)) [[unlikely]]
      revoke();
  }
  void unlock() noexcept { lock_.unlock(); }

  /// Never biases the lock from now on, so that any thread may call owner_lock() (a lock
  /// without one owner: quota_adaptor's overflow shard). Pre: not biased, no thread inside.
  void never_bias() noexcept { may_bias_ = false; }

  /// Whether the owner may currently enter on the bias (for tests).
  [[nodiscard]] bool biased() const noexcept { return biased_.load(std::memory_order_relaxed); }

 private:
  [[gnu::noinline]] void owner_lock_slow() noexcept {
    lock_.lock();
    if (++quiet_ >= rebias_after && may_bias_ && heavy_barrier::available()) {
      quiet_ = 0;
      biased_.store(true, std::memory_order_relaxed);  // under lock_: a revoker sees it
    }
  }

  /// Under lock_: the owner is out and enters through lock_ from now on.
  [[gnu::noinline]] void revoke() noexcept {
    biased_.store(false, std::memory_order_relaxed);
    heavy_barrier::run();
    while (owner_in_.load(std::memory_order_acquire)) std::this_thread::yield();
  }

  spin_lock lock_;
  std::atomic<bool> biased_{false};
  std::atomic<bool> owner_in_{false};  // the owner is inside on the bias
  std::uint32_t quiet_ = 0;            // under lock_: owner entries since another thread's
  bool may_bias_ = true;
};

/// Holds a biased_lock for a scope as its owner.
class owner_guard {
 public:
  [[gnu::always_inline]] explicit owner_guard(biased_lock& l) noexcept : lock_(l), on_bias_(l.owner_lock()) {}
  [[gnu::always_inline]] ~owner_guard() { lock_.owner_unlock(on_bias_); }
  owner_guard(const owner_guard&) = delete;
  owner_guard& operator=(const owner_guard&) = delete;

 private:
  biased_lock& lock_;
  bool on_bias_;
};

/// Holds a biased_lock for a scope as another thread than its owner.
class other_guard {
 public:
  explicit other_guard(biased_lock& l) noexcept : lock_(l) { lock_.lock(); }
  ~other_guard() { lock_.unlock(); }
  other_guard(const other_guard&) = delete;
  other_guard& operator=(const other_guard&) = delete;

 private:
  biased_lock& lock_;
};

}  // namespace vram::detail

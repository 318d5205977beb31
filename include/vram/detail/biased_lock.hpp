#pragma once
// detail::biased_lock: a lock that one thread takes almost every time and others rarely (a
// stream_pool lane: the thread allocating on its stream; a quota_adaptor thread shard: its own
// thread). The lock biases itself to the thread (by its thread_slot) that entered it
// `rebias_after` times in a row; that thread then enters with no locked instruction: it
// announces itself with a plain store to its own flag and checks that the bias is still its
// own. Any other thread revokes the bias first: it clears it, runs a process-wide memory
// barrier (heavy_barrier below), and waits for the owner's flag to clear. The barrier is what
// makes the owner's unfenced store-then-load safe: it orders them on the owner's CPU, so either
// the revoker sees the announcement, or the owner sees the bias gone and takes the spin_lock.
// The owner pays two plain stores and three loads an entry, a revocation one system call (about
// half a microsecond to a few, more where it interrupts threads on other cores): at most one
// per `rebias_after` entries in a row, however often others come, and fewer where threads take
// turns (the threshold doubles after each bias that did not last). Each thread has its own
// flag, so a thread that read a stale bias and backs out never clears another's announcement.
// Where the barrier is unavailable (not Linux, or the kernel refuses it) the lock is never
// biased and every entry takes the spin_lock; so are threads past thread_slots.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
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
#include <vram/detail/thread_slot.hpp>

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

/// Lockable. Pre for every call: one thread per thread slot (thread_slot.hpp), and a thread
/// unlocks what it locked.
class biased_lock {
 public:
  /// Entries in a row through the spin_lock by one thread that bias the lock to it, at first.
  /// A bias revoked within `min_bias_time` did not pay for its barrier (threads taking turns
  /// fast): the next one takes twice as many entries, up to max_rebias_after; one that lasted
  /// longer sets it back. Debug builds bias again soon, so that tests meet many revocations.
#if VRAM_DEBUG
  static constexpr std::uint32_t rebias_after = 8;
  static constexpr std::uint32_t max_rebias_after = 64;
#else
  static constexpr std::uint32_t rebias_after = 4096;
  static constexpr std::uint32_t max_rebias_after = std::uint32_t{1} << 24;
#endif
  static constexpr std::chrono::microseconds min_bias_time{1000};

  [[gnu::always_inline]] void lock() noexcept {
    const std::size_t slot = thread_slot::get_inline();  // the adaptors' locks (a lane's: try_enter)
    if (!enter_biased(slot)) [[unlikely]]
      lock_slow(slot);
  }
  /// How try_enter() came in, for leave(): on the bias (by the thread's flag), through the
  /// spin_lock, or not at all (false).
  struct entry {
    std::atomic<bool>* flag = nullptr;  // the entering thread's flag, when it came in on the bias
    bool held = false;
    explicit operator bool() const noexcept { return held; }
  };
  /// Never waits: not held while another thread holds the lock (or is inside on its bias).
  /// The entry says how it came in, so leave() reads no thread-local and no flag (the pool's
  /// bin path: two loads and a branch fewer a call than unlock()). Off the bias the whole
  /// entry is inline too: where threads take turns on the lock (two on one stream), a call
  /// between the exchange and the section lets the other thread in between every two entries,
  /// and each handover moves the lock's lines (a fifth of their throughput on two vCPUs of an
  /// Intel guest: bench.pool_hot_path, one_stream/256).
  [[gnu::always_inline]] entry try_enter() noexcept {
    const std::size_t slot = thread_slot::get();
    if (enter_biased(slot)) [[likely]]
      return {&in_[slot], true};
    if (lock_.try_lock() && entered_spin_lock(slot)) return {nullptr, true};
    return {};
  }
  /// Ends the section of `e` (pre: e held, by this thread).
  [[gnu::always_inline]] void leave(entry e) noexcept {
    if (e.flag != nullptr) [[likely]]
      e.flag->store(false, std::memory_order_release);
    else
      lock_.unlock();
  }
  /// try_enter() for Lockable callers, which leave by unlock().
  [[gnu::always_inline]] bool try_lock() noexcept { return static_cast<bool>(try_enter()); }
  [[gnu::always_inline]] void unlock() noexcept {
    const std::size_t slot = thread_slot_index;  // as lock() saw it: a slot changes only at thread exit
    if (slot < thread_slots && in_[slot].load(std::memory_order_relaxed)) [[likely]]  // only this thread writes it
      in_[slot].store(false, std::memory_order_release);
    else
      lock_.unlock();
  }

  /// True while the lock is biased to a thread (for tests).
  [[nodiscard]] bool biased() const noexcept { return bias_.load(std::memory_order_relaxed) != 0; }
  /// The thread slot the lock is biased to, or thread_slots when none (for tests).
  [[nodiscard]] std::size_t biased_to() const noexcept {
    const std::uint32_t b = bias_.load(std::memory_order_relaxed);
    return b == 0 ? thread_slots : b - 1;
  }

 private:
  // Only the thread of `slot` calls it with that slot (its flag has one writer).
  [[gnu::always_inline]] bool enter_biased(std::size_t slot) noexcept {
    const auto mine = static_cast<std::uint32_t>(slot + 1);
    if (bias_.load(std::memory_order_relaxed) != mine) return false;  // also every slot past thread_slots
    in_[slot].store(true, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler's half; heavy_barrier is the CPU's
    if (bias_.load(std::memory_order_acquire) == mine) [[likely]]  // the section's loads stay below
      return true;
    in_[slot].store(false, std::memory_order_release);
    return false;
  }

  [[gnu::noinline]] void lock_slow(std::size_t slot) noexcept {
    lock_.lock();
    revoke_for(slot);
    while (in_[leaving_].load(std::memory_order_acquire)) std::this_thread::yield();
    count_entry(slot);
  }
  /// try_lock() holding lock_: true when the section is ours, false (lock_ released) while
  /// a revoked owner is still inside.
  [[gnu::always_inline]] bool entered_spin_lock(std::size_t slot) noexcept {
    revoke_for(slot);
    if (in_[leaving_].load(std::memory_order_acquire)) [[unlikely]] {  // the owner is inside: it leaves by its flag
      lock_.unlock();
      return false;
    }
    count_entry(slot);
    return true;
  }

  /// Under lock_: revokes a bias that is not `slot`'s. Its owner may still be inside (until
  /// leaving_'s flag clears); every later holder of lock_ checks that flag, not only this one.
  [[gnu::always_inline]] void revoke_for(std::size_t slot) noexcept {
    if (const std::uint32_t b = bias_.load(std::memory_order_relaxed); b != 0 && b - 1 != slot) [[unlikely]] {
      revoke();
      leaving_ = b - 1;
    }
  }

  /// Under lock_: no thread enters on the bias once it returns; the owner may still be
  /// inside, until its flag clears.
  [[gnu::noinline]] void revoke() noexcept {
    bias_.store(0, std::memory_order_relaxed);
    heavy_barrier::run();
    const bool paid = std::chrono::steady_clock::now() - biased_at_ >= min_bias_time;
    threshold_ = paid ? rebias_after : std::min(2 * threshold_, max_rebias_after);
  }

  /// Under lock_: counts the entries in a row of one thread, and biases the lock to it after
  /// threshold_ of them.
  [[gnu::always_inline]] void count_entry(std::size_t slot) noexcept {
    if (slot != last_) {
      last_ = slot;
      in_a_row_ = 1;
    } else if (++in_a_row_ >= threshold_) [[unlikely]] {
      bias_to(slot);
    }
  }
  /// Under lock_: biases the lock to `slot` where it can be; where not (an overflow slot, no
  /// barrier), the count starts again, so that the next try is threshold_ entries away.
  [[gnu::noinline]] void bias_to(std::size_t slot) noexcept {
    if (slot < thread_slots && bias_.load(std::memory_order_relaxed) == 0 && heavy_barrier::available()) {
      biased_at_ = std::chrono::steady_clock::now();
      bias_.store(static_cast<std::uint32_t>(slot + 1), std::memory_order_relaxed);
    } else {
      in_a_row_ = 0;
    }
  }

  // Two cache lines: every entry reads bias_, which changes rarely, so it stays shared in the
  // caches of the threads taking turns on lock_'s line (one line had them 40 % slower then).
  alignas(64) std::atomic<std::uint32_t> bias_{0};    // 1 + the owner's thread slot; 0: none
  std::array<std::atomic<bool>, thread_slots> in_{};  // in_[i]: slot i's thread is inside on the bias
  alignas(64) spin_lock lock_;
  std::size_t leaving_ = 0;                           // under lock_: the last owner whose bias was revoked
  std::size_t last_ = thread_slots;                   // under lock_: the last thread slot through it
  std::uint32_t in_a_row_ = 0;                        // under lock_: its entries in a row
  std::uint32_t threshold_ = rebias_after;            // under lock_: the entries in a row that bias it
  std::chrono::steady_clock::time_point biased_at_;   // under lock_: when it was last biased
};

/// Holds a biased_lock for a scope (std::lock_guard, always inlined: on hot paths the
/// compiler may otherwise call a lock_guard's constructor out of line).
class biased_guard {
 public:
  [[gnu::always_inline]] explicit biased_guard(biased_lock& l) noexcept : lock_(l) { lock_.lock(); }
  [[gnu::always_inline]] ~biased_guard() { lock_.unlock(); }
  biased_guard(const biased_guard&) = delete;
  biased_guard& operator=(const biased_guard&) = delete;

 private:
  biased_lock& lock_;
};

}  // namespace vram::detail

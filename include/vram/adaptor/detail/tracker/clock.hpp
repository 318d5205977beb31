#pragma once
// The tracker's clock: microseconds since the Unix epoch, as the system clock gives them, read
// from the processor's time-stamp counter where it is invariant. A system clock reading costs
// about 25 ns under a hypervisor, two of them a third of a tracked allocate + free pair;
// reading the counter costs under half of that, and it is mapped onto the system clock at
// anchors taken every millisecond of counter time (docs/observability.md, the tracker's cost).

#include <algorithm>
#include <cstdint>

#include <vram/adaptor/detail/tracker/records.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <x86intrin.h>
#define VRAM_TRACKER_HAS_TSC 1
#else
#define VRAM_TRACKER_HAS_TSC 0
#endif

namespace vram::detail::tracker {

/// Not thread-safe but for ticks(): each tracker turns readings into times under its mutex.
///
/// Between anchors the time is the last anchor's system time plus the counter's ticks since,
/// at the rate measured from the first anchor to the last (a baseline that only grows, so the
/// rate's error shrinks as the tracker lives). Invariants: the times returned never decrease
/// (a reading below the last one returns the last one, unless the system clock stepped back
/// by more than a millisecond: then the system clock is followed); between anchors a time is
/// off the system clock by at most the rate's error over one period (under a microsecond
/// once the baseline is a few milliseconds long). Until the baseline is `first_baseline_us`
/// long every call reads the system clock.
class tracker_clock {
 public:
  tracker_clock() noexcept : counter_(invariant_counter()) {}

  [[nodiscard]] std::int64_t now_us() noexcept { return at(ticks()); }

  /// A reading of the counter (0 without one), for at(). Thread-safe: reading the counter is
  /// most of what a time costs, so the tracker reads it before taking its lock.
  [[nodiscard]] std::uint64_t ticks() const noexcept {
#if VRAM_TRACKER_HAS_TSC
    if (counter_) return __rdtsc();
#endif
    return 0;
  }

  /// The time of a reading from ticks(). A reading older than the last anchor (another
  /// thread took the lock first and anchored) gets the last time returned.
  [[nodiscard, gnu::always_inline]] std::int64_t at(std::uint64_t ticks) noexcept {
#if VRAM_TRACKER_HAS_TSC
    if (counter_) {
      const std::uint64_t since = ticks - anchor_ticks_;
      if (since < period_ticks_) [[likely]]
        return monotonic(anchor_us_ + static_cast<std::int64_t>((since * us_per_tick_q32_) >> 32));
      if (ticks < anchor_ticks_) return last_us_;
      return anchor(ticks);
    }
#endif
    (void)ticks;
    return monotonic(tracker_now_us());
  }

  /// True where times come from the time-stamp counter.
  [[nodiscard]] bool counter() const noexcept { return counter_; }

 private:
  static constexpr std::int64_t first_baseline_us = 200;
  static constexpr std::int64_t period_us = 1000;
  static constexpr std::int64_t step_back_us = 1000;

  static bool invariant_counter() noexcept {
#if VRAM_TRACKER_HAS_TSC
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0x80000000u, &a, &b, &c, &d) == 0 || a < 0x80000007u) return false;
    if (__get_cpuid(0x80000007u, &a, &b, &c, &d) == 0) return false;
    return (d & (1u << 8)) != 0;  // CPUID.80000007H:EDX[8], the invariant TSC
#else
    return false;
#endif
  }

  std::int64_t monotonic(std::int64_t us) noexcept {
    if (us >= last_us_ || us < last_us_ - step_back_us) last_us_ = us;
    return last_us_;
  }

#if VRAM_TRACKER_HAS_TSC
  [[gnu::noinline]] std::int64_t anchor(std::uint64_t ticks) noexcept {
    const std::int64_t us = tracker_now_us();
    if (first_ticks_ == 0) {
      first_ticks_ = ticks;
      first_us_ = us;
    } else if (const std::int64_t baseline = us - first_us_; baseline >= first_baseline_us && ticks > first_ticks_) {
      const double rate = double(baseline) / double(ticks - first_ticks_);  // microseconds per tick
      us_per_tick_q32_ = static_cast<std::uint64_t>(rate * 4294967296.0);
      period_ticks_ = static_cast<std::uint64_t>(double(period_us) / rate);
    }
    anchor_ticks_ = ticks;
    anchor_us_ = us;
    return monotonic(us);
  }
#endif

  bool counter_;
  std::uint64_t first_ticks_ = 0, anchor_ticks_ = 0;
  std::int64_t first_us_ = 0, anchor_us_ = 0, last_us_ = 0;
  std::uint64_t us_per_tick_q32_ = 0;  // microseconds per tick, times 2^32
  std::uint64_t period_ticks_ = 0;     // ticks between anchors; 0 until the rate is known
};

}  // namespace vram::detail::tracker

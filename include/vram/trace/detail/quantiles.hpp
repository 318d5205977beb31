#pragma once
// detail::trace::timing_histogram: quantiles of timings read from a clock that moves in steps,
// in memory bounded by the distinct readings (not their number).
//
// On some VMs (this project's among them) steady_clock and the time-stamp counter advance in
// steps of about 10 ns: every reading is a whole number of steps, give or take a unit of
// conversion jitter (30, 31, 29, 40, 41, ...). The plain sample quantile is then the step the
// quantile falls in, wrong by up to half a step either way, and comparing it with a bound
// such as "50 ns" decides nothing. A duration d read at a random phase lands on the two steps
// around it with probabilities linear in d, so spreading each step's readings evenly over
// the step (the grouped-data median) recovers the quantile to a fraction of a step.
// On a clock without steps (readings on most integers of a range) the plain quantile is
// returned.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace vram::detail::trace {

/// Readings that differ by at most this many units are one step (conversion jitter).
inline constexpr std::uint32_t step_jitter = 2;

/// Timings counted by value, so that quantiles of any number of readings take bounded
/// memory: one counter per nanosecond below 64 Ki ns (every pool operation), a map above.
class timing_histogram {
 public:
  void add(std::uint32_t ns) {
    if (ns < small_.size()) ++small_[ns];
    else ++large_[ns];
    ++count_;
    sum_ += ns;
  }
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }
  [[nodiscard]] double mean() const noexcept { return count_ == 0 ? 0.0 : double(sum_) / double(count_); }

  /// The q-quantile (0 <= q <= 1), interpolated within the clock's step where the readings
  /// come in steps (groups at most step_jitter wide, at least twice that apart); the plain
  /// quantile otherwise. Pre: count() != 0.
  [[nodiscard]] double step_quantile(double q) const {
    std::vector<run> v = runs();
    // Positions are those of the sorted readings: run i covers [v[i].first, v[i].first + v[i].count).
    const auto k = static_cast<std::uint64_t>(q * static_cast<double>(count_ - 1));
    std::size_t at = 0;
    while (v[at].first + v[at].count <= k) ++at;
    const double plain = v[at].value;
    // The group (runs whose values differ by at most step_jitter from the previous) holding k.
    auto group_of = [&](std::size_t i) {
      std::size_t lo = i, hi = i + 1;
      while (lo > 0 && v[lo].value - v[lo - 1].value <= step_jitter) --lo;
      while (hi < v.size() && v[hi].value - v[hi - 1].value <= step_jitter) ++hi;
      return std::pair{lo, hi};
    };
    auto [lo, hi] = group_of(at);
    if (v[hi - 1].value - v[lo].value > step_jitter) return plain;  // wider than jitter: a clock without steps
    auto center = [&](std::size_t from, std::size_t to) {  // mean reading of runs [from, to)
      double sum = 0, n = 0;
      for (std::size_t i = from; i < to; ++i) {
        sum += double(v[i].value) * double(v[i].count);
        n += double(v[i].count);
      }
      return sum / n;
    };
    const double c = center(lo, hi);
    // The step: the distance to the nearer neighbouring group's centre.
    double step = 0;
    if (lo > 0) {
      auto [b, e] = group_of(lo - 1);
      step = c - center(b, e);
    }
    if (hi < v.size()) {
      auto [b, e] = group_of(hi);
      double up = center(b, e) - c;
      step = step == 0 ? up : std::min(step, up);
    }
    if (step < 2.0 * step_jitter) return plain;
    // Reading k is number k - first + 1 of the group's readings: spread them evenly over the step.
    const std::uint64_t first = v[lo].first, readings = v[hi - 1].first + v[hi - 1].count - first;
    return c - step / 2 + step * (static_cast<double>(k - first) + 0.5) / static_cast<double>(readings);
  }

 private:
  struct run {
    std::uint32_t value;
    std::uint64_t count;  // readings of this value
    std::uint64_t first;  // position of the first of them among the sorted readings
  };
  [[nodiscard]] std::vector<run> runs() const {
    std::vector<run> v;
    std::uint64_t position = 0;
    auto push = [&](std::uint32_t value, std::uint64_t n) {
      v.push_back({value, n, position});
      position += n;
    };
    for (std::uint32_t i = 0; i < small_.size(); ++i)
      if (small_[i] != 0) push(i, small_[i]);
    for (auto [value, n] : large_) push(value, n);
    return v;
  }

  std::vector<std::uint64_t> small_ = std::vector<std::uint64_t>(std::size_t{1} << 16, 0);
  std::map<std::uint32_t, std::uint64_t> large_;
  std::uint64_t count_ = 0, sum_ = 0;
};

/// step_quantile over a sample held in a vector. Pre: v is not empty.
inline double step_quantile(const std::vector<std::uint32_t>& v, double q) {
  timing_histogram h;
  for (std::uint32_t x : v) h.add(x);
  return h.step_quantile(q);
}

}  // namespace vram::detail::trace

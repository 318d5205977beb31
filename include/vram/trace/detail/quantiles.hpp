#pragma once
// detail::trace::step_quantile: a quantile of timings read from a clock that moves in steps.
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
#include <vector>

namespace vram::detail::trace {

/// Readings that differ by at most this many units are one step (conversion jitter).
inline constexpr std::uint32_t step_jitter = 2;

/// The q-quantile (0 <= q <= 1) of `v` (reordered), interpolated within the clock's step
/// where the readings come in steps (groups at most step_jitter wide, at least twice that
/// apart); the plain quantile otherwise. Pre: v is not empty.
inline double step_quantile(std::vector<std::uint32_t>& v, double q) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  const auto k = static_cast<std::size_t>(q * static_cast<double>(n - 1));
  const double plain = v[k];
  // The group (run of readings with gaps <= step_jitter) holding v[k]: [lo, hi).
  std::size_t lo = k, hi = k + 1;
  while (lo > 0 && v[lo] - v[lo - 1] <= step_jitter) --lo;
  while (hi < n && v[hi] - v[hi - 1] <= step_jitter) ++hi;
  if (v[hi - 1] - v[lo] > step_jitter) return plain;  // wider than jitter: a clock without steps
  auto center = [&](std::size_t from, std::size_t to) {  // mean of v[from, to)
    double sum = 0;
    for (std::size_t i = from; i < to; ++i) sum += v[i];
    return sum / static_cast<double>(to - from);
  };
  const double c = center(lo, hi);
  // The step: the distance to the nearer neighbouring group's centre.
  double step = 0;
  if (lo > 0) {
    std::size_t b = lo - 1;
    while (b > 0 && v[b] - v[b - 1] <= step_jitter) --b;
    step = c - center(b, lo);
  }
  if (hi < n) {
    std::size_t e = hi + 1;
    while (e < n && v[e] - v[e - 1] <= step_jitter) ++e;
    double up = center(hi, e) - c;
    step = step == 0 ? up : std::min(step, up);
  }
  if (step < 2.0 * step_jitter) return plain;
  // v[k] is reading k - lo + 1 of the group's hi - lo: spread them evenly over the step.
  return c - step / 2 + step * (static_cast<double>(k - lo) + 0.5) / static_cast<double>(hi - lo);
}

}  // namespace vram::detail::trace

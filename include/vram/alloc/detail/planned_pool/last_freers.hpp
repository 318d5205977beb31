#pragma once
// detail::planned_pool::last_freers: which streams freed each byte of a plan's range last.
// planned_pool orders a planned block after every stream in the answer for its bytes, so
// stream order holds whatever the step does (entries skipped, reordered, late or added): the
// answer is what happened, not what the plan said would.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vram::detail::planned_pool {

/// The range cut at every planned block's edges into atoms; a free paints its block's atoms
/// with its stream's bit, an allocation asks for the union of the bits on its atoms. A
/// segment tree with lazy assignment: both O(log atoms), nothing allocated after reset().
/// Bits: plan::streams index i is bit min(i, 63); bit 63 stands for every stream from the
/// 64th on. No bit: never freed, or freed on the synchronous stream (finished at its free).
class last_freers {
 public:
  static constexpr unsigned overflow_bit = 63;
  [[nodiscard]] static constexpr std::uint64_t bit_of(std::size_t stream_index) noexcept {
    return std::uint64_t{1} << (stream_index < overflow_bit ? stream_index : overflow_bit);
  }

  /// `atoms` atoms, none painted.
  void reset(std::size_t atoms) {
    atoms_ = atoms;
    std::size_t nodes = 1;
    while (nodes < atoms) nodes *= 2;
    masks_.assign(2 * nodes, 0);
    whole_.assign(2 * nodes, 0);
  }

  /// Atoms [lo, hi) were freed last on the streams in `mask` (one bit, or none).
  void paint(std::uint32_t lo, std::uint32_t hi, std::uint64_t mask) noexcept {
    if (lo < hi) paint(1, 0, leaves(), lo, hi, mask);
  }

  /// The streams that freed any of atoms [lo, hi) last.
  [[nodiscard]] std::uint64_t query(std::uint32_t lo, std::uint32_t hi) const noexcept {
    return lo < hi ? query(1, 0, leaves(), lo, hi) : 0;
  }

  /// Every inner node's union is its children's, unless it holds one value for its whole span.
  [[nodiscard]] bool consistent() const noexcept {
    for (std::size_t n = 1; n < leaves(); ++n)
      if (!whole_[n] && masks_[n] != (masks_[2 * n] | masks_[2 * n + 1])) return false;
    return true;
  }

  [[nodiscard]] std::size_t atoms() const noexcept { return atoms_; }

 private:
  [[nodiscard]] std::size_t leaves() const noexcept { return masks_.size() / 2; }

  void push_down(std::size_t n) noexcept {
    if (!whole_[n]) return;
    for (std::size_t c : {2 * n, 2 * n + 1}) {
      masks_[c] = masks_[n];
      whole_[c] = 1;
    }
    whole_[n] = 0;
  }

  void paint(std::size_t n, std::size_t from, std::size_t to, std::size_t lo, std::size_t hi, std::uint64_t mask) noexcept {
    if (hi <= from || to <= lo) return;
    if (lo <= from && to <= hi) {
      masks_[n] = mask;
      whole_[n] = 1;
      return;
    }
    push_down(n);
    const std::size_t mid = (from + to) / 2;
    paint(2 * n, from, mid, lo, hi, mask);
    paint(2 * n + 1, mid, to, lo, hi, mask);
    masks_[n] = masks_[2 * n] | masks_[2 * n + 1];
  }

  [[nodiscard]] std::uint64_t query(std::size_t n, std::size_t from, std::size_t to, std::size_t lo,
                                    std::size_t hi) const noexcept {
    if (hi <= from || to <= lo) return 0;
    if ((lo <= from && to <= hi) || whole_[n]) return masks_[n];  // a whole node: one value throughout
    const std::size_t mid = (from + to) / 2;
    return query(2 * n, from, mid, lo, hi) | query(2 * n + 1, mid, to, lo, hi);
  }

  std::size_t atoms_ = 0;
  std::vector<std::uint64_t> masks_;  // per node: the union of its span's bits
  std::vector<std::uint8_t> whole_;   // per node: its span is all masks_[n] (assigned, not yet pushed down)
};

}  // namespace vram::detail::planned_pool

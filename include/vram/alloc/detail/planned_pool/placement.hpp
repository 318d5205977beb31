#pragma once
// detail::planned_pool::place: the offline placement of one recorded step. Given blocks with
// a size and a lifetime, it assigns each an offset in one range so that no two blocks live at
// the same time overlap, and tries to make the range as small as the peak of live bytes.
//
// The problem is dynamic storage allocation (NP-hard). The solver is greedy placement in a
// given order (each block at the lowest offset free over its whole lifetime), over six
// orders (by size, ties by start or by lifetime; by power-of-two size class, ties by
// lifetime; by size x lifetime; by lifetime, ties by size; by start), then a randomized search that perturbs the best order and
// keeps any improvement, until the range equals the lower bound (the peak of live bytes:
// optimal) or the time budget is spent.
//
// A range in two parts (planned_pool takes the lower one before the upper): blocks may be
// bound below or above a wall, and no block crosses it. The blocks bound below are placed
// first, on their own, and the wall is where they end; the others are placed around them.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace vram::detail::planned_pool {

/// A block to place: `size` bytes live over the ticks [begin, end) of the step, or, where it
/// wraps, from `begin` to the step's end and again from the next step's start to `end` (end <=
/// begin): the placement is periodic, every step the same.
struct lifetime {
  enum class part : std::uint8_t { any, below, above };  ///< where the block may go, against the wall
  std::uint64_t size = 0;
  std::uint32_t begin = 0, end = 0;
  bool wraps = false;
  part where = part::any;
};

/// True when two blocks are live at one tick of a step (in the periodic sense).
[[nodiscard]] inline bool live_together(const lifetime& a, const lifetime& b) noexcept {
  if (a.wraps && b.wraps) return true;  // both live at the step's boundary
  if (a.wraps) return b.begin < a.end || a.begin < b.end;
  if (b.wraps) return a.begin < b.end || b.begin < a.end;
  return a.begin < b.end && b.begin < a.end;
}

struct placement {
  std::vector<std::uint64_t> offsets;  ///< by block, as given
  std::uint64_t range = 0;             ///< bytes the placement spans (max offset + size)
  std::uint64_t wall = 0;              ///< the blocks bound below end here, the others start here or cross nothing
  std::uint64_t lower_bound = 0;       ///< the peak of live bytes: no placement spans less
  std::size_t orders_tried = 0;
};

/// The peak of live bytes over the step.
inline std::uint64_t live_peak(const std::vector<lifetime>& blocks) {
  std::vector<std::pair<std::uint32_t, std::int64_t>> changes;
  changes.reserve(2 * blocks.size());
  for (const auto& b : blocks) {
    changes.emplace_back(b.begin, static_cast<std::int64_t>(b.size));
    changes.emplace_back(b.end, -static_cast<std::int64_t>(b.size));
    if (b.wraps) changes.emplace_back(0, static_cast<std::int64_t>(b.size));  // live from the step's start
  }
  std::sort(changes.begin(), changes.end());  // at one tick, frees (negative) first: [begin, end)
  std::int64_t live = 0, peak = 0;
  for (const auto& [tick, delta] : changes) peak = std::max(peak, live += delta);
  return static_cast<std::uint64_t>(peak);
}

/// A block already placed, as place_in_order scans them (compact: the scan reads every one).
struct placed_block {
  std::uint64_t offset, end;
  std::uint32_t begin, finish;
  bool wraps;
};

/// Places the blocks in `order`, each at the lowest offset where it overlaps no block already
/// placed that is live at the same time (those of `fixed`, sorted by offset, to begin with),
/// and crosses no `wall` (a block of lifetime::part::above starts at it or higher). O(n^2):
/// each block scans the placed ones (kept sorted by offset, so the lowest gap is found in the
/// same scan). Stops early, returning a range above `give_up`, once the range reaches
/// `give_up` (a worse order need not finish).
inline std::uint64_t place_in_order(const std::vector<lifetime>& blocks, const std::vector<std::uint32_t>& order,
                                    std::vector<std::uint64_t>& offsets, std::uint64_t give_up,
                                    const std::vector<placed_block>& fixed = {}, std::uint64_t wall = 0) {
  std::vector<placed_block> by_offset = fixed;  // sorted by offset
  by_offset.reserve(fixed.size() + order.size());
  std::uint64_t range = 0;
  for (const placed_block& p : fixed) range = std::max(range, p.end);
  for (std::uint32_t i : order) {
    const lifetime& b = blocks[i];
    auto legal = [&](std::uint64_t at) {  // the lowest offset from `at` that crosses no wall
      if (b.where == lifetime::part::above || (at < wall && at + b.size > wall)) return std::max(at, wall);
      return at;
    };
    std::uint64_t at = legal(0);
    for (const placed_block& p : by_offset) {
      if (!(p.wraps | b.wraps)) {
        if (p.finish <= b.begin || b.end <= p.begin) continue;  // never live together
      } else if (!live_together({0, p.begin, p.finish, p.wraps}, b)) {
        continue;
      }
      if (p.offset >= at + b.size) break;                     // the gap below p fits
      at = legal(std::max(at, p.end));
    }
    auto insert_at = std::lower_bound(by_offset.begin(), by_offset.end(), at,
                                      [](const placed_block& p, std::uint64_t o) { return p.offset < o; });
    by_offset.insert(insert_at, placed_block{at, at + b.size, b.begin, b.end, b.wraps});
    offsets[i] = at;
    range = std::max(range, at + b.size);
    if (range > give_up) return range;
  }
  return range;
}

/// The best placement found within `budget` (at least the greedy orders are tried whatever the
/// budget). Deterministic for a given `seed` and enough budget to finish the same searches.
inline placement place(const std::vector<lifetime>& blocks, std::chrono::nanoseconds budget, std::uint64_t seed = 1) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + budget;
  placement best;
  best.lower_bound = live_peak(blocks);
  best.offsets.assign(blocks.size(), 0);
  if (blocks.empty()) return best;
  best.range = UINT64_MAX;

  // The lower part first: its blocks placed on their own (with half the budget), fixed after.
  std::vector<std::uint32_t> free_blocks;  // the blocks the orders below place
  std::vector<placed_block> fixed;
  {
    std::vector<std::uint32_t> below;
    std::vector<lifetime> lower;
    for (std::uint32_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].where != lifetime::part::below) {
        free_blocks.push_back(i);
        continue;
      }
      below.push_back(i);
      lower.push_back(blocks[i]);
      lower.back().where = lifetime::part::any;
    }
    if (!below.empty()) {
      placement low = place(lower, budget / 2, seed);
      best.wall = low.range;
      for (std::size_t k = 0; k < below.size(); ++k) {
        const lifetime& b = blocks[below[k]];
        best.offsets[below[k]] = low.offsets[k];
        fixed.push_back({low.offsets[k], low.offsets[k] + b.size, b.begin, b.end, b.wraps});
      }
      std::sort(fixed.begin(), fixed.end(), [](const placed_block& a, const placed_block& b) { return a.offset < b.offset; });
      best.orders_tried = low.orders_tried;
      if (free_blocks.empty()) {
        best.range = low.range;
        return best;
      }
    }
  }

  std::vector<std::uint32_t> order(free_blocks.size());
  std::vector<std::uint64_t> offsets = best.offsets;
  std::vector<std::uint32_t> best_order;
  auto life = [&](std::uint32_t i) {  // ticks live (a wrapping block: to the end, and from the start)
    return blocks[i].wraps ? std::uint64_t{UINT32_MAX} - blocks[i].begin + blocks[i].end
                           : std::uint64_t{blocks[i].end - blocks[i].begin};
  };
  auto attempt = [&](const std::vector<std::uint32_t>& o) {
    ++best.orders_tried;
    std::uint64_t range = place_in_order(blocks, o, offsets, best.range, fixed, best.wall);
    if (range < best.range) {
      best.range = range;
      best.offsets = offsets;
      best_order = o;
    }
  };
  auto sorted_by = [&](auto&& before) {
    order = free_blocks;
    std::stable_sort(order.begin(), order.end(), before);
    attempt(order);
  };
  // Larger blocks first (they are the hardest to fit late), ties broken three ways; then the
  // product, which favours what is both large and long-lived. Which wins depends on the step:
  // each of the first three is the best of all six on one of the shared traces.
  auto size_class = [&](std::uint32_t i) { return 63 - __builtin_clzll(blocks[i].size); };
  sorted_by([&](std::uint32_t a, std::uint32_t b) {
    return blocks[a].size != blocks[b].size ? blocks[a].size > blocks[b].size : blocks[a].begin < blocks[b].begin;
  });
  if (best.range == best.lower_bound) return best;
  sorted_by([&](std::uint32_t a, std::uint32_t b) {
    return blocks[a].size != blocks[b].size ? blocks[a].size > blocks[b].size : life(a) > life(b);
  });
  if (best.range == best.lower_bound) return best;
  sorted_by([&](std::uint32_t a, std::uint32_t b) {
    return size_class(a) != size_class(b) ? size_class(a) > size_class(b) : life(a) > life(b);
  });
  if (best.range == best.lower_bound) return best;
  sorted_by([&](std::uint32_t a, std::uint32_t b) { return blocks[a].size * life(a) > blocks[b].size * life(b); });
  if (best.range == best.lower_bound) return best;
  // And two that put lifetime or time first: where many streams interleave blocks of similar
  // sizes (the built-in inference workload), one of these wins.
  sorted_by([&](std::uint32_t a, std::uint32_t b) {
    return life(a) != life(b) ? life(a) > life(b) : blocks[a].size > blocks[b].size;
  });
  if (best.range == best.lower_bound) return best;
  sorted_by([&](std::uint32_t a, std::uint32_t b) { return blocks[a].begin < blocks[b].begin; });

  // The search: move a few blocks of the best order earlier (a block placed earlier takes a
  // lower offset), keep the result when the range shrinks.
  std::mt19937_64 rng(seed);
  const std::size_t n = order.size();
  while (best.range > best.lower_bound && clock::now() < deadline) {
    order = best_order;
    std::size_t moves = 1 + rng() % 3;
    for (std::size_t m = 0; m < moves; ++m) {
      std::size_t from = rng() % n;
      std::size_t to = rng() % (from + 1);
      std::rotate(order.begin() + static_cast<std::ptrdiff_t>(to), order.begin() + static_cast<std::ptrdiff_t>(from),
                  order.begin() + static_cast<std::ptrdiff_t>(from + 1));
    }
    attempt(order);
  }
  return best;
}

}  // namespace vram::detail::planned_pool

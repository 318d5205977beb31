// planned_pool's placement (detail/planned_pool/placement.hpp) at the size of a large step:
// 20,000 allocations, thousands of them live at once and some crossing the boundary, placed
// with no two blocks live together sharing a byte, checked by a sweep over the placement's
// output (itself checked to find such a pair where there is one); and a range in two parts,
// with no block on the wrong side of the wall or across it.

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <vram/alloc/detail/planned_pool/placement.hpp>

namespace {

using vram::detail::planned_pool::lifetime;

/// The pair of blocks live at one tick that share a byte ("" where none), found by a sweep over
/// the ticks: at each tick frees come before allocations, and each allocation is checked
/// against its neighbours by offset among the live blocks. A wrapping block is live from tick
/// 0 to its end and from its begin to `boundary`, a tick after every other.
std::string overlap_of(const std::vector<lifetime>& blocks, const std::vector<std::uint64_t>& offsets) {
  std::uint32_t boundary = 0;
  for (const lifetime& b : blocks) boundary = std::max({boundary, b.begin + 1, b.end + 1});
  struct change {
    std::uint32_t tick;
    bool alloc;  // false first: frees before allocations at one tick
    std::size_t block;
    bool operator<(const change& o) const { return tick != o.tick ? tick < o.tick : alloc < o.alloc; }
  };
  std::vector<change> changes;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const lifetime& b = blocks[i];
    if (b.size == 0) continue;
    if (b.wraps) {
      if (b.end > 0) {
        changes.push_back({0, true, i});
        changes.push_back({b.end, false, i});
      }
      changes.push_back({b.begin, true, i});
      changes.push_back({boundary + 1, false, i});
    } else {
      changes.push_back({b.begin, true, i});
      changes.push_back({b.end, false, i});
    }
  }
  std::sort(changes.begin(), changes.end());
  std::map<std::uint64_t, std::size_t> live;  // offset -> block
  for (const change& c : changes) {
    const std::uint64_t at = offsets[c.block], end = at + blocks[c.block].size;
    if (!c.alloc) {
      live.erase(at);
      continue;
    }
    auto next = live.lower_bound(at);
    auto report = [&](std::size_t other) {
      return "blocks " + std::to_string(c.block) + " and " + std::to_string(other) + " at tick " + std::to_string(c.tick);
    };
    if (next != live.end() && offsets[next->second] < end) return report(next->second);
    if (next != live.begin() && offsets[std::prev(next)->second] + blocks[std::prev(next)->second].size > at)
      return report(std::prev(next)->second);
    live.emplace(at, c.block);
  }
  return "";
}

/// The first block that breaks the wall's rule ("" where none): a block bound below ends at
/// the wall or lower, one bound above starts at it or higher, and none crosses it.
std::string wall_breach_of(const std::vector<lifetime>& blocks, const std::vector<std::uint64_t>& offsets,
                           std::uint64_t wall) {
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::uint64_t at = offsets[i], end = at + blocks[i].size;
    const bool ok = blocks[i].where == lifetime::part::below   ? end <= wall
                    : blocks[i].where == lifetime::part::above ? at >= wall
                                                               : end <= wall || at >= wall;
    if (!ok) return "block " + std::to_string(i) + " at [" + std::to_string(at) + ", " + std::to_string(end) + ")";
  }
  return "";
}

}  // namespace

TEST_CASE("planned_pool placement: the overlap check finds blocks live together that share a byte",
          "[planned_pool][placement]") {
  const std::vector<lifetime> blocks{{256, 0, 10}, {256, 10, 20}, {512, 15, 30}, {256, 50, 5, true}};
  CHECK(overlap_of(blocks, {0, 0, 256, 768}).empty());
  CHECK_FALSE(overlap_of(blocks, {0, 0, 0, 768}).empty());     // live together over [15, 20)
  CHECK_FALSE(overlap_of(blocks, {0, 256, 768, 0}).empty());   // the wrapping one at the step's start
  CHECK_FALSE(overlap_of(blocks, {0, 0, 255, 768}).empty());   // one byte shared
}

TEST_CASE("planned_pool placement: 20,000 allocations with overlapping lifetimes, some crossing the boundary",
          "[planned_pool][placement]") {
  // A training-like step, one tick per event: activations freed in reverse (thousands live at
  // once in the middle), temporaries freed soon, gradients allocated in the second half and
  // freed early in the next step.
  std::mt19937_64 rng(7);
  std::vector<lifetime> blocks;
  std::vector<std::size_t> open;
  std::uint32_t tick = 0;
  const std::size_t n = 20'000;
  for (std::size_t i = 0; i < n / 2; ++i) {
    const std::uint64_t size = 512 * (1 + rng() % 2048);
    if (rng() % 3 == 0) {
      blocks.push_back({size, tick, tick + 1 + static_cast<std::uint32_t>(rng() % 8)});
      tick += 2;
    } else {
      open.push_back(blocks.size());
      blocks.push_back({size, tick++, 0});
    }
  }
  std::size_t peak_open = open.size();
  for (std::size_t i = n / 2; i < n; ++i) {
    const std::uint64_t size = 512 * (1 + rng() % 2048);
    if (rng() % 4 == 0) {
      blocks.push_back({size, tick++, static_cast<std::uint32_t>(rng() % 2000), true});
    } else if (!open.empty() && rng() % 2 == 0) {
      blocks[open.back()].end = tick++;
      open.pop_back();
      blocks.push_back({size, tick, tick + 1 + static_cast<std::uint32_t>(rng() % 8)});
      tick += 2;
    } else {
      blocks.push_back({size, tick, tick + 1 + static_cast<std::uint32_t>(rng() % 64)});
      ++tick;
    }
  }
  for (; !open.empty(); open.pop_back()) blocks[open.back()].end = tick++;
  REQUIRE(blocks.size() == n);
  REQUIRE(peak_open > 5'000);

  const auto where = vram::detail::planned_pool::place(blocks, std::chrono::nanoseconds(0));
  REQUIRE(where.offsets.size() == n);
  CHECK(where.lower_bound == vram::detail::planned_pool::live_peak(blocks));
  CHECK(where.range >= where.lower_bound);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(where.offsets[i] + blocks[i].size <= where.range);
  CHECK(overlap_of(blocks, where.offsets) == "");
}

TEST_CASE("planned_pool placement: a range in two parts, no block across the wall", "[planned_pool][placement]") {
  // Blocks allocated early in the step bound below, blocks crossing the boundary bound above,
  // the rest free to go in either part; sizes and lifetimes random, many orders searched.
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<lifetime> blocks;
    const std::uint32_t ticks = 400;
    for (std::size_t i = 0; i < 200; ++i) {
      lifetime b;
      b.size = 256 * (1 + rng() % 64);
      b.begin = static_cast<std::uint32_t>(rng() % ticks);
      if (rng() % 4 == 0) {
        b.wraps = true;
        b.end = static_cast<std::uint32_t>(rng() % (b.begin + 1));
        b.where = lifetime::part::above;
      } else {
        b.end = std::min(ticks, b.begin + 1 + static_cast<std::uint32_t>(rng() % 80));
        b.where = b.begin < ticks / 3 && rng() % 2 == 0 ? lifetime::part::below : lifetime::part::any;
      }
      blocks.push_back(b);
    }
    const auto where = vram::detail::planned_pool::place(blocks, std::chrono::milliseconds(2), seed);
    INFO("seed " << seed << ", wall " << where.wall << ", range " << where.range);
    REQUIRE(where.offsets.size() == blocks.size());
    CHECK(where.wall > 0);
    CHECK(where.wall <= where.range);
    CHECK(where.range >= where.lower_bound);
    for (std::size_t i = 0; i < blocks.size(); ++i) REQUIRE(where.offsets[i] + blocks[i].size <= where.range);
    CHECK(wall_breach_of(blocks, where.offsets, where.wall) == "");
    CHECK(overlap_of(blocks, where.offsets) == "");
  }
}

TEST_CASE("planned_pool placement: the wall check finds a block on the wrong side or across it",
          "[planned_pool][placement]") {
  std::vector<lifetime> blocks{{256, 0, 10}, {256, 5, 20}, {256, 30, 5, true}};
  blocks[0].where = lifetime::part::below;
  blocks[2].where = lifetime::part::above;
  CHECK(wall_breach_of(blocks, {0, 256, 512}, 256).empty());
  CHECK_FALSE(wall_breach_of(blocks, {0, 128, 512}, 256).empty());  // an unbound block across the wall
  CHECK_FALSE(wall_breach_of(blocks, {256, 0, 512}, 256).empty());  // bound below, placed above
  CHECK_FALSE(wall_breach_of(blocks, {0, 512, 0}, 256).empty());    // bound above, placed below
}

#pragma once
// detail::planned_pool::recording and plan: what planned_pool learns from one step and what it
// serves the next ones from. A recording lists the step's allocations in order; a plan is that
// list with an offset in one range for each block that lived inside the step (placement.hpp),
// plus what serving needs to stay correct when a step does not repeat exactly.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include <vram/alloc/detail/planned_pool/placement.hpp>
#include <vram/alloc/detail/stream_pool/stream_marker.hpp>

namespace vram::detail::planned_pool {

inline constexpr std::uint32_t no_tick = UINT32_MAX;

/// One allocation of a recorded step, in the order it came.
struct recorded_allocation {
  std::uint64_t requested = 0;
  std::size_t align = 0;
  std::uintptr_t stream = 0;  ///< stream_ref::key()
  std::uint32_t allocated = 0, freed = no_tick;  ///< ticks (events of the step); freed: no_tick while live
};

/// A stream that freed blocks of the plan, remembered so that another stream can wait for it.
struct plan_stream {
  std::uintptr_t key = 0;
  stream_pool::freeing_stream stream;
};

/// One allocation of the plan: matched against the requests of later steps by size, alignment
/// and stream, in order.
struct plan_entry {
  std::uint64_t requested = 0;
  std::uint64_t size = 0;    ///< the planned block: requested rounded to the quantum
  std::uint64_t offset = 0;  ///< in the range (planned entries)
  std::uintptr_t stream = 0;
  std::size_t align = 0;
  std::uint32_t allocated = 0, freed = 0;  ///< planned ticks
  std::uint32_t preds_begin = 0, preds_end = 0;  ///< plan::preds: the blocks last at these addresses before it
  std::uint32_t slot = 0;        ///< plan::slot_offsets index of `offset`
  std::uint32_t live_at = 0;     ///< plan::live index while live
  std::uint64_t serial = 0;      ///< the step it was last served in (plan::step)
  std::uint64_t matched = 0;     ///< the step it was last matched (or given up) in
  std::uint16_t freed_on = 0;    ///< plan::streams index + 1 of its last free's stream; 0: none pending
  bool planned = false;          ///< false: served by the online pool (it outlives the step, or a large alignment)
  bool live = false;
};

/// A plan and its serving state (guarded by planned_pool's mutex).
struct plan {
  std::vector<plan_entry> entries;
  std::vector<std::uint32_t> preds;          ///< per entry, [preds_begin, preds_end)
  std::vector<std::uint64_t> slot_offsets;   ///< the distinct offsets of planned entries, ascending
  std::vector<std::uint32_t> live_at_slot;   ///< entry index + 1 of the live block at that offset, 0: none
  std::vector<std::uint32_t> live;           ///< the live entries (any order)
  std::vector<plan_stream> streams;          ///< streams that freed planned blocks
  /// A min-heap of (planned free, entry) over the live blocks (and stale pairs of blocks since
  /// freed, dropped when they reach the top): while every live block is planned to be freed
  /// after an entry is allocated, the entry overlaps none of them (the placement guarantees it).
  std::vector<std::pair<std::uint64_t, std::uint32_t>> due;
  std::uintptr_t base = 0;                   ///< the range: one block of the online pool
  std::uint64_t range = 0;
  std::uint64_t lower_bound = 0;             ///< peak live bytes of the planned blocks
  std::size_t planned_entries = 0;
  std::size_t orders_tried = 0;
  std::chrono::nanoseconds planning_time{0};
  std::uint64_t live_bytes = 0;              ///< of planned blocks
  std::uint32_t ticks = 0;                   ///< events of the recorded step

  // Serving state of the current step.
  std::size_t cursor = 0;   ///< the first entry not matched in this step
  std::size_t frontier = 0; ///< one past the last entry matched in this step
  std::uint64_t step = 1;   ///< serial of the current step (entries' `serial`)
  std::size_t off_plan = 0; ///< this step: requests matching no entry, entries skipped or served online
  std::size_t served = 0;   ///< this step: allocations served at their planned place
  /// True while every planned entry has been served at its place, in order, since the plan
  /// began: then the blocks last at an entry's addresses are exactly its preds.
  bool history_exact = true;

  [[nodiscard]] bool contains(std::uintptr_t p) const noexcept { return p - base < range; }

  static constexpr std::uint32_t no_match = UINT32_MAX;

  /// The first entry not yet matched in this step, among the next `window` from the cursor,
  /// that asks for this size, alignment and stream; no_match if none.
  [[nodiscard]] std::uint32_t match(std::uint64_t bytes, std::size_t align, std::uintptr_t stream,
                                    std::size_t window) const noexcept {
    std::size_t seen = 0;
    for (std::size_t i = cursor; i < entries.size() && seen < window; ++i) {
      const plan_entry& e = entries[i];
      if (e.matched == step) continue;
      ++seen;
      if (e.requested == bytes && e.align == align && e.stream == stream) return static_cast<std::uint32_t>(i);
    }
    return no_match;
  }

  /// Entry k is matched: the cursor moves past matched entries, and gives up on those left
  /// more than `window` behind the frontier (a missing allocation), counting them off the plan.
  void consume(std::uint32_t k, std::size_t window) noexcept {
    entries[k].matched = step;
    frontier = std::max<std::size_t>(frontier, k + 1);
    while (cursor < entries.size() && (entries[cursor].matched == step || cursor + window < frontier)) {
      if (entries[cursor].matched != step) {
        entries[cursor].matched = step;
        ++off_plan;
        if (entries[cursor].planned) history_exact = false;
      }
      ++cursor;
    }
  }

  /// The live entry whose block starts at `p` (in the range), or nullptr.
  [[nodiscard]] plan_entry* live_block_at(std::uintptr_t p) noexcept {
    std::uint64_t offset = p - base;
    auto it = std::lower_bound(slot_offsets.begin(), slot_offsets.end(), offset);
    if (it == slot_offsets.end() || *it != offset) return nullptr;
    std::uint32_t e = live_at_slot[static_cast<std::size_t>(it - slot_offsets.begin())];
    return e == 0 ? nullptr : &entries[e - 1];
  }

  /// True when a live block of the plan overlaps [offset, offset + size). O(live blocks).
  [[nodiscard]] bool overlaps_live(std::uint64_t offset, std::uint64_t size) const noexcept {
    for (std::uint32_t i : live) {
      const plan_entry& e = entries[i];
      if (e.offset < offset + size && offset < e.offset + e.size) return true;
    }
    return false;
  }

  /// A planned tick of a step, comparable across steps.
  [[nodiscard]] static std::uint64_t at(std::uint64_t serial, std::uint32_t tick) noexcept {
    return serial << 32 | tick;
  }

  /// True when every live block is planned to outlive the start of entry i in this step:
  /// then, where every block served in this step comes before i in the plan (the caller's
  /// in_order), each one's lifetime overlaps i's, and by the placement none overlaps it in
  /// address. O(log live) amortized.
  [[nodiscard]] bool live_outlast(std::uint32_t i) {
    auto later = [](const auto& a, const auto& b) { return a.first > b.first; };
    while (!due.empty()) {
      auto [when, j] = due.front();
      const plan_entry& e = entries[j];
      if (e.live && at(e.serial, e.freed) == when) break;
      std::pop_heap(due.begin(), due.end(), later);
      due.pop_back();
    }
    return due.empty() || due.front().first > at(step, entries[i].allocated);
  }

  void mark_live(std::uint32_t i) noexcept {  // within the capacities make_plan reserved
    plan_entry& e = entries[i];
    e.live = true;
    e.serial = step;
    due.emplace_back(at(step, e.freed), i);
    std::push_heap(due.begin(), due.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    e.live_at = static_cast<std::uint32_t>(live.size());
    live.push_back(i);
    live_at_slot[e.slot] = i + 1;
    live_bytes += e.size;
  }
  void mark_free(std::uint32_t i) noexcept {
    plan_entry& e = entries[i];
    e.live = false;
    live[e.live_at] = live.back();
    entries[live.back()].live_at = e.live_at;
    live.pop_back();
    live_at_slot[e.slot] = 0;
    live_bytes -= e.size;
  }
};

/// The blocks last at each planned entry's addresses when it is allocated, in a step that
/// repeats the plan after a step that did: a painter's map of the range, painted twice over
/// the step (the first pass leaves the state at the end of a step). O(n log n): each paint
/// adds at most three segments, and what it overlaps becomes the entry's preds.
inline void find_preds(plan& p) {
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>> painted;  // start -> (end, entry)
  auto paint = [&](std::uint32_t i, bool collect) {
    const plan_entry& e = p.entries[i];
    const std::uint64_t lo = e.offset, hi = e.offset + e.size;
    auto it = painted.upper_bound(lo);
    if (it != painted.begin()) --it;
    std::vector<std::pair<std::uint64_t, std::pair<std::uint64_t, std::uint32_t>>> kept;  // pieces outside [lo, hi)
    while (it != painted.end() && it->first < hi) {
      auto [start, seg] = *it;
      auto [end, owner] = seg;
      if (end <= lo) {
        ++it;
        continue;
      }
      if (collect && std::find(p.preds.begin() + p.entries[i].preds_begin, p.preds.end(), owner) == p.preds.end())
        p.preds.push_back(owner);
      if (start < lo) kept.push_back({start, {lo, owner}});
      if (end > hi) kept.push_back({hi, {end, owner}});
      it = painted.erase(it);
    }
    for (auto& k : kept) painted.insert(k);
    painted.insert({lo, {hi, i}});
  };
  for (std::uint32_t i = 0; i < p.entries.size(); ++i)
    if (p.entries[i].planned) paint(i, false);
  for (std::uint32_t i = 0; i < p.entries.size(); ++i) {
    plan_entry& e = p.entries[i];
    e.preds_begin = static_cast<std::uint32_t>(p.preds.size());
    if (e.planned) paint(i, true);
    e.preds_end = static_cast<std::uint32_t>(p.preds.size());
  }
}

/// Builds the plan of a recorded step: its allocations in order, those freed inside the step
/// placed by place() within `budget`. `quantum`: the online pool's block rounding.
inline plan make_plan(const std::vector<recorded_allocation>& step, std::uint32_t ticks, std::size_t quantum,
                      std::chrono::nanoseconds budget) {
  auto start = std::chrono::steady_clock::now();
  plan p;
  p.ticks = ticks;
  p.entries.reserve(step.size());
  std::vector<lifetime> blocks;
  std::vector<std::uint32_t> planned;  // entry indices of blocks
  for (const recorded_allocation& r : step) {
    plan_entry e;
    e.requested = r.requested;
    e.size = (r.requested + quantum - 1) / quantum * quantum;
    e.stream = r.stream;
    e.align = r.align;
    e.allocated = r.allocated;
    e.freed = r.freed;
    e.planned = r.freed != no_tick && r.align <= quantum && r.requested != 0;
    if (e.planned) {
      planned.push_back(static_cast<std::uint32_t>(p.entries.size()));
      blocks.push_back({e.size, r.allocated, r.freed});
    }
    p.entries.push_back(e);
  }
  placement where = place(blocks, budget);
  for (std::size_t k = 0; k < planned.size(); ++k) {
    p.entries[planned[k]].offset = where.offsets[k];
    p.slot_offsets.push_back(where.offsets[k]);
  }
  std::sort(p.slot_offsets.begin(), p.slot_offsets.end());
  p.slot_offsets.erase(std::unique(p.slot_offsets.begin(), p.slot_offsets.end()), p.slot_offsets.end());
  for (std::uint32_t i : planned)
    p.entries[i].slot = static_cast<std::uint32_t>(
        std::lower_bound(p.slot_offsets.begin(), p.slot_offsets.end(), p.entries[i].offset) - p.slot_offsets.begin());
  p.live_at_slot.assign(p.slot_offsets.size(), 0);
  // Never outgrown, so that serving allocates nothing: at most every planned entry is live,
  // and the heap holds this step's pairs and those rebuilt from the live blocks at the mark.
  p.live.reserve(planned.size());
  p.due.reserve(2 * planned.size());
  p.range = where.range;
  p.lower_bound = where.lower_bound;
  p.planned_entries = planned.size();
  p.orders_tried = where.orders_tried;
  find_preds(p);
  p.planning_time = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  return p;
}

}  // namespace vram::detail::planned_pool

#pragma once
// detail::planned_pool::recording and plan: what planned_pool learns from one step and what it
// serves the next ones from. A recording lists the step's allocations in order; a plan is that
// list with an offset in one range for each block that lived inside the step (placement.hpp),
// plus what serving needs to stay correct when a step does not repeat exactly.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <vram/alloc/detail/planned_pool/placement.hpp>
#include <vram/alloc/detail/stream_pool/stream_marker.hpp>

namespace vram::detail::planned_pool {

inline constexpr std::uint32_t no_tick = UINT32_MAX;

/// A fixed hash table from the offsets planned blocks start at to dense slots: a free finds
/// its block in one or two probes (open addressing, at most half full).
class offset_table {
 public:
  static constexpr std::uint32_t none = UINT32_MAX;

  /// Gives each distinct offset a slot, in the order first seen; returns the slots by offset given.
  std::vector<std::uint32_t> build(const std::vector<std::uint64_t>& offsets) {
    std::size_t capacity = 16;
    while (capacity < 2 * offsets.size()) capacity *= 2;
    keys_.assign(capacity, 0);
    values_.assign(capacity, none);
    mask_ = capacity - 1;
    std::vector<std::uint32_t> out;
    out.reserve(offsets.size());
    for (std::uint64_t offset : offsets) {
      std::size_t at = probe(offset);
      if (keys_[at] == 0) {
        keys_[at] = offset + 1;
        values_[at] = size_++;
      }
      out.push_back(values_[at]);
    }
    return out;
  }
  [[nodiscard]] std::uint32_t find(std::uint64_t offset) const noexcept {
    if (keys_.empty()) return none;
    std::size_t at = probe(offset);
    return keys_[at] == offset + 1 ? values_[at] : none;
  }
  [[nodiscard]] std::uint32_t size() const noexcept { return size_; }

 private:
  /// The slot holding `offset`, or the empty one where it would go.
  [[nodiscard]] std::size_t probe(std::uint64_t offset) const noexcept {
    std::size_t at = static_cast<std::size_t>(((offset >> 8) * 0x9E3779B97F4A7C15ull) >> 17) & mask_;
    while (keys_[at] != 0 && keys_[at] != offset + 1) at = (at + 1) & mask_;
    return at;
  }
  std::vector<std::uint64_t> keys_;  // offset + 1; 0: empty
  std::vector<std::uint32_t> values_;
  std::size_t mask_ = 0;
  std::uint32_t size_ = 0;
};

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
  std::uint32_t slot = 0;        ///< plan::live_at_slot index of `offset` (entries at one offset share it)
  std::uint32_t frees_before = 0;  ///< planned frees at or before its allocation: plan::free_order's prefix
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
  offset_table slots;                        ///< offset -> slot, for the offsets planned entries start at
  std::vector<std::uint32_t> live_at_slot;   ///< entry index + 1 of the live block at that offset, 0: none
  std::vector<std::uint32_t> live;           ///< the live entries (any order)
  std::vector<plan_stream> streams;          ///< streams that freed planned blocks
  std::vector<std::uint32_t> free_order;     ///< planned entries by planned free
  std::uintptr_t base = 0;                   ///< the range: one block of the online pool
  std::uint64_t range = 0;
  std::uint64_t lower_bound = 0;             ///< peak live bytes of the planned blocks
  std::size_t planned_entries = 0;
  std::size_t orders_tried = 0;
  std::chrono::nanoseconds planning_time{0};
  std::uint64_t live_bytes = 0;              ///< of planned blocks

  // Serving state of the current step.
  std::size_t cursor = 0;   ///< the first entry not matched in this step
  std::size_t frontier = 0; ///< one past the last entry matched in this step
  std::uint64_t step = 1;   ///< serial of the current step (entries' `serial`)
  std::size_t off_plan = 0; ///< this step: requests matching no entry, entries skipped or served online
  std::size_t served = 0;   ///< this step: allocations served at their planned place
  /// True while every planned entry has been served at its place, in order, since the plan
  /// began: then the blocks last at an entry's addresses are exactly its preds.
  bool history_exact = true;
  /// For the quick proof that a place is free (planned_frees_done): free_order's prefix seen
  /// freed in this step, whether every entry matched in this step came in plan order, and the
  /// live blocks served in earlier steps.
  std::size_t free_cursor = 0;
  bool in_order_step = true;
  std::size_t carried = 0;

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
    std::uint32_t slot = slots.find(p - base);
    if (slot == offset_table::none) return nullptr;
    std::uint32_t e = live_at_slot[slot];
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

  /// True when no live block can overlap entry i, proven in O(1) amortized: in a step whose
  /// matches all came in plan order, with no block of an earlier step live, the live blocks are
  /// entries before i; each one the plan frees at or before i's allocation has been seen freed
  /// (the cursor over free_order), so every live one outlives i's start, its lifetime overlaps
  /// i's, and the placement put it elsewhere. False means "not proven" (check overlaps_live).
  [[nodiscard]] bool planned_frees_done(std::uint32_t i) noexcept {
    if (carried != 0 || !in_order_step) return false;
    for (; free_cursor < entries[i].frees_before; ++free_cursor)
      if (entries[free_order[free_cursor]].live) return false;  // freed late: still live
    return true;
  }

  void mark_live(std::uint32_t i) noexcept {  // within the capacities make_plan reserved
    plan_entry& e = entries[i];
    e.live = true;
    e.serial = step;
    e.live_at = static_cast<std::uint32_t>(live.size());
    live.push_back(i);
    live_at_slot[e.slot] = i + 1;
    live_bytes += e.size;
  }
  void mark_free(std::uint32_t i) noexcept {
    plan_entry& e = entries[i];
    e.live = false;
    if (e.serial != step) --carried;
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
inline plan make_plan(const std::vector<recorded_allocation>& step, std::size_t quantum,
                      std::chrono::nanoseconds budget) {
  auto start = std::chrono::steady_clock::now();
  plan p;
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
  for (std::size_t k = 0; k < planned.size(); ++k) p.entries[planned[k]].offset = where.offsets[k];
  std::vector<std::uint32_t> slot_of = p.slots.build(where.offsets);
  for (std::size_t k = 0; k < planned.size(); ++k) p.entries[planned[k]].slot = slot_of[k];
  p.live_at_slot.assign(p.slots.size(), 0);
  // The planned frees in order, and for each entry how many come at or before its allocation.
  p.free_order = planned;
  std::sort(p.free_order.begin(), p.free_order.end(),
            [&](std::uint32_t a, std::uint32_t b) { return p.entries[a].freed < p.entries[b].freed; });
  std::vector<std::uint32_t> free_ticks;
  for (std::uint32_t i : p.free_order) free_ticks.push_back(p.entries[i].freed);
  for (plan_entry& e : p.entries)
    e.frees_before = static_cast<std::uint32_t>(
        std::upper_bound(free_ticks.begin(), free_ticks.end(), e.allocated) - free_ticks.begin());
  // Never outgrown, so that serving allocates nothing: at most every planned entry is live.
  p.live.reserve(planned.size());
  p.range = where.range;
  p.lower_bound = where.lower_bound;
  p.planned_entries = planned.size();
  p.orders_tried = where.orders_tried;
  find_preds(p);
  p.planning_time = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  return p;
}

}  // namespace vram::detail::planned_pool

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

#include <vram/alloc/detail/planned_pool/last_freers.hpp>
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
  /// Freed in the next step, at tick `freed` of that step (a gradient the next zero_grad frees).
  bool wraps = false;
};

/// A block allocated before the recorded step and freed in it, at tick `freed`.
struct carried_in_free {
  std::uint64_t requested = 0;
  std::size_t align = 0;
  std::uint32_t freed = 0;
};

/// Gives the recorded blocks still live at the end of the step a free in the next step, where
/// the step itself freed a block of the same size and alignment that an earlier step had left
/// live: a repeating loop frees its predecessor's leftovers as the next step will free these.
/// Pairs in order (the first leftover with the first such free), and only where the free comes
/// no later than the allocation, so that two instances of one block are never live at once.
/// Leftovers without such a free (weights, optimizer state created once) stay unplanned.
inline void pair_leftovers(std::vector<recorded_allocation>& step, const std::vector<carried_in_free>& frees) {
  std::map<std::pair<std::uint64_t, std::size_t>, std::vector<std::uint32_t>> free_ticks;  // in order
  for (const carried_in_free& f : frees) free_ticks[{f.requested, f.align}].push_back(f.freed);
  std::map<std::pair<std::uint64_t, std::size_t>, std::size_t> next;  // the first unpaired free of each kind
  for (recorded_allocation& r : step) {
    if (r.freed != no_tick) continue;
    auto it = free_ticks.find({r.requested, r.align});
    if (it == free_ticks.end()) continue;
    std::size_t& at = next[it->first];
    if (at == it->second.size() || it->second[at] > r.allocated) continue;
    r.freed = it->second[at++];
    r.wraps = true;
  }
}

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
  std::uint32_t allocated = 0, freed = 0;  ///< planned ticks (freed: of the next step where it wraps)
  std::uint32_t atom_lo = 0, atom_hi = 0;  ///< its bytes as last_freers atoms
  std::uint32_t slot = 0;        ///< plan::live_at_slot index of `offset` (entries at one offset share it)
  std::uint32_t frees_before = 0;  ///< planned frees at or before its allocation: plan::free_order's prefix
  std::uint32_t live_at = 0;     ///< plan::live index while live
  std::uint64_t serial = 0;      ///< the step it was last served in (plan::step)
  std::uint64_t matched = 0;     ///< the step it was last matched (or given up) in
  std::uint64_t ordered_after = 0;  ///< while live: last_freers bits of the streams its stream was ordered after
  bool planned = false;          ///< false: served by the online pool (it outlives the next step, or a large alignment)
  bool wraps = false;            ///< allocated in one step, freed in the next (recorded_allocation::wraps)
  bool live = false;
};

/// A plan and its serving state (guarded by planned_pool's mutex).
struct plan {
  std::vector<plan_entry> entries;
  offset_table slots;                        ///< offset -> slot, for the offsets planned entries start at
  std::vector<std::uint32_t> live_at_slot;   ///< entry index + 1 of the live block at that offset, 0: none
  std::vector<std::uint32_t> live;           ///< the live entries (any order)
  std::vector<plan_stream> streams;          ///< streams that freed planned blocks
  last_freers freers;                        ///< which of them freed each byte of the range last
  /// False while at most one stream has freed planned blocks or taken the range: then every
  /// byte counts as last freed by that stream (a superset of the truth, and the tree is not
  /// kept); the tree takes over once a second one does, painted with that stream, and each
  /// live block's bytes with what it was ordered after (nothing has freed them since).
  bool freers_kept = false;
  std::vector<std::uint32_t> free_order;     ///< planned entries by planned free
  /// The range: offsets [0, range), in one block of the online pool or in two, [0, wall) and
  /// [wall, range) (a plan in two parts: see planned_pool::plan_recording). No planned block
  /// crosses the wall.
  std::uint64_t range = 0, wall = 0;
  std::uintptr_t base = 0;                   ///< where offset `wall` is, while held
  bool held = false;                         ///< [wall, range) is taken from the online pool (and not yet given back)
  std::uintptr_t low_base = 0;               ///< where offset 0 is, while low_held
  bool low_held = false;                     ///< [0, wall) is taken (a plan in two parts)
  /// In the first served step, [wall, range) is taken at the first entry allocated at or after
  /// this tick; until then, online (or from [0, wall)).
  std::uint32_t take_at = 0;
  std::uint64_t lower_bound = 0;             ///< peak live bytes of the planned blocks
  std::size_t planned_entries = 0;
  std::size_t orders_tried = 0;
  std::chrono::nanoseconds planning_time{0};
  std::uint64_t live_bytes = 0;              ///< of planned blocks
  /// The kinds (requested, alignment) of the recording's leftovers, sorted, where the recording
  /// freed nothing an earlier step had left (the first step of a loop: its leftovers could
  /// not be paired); and whether a served step freed an online block of such a kind, which
  /// says they cross the boundary and a new recording would plan them.
  std::vector<std::pair<std::uint64_t, std::size_t>> unpaired;
  bool unpaired_freed = false;

  // Serving state of the current step.
  std::size_t cursor = 0;   ///< the first entry not matched in this step
  std::size_t frontier = 0; ///< one past the last entry matched in this step
  std::uint64_t step = 1;   ///< serial of the current step (entries' `serial`)
  std::size_t off_plan = 0; ///< this step: requests matching no entry, entries skipped or served online
  std::size_t served = 0;   ///< this step: allocations served at their planned place
  /// For the quick proof that a place is free (planned_frees_done): free_order's prefix seen
  /// freed in this step, whether every entry matched in this step came in plan order, and the
  /// live blocks served in earlier steps that the plan does not expect (expected_carry).
  std::size_t free_cursor = 0;
  bool in_order_step = true;
  std::size_t carried = 0;

  [[nodiscard]] bool contains(std::uintptr_t p) const noexcept {
    return (held && p - base < range - wall) || (low_held && p - low_base < wall);
  }
  /// The offset of address p (contains(p)).
  [[nodiscard]] std::uint64_t offset_of(std::uintptr_t p) const noexcept {
    return low_held && p - low_base < wall ? p - low_base : p - base + wall;
  }
  [[nodiscard]] std::uintptr_t address_of(std::uint64_t offset) const noexcept {
    return offset < wall ? low_base + offset : base + (offset - wall);
  }
  /// The part of the range that holds `offset` is taken.
  [[nodiscard]] bool holds(std::uint64_t offset) const noexcept { return offset < wall ? low_held : held; }

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
      }
      ++cursor;
    }
  }

  /// The live entry whose block starts at `p` (in the range), or nullptr.
  [[nodiscard]] plan_entry* live_block_at(std::uintptr_t p) noexcept {
    std::uint32_t slot = slots.find(offset_of(p));
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

  /// The last_freers bits of the streams that freed any byte of entry e's place last.
  [[nodiscard]] std::uint64_t last_freers_of(const plan_entry& e) const noexcept {
    if (freers_kept) return freers.query(e.atom_lo, e.atom_hi);
    return streams.empty() ? 0 : last_freers::bit_of(0);
  }

  /// Atoms [lo, hi) were freed last on the stream of `bit` (a plan::streams bit, or 0).
  void note_free(std::uint32_t lo, std::uint32_t hi, std::uint64_t bit) noexcept {
    if (!freers_kept && streams.size() > 1) {  // a second stream: from now on, what each byte saw
      freers.paint(0, static_cast<std::uint32_t>(freers.atoms()), last_freers::bit_of(0));
      for (std::uint32_t i : live) freers.paint(entries[i].atom_lo, entries[i].atom_hi, entries[i].ordered_after);
      freers_kept = true;
    }
    if (freers_kept) freers.paint(lo, hi, bit);
  }

  /// A live block of an earlier step that the plan expects: one that wraps, from the step before.
  [[nodiscard]] bool expected_carry(const plan_entry& e) const noexcept {
    return e.serial == step || (e.wraps && e.serial + 1 == step);
  }

  /// True when no live block can overlap entry i, proven in O(1) amortized: in a step whose
  /// matches all came in plan order, with no block of an earlier step live but the wrapping
  /// ones of the step before, the live blocks are entries before i and those; each one the
  /// plan frees at or before i's allocation has been seen freed (the cursor over free_order,
  /// which passes a wrapping entry's free before its own allocation in the step), so every
  /// live one outlives i's start, its lifetime overlaps i's, and the placement put it
  /// elsewhere. False means "not proven" (check overlaps_live).
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
    if (!expected_carry(e)) --carried;
    live[e.live_at] = live.back();
    entries[live.back()].live_at = e.live_at;
    live.pop_back();
    live_at_slot[e.slot] = 0;
    live_bytes -= e.size;
  }
};

/// Where the first served step takes the range, and whether the recording's free memory goes
/// back at the mark (take_choice). The recording's leftovers that wrap are online blocks the
/// step frees at the ticks the plan gives its wrapping entries (`freed`): the range cannot
/// hold them, so from the take to their free they are held twice (online, and their place
/// in the range), as are the blocks the step allocated online before the take and still
/// holds. Before the take the step is served online. For a take at tick t, with L the bytes
/// live outside the plan (`outside`: weights, optimizer state), X(t) the leftovers not yet
/// freed, S(t) the step's planned bytes live at t and live(t) = X(t) + S(t):
///   online part   A(t) = (L + max live(u), u < t) x the online pool's measured fragmentation
///                 (`held` reserved over `recorded_peak` live in the recording);
///   planned part  B(t) = L + range + X(t) + S(t) (both terms only fall after t: no block
///                 allocated after the take is held twice);
/// and the take goes where max(A, B) is least (the earliest such tick), no later than the
/// first wrapping allocation (which must be in the range, or the next step would hold its
/// block online again). The free memory goes back at the mark where the online part stays
/// below the recording's peak (the memory the recording held is then more than it needs);
/// else it serves that part as it served the recording. Where nothing wraps: tick 0, taken at
/// the mark.
struct take_choice {
  std::uint32_t tick = 0;
  bool release_at_mark = true;
  double cost = 0;  ///< the peak of reserved bytes predicted for the first served step
};

inline take_choice choose_take(const plan& p, std::uint64_t outside, std::uint64_t held, std::uint64_t recorded_peak) {
  std::uint32_t last = UINT32_MAX;
  for (const plan_entry& e : p.entries)
    if (e.planned && e.wraps) last = std::min(last, e.allocated);
  if (last == UINT32_MAX) return {};
  // (tick, change of live bytes, is a planned allocation: where a take can happen), sorted
  // with frees first at one tick; a wrapping entry's previous instance is live from 0 to its
  // `freed`, its own instance is in the range.
  struct change {
    std::uint32_t tick;
    std::int64_t bytes;
    bool allocation;
  };
  std::vector<change> changes;
  std::int64_t live = 0;  // X(0): the leftovers, all live at the mark
  for (const plan_entry& e : p.entries) {
    if (!e.planned) continue;
    const auto b = static_cast<std::int64_t>(e.size);
    if (e.wraps) {  // its previous instance, an online leftover; its own allocation a candidate
      live += b;
      changes.push_back({e.freed, -b, false});
      changes.push_back({e.allocated, 0, true});
    } else {
      changes.push_back({e.allocated, b, true});
      changes.push_back({e.freed, -b, false});
    }
  }
  std::sort(changes.begin(), changes.end(), [](const change& a, const change& b) {
    return a.tick != b.tick ? a.tick < b.tick : a.bytes < b.bytes;
  });
  const double fragmentation = recorded_peak == 0 ? 1.0 : std::max(1.0, double(held) / double(recorded_peak));
  const auto l = static_cast<double>(outside), range = static_cast<double>(p.range);
  std::int64_t peak_before = 0;  // max live(u), u < the candidate tick
  double least = -1;
  take_choice best{0, true};
  auto consider = [&](std::uint32_t tick) {
    const double online = (l + double(peak_before)) * fragmentation;
    const double cost = std::max(online, l + range + double(live));
    if (least < 0 || cost < least) {
      least = cost;
      best.cost = cost;
      best.tick = tick;
      best.release_at_mark = peak_before < static_cast<std::int64_t>(recorded_peak > outside ? recorded_peak - outside : 0);
    }
  };
  consider(0);
  peak_before = live;
  for (const change& c : changes) {
    if (c.tick > last) break;
    // A take at an allocation of the step's own sees live(t) before it: the changes at
    // earlier ticks are in, this one's not yet.
    if (c.allocation) consider(c.tick);
    live += c.bytes;
    peak_before = std::max(peak_before, live);
  }
  return best;
}

/// Builds the plan of a recorded step: its allocations in order, those freed inside the step or
/// in the next one (wrapping) placed by place() within `budget`. `quantum`: the online pool's
/// block rounding. `two_parts_at` != 0: a plan in two parts, its upper part taken at that tick
/// of the first served step (take_at): the blocks allocated before it go below the wall, the
/// wrapping ones above it.
inline plan make_plan(const std::vector<recorded_allocation>& step, std::size_t quantum,
                      std::chrono::nanoseconds budget, std::uint32_t two_parts_at = 0) {
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
    e.wraps = r.wraps;
    e.planned = r.freed != no_tick && r.align <= quantum && r.requested != 0;
    if (e.planned) {
      planned.push_back(static_cast<std::uint32_t>(p.entries.size()));
      lifetime b{e.size, r.allocated, r.freed, r.wraps};
      if (two_parts_at != 0 && r.wraps) b.where = lifetime::part::above;
      if (two_parts_at != 0 && !r.wraps && r.allocated < two_parts_at) b.where = lifetime::part::below;
      blocks.push_back(b);
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
  p.wall = std::min(where.wall, where.range);
  p.take_at = two_parts_at;
  p.lower_bound = where.lower_bound;
  p.planned_entries = planned.size();
  p.orders_tried = where.orders_tried;
  // The atoms: the range cut at every planned block's edges.
  std::vector<std::uint64_t> edges;
  for (std::uint32_t i : planned) {
    edges.push_back(p.entries[i].offset);
    edges.push_back(p.entries[i].offset + p.entries[i].size);
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  auto atom = [&](std::uint64_t at) {
    return static_cast<std::uint32_t>(std::lower_bound(edges.begin(), edges.end(), at) - edges.begin());
  };
  for (std::uint32_t i : planned) {
    p.entries[i].atom_lo = atom(p.entries[i].offset);
    p.entries[i].atom_hi = atom(p.entries[i].offset + p.entries[i].size);
  }
  p.freers.reset(edges.empty() ? 0 : edges.size() - 1);
  p.planning_time = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  return p;
}

}  // namespace vram::detail::planned_pool

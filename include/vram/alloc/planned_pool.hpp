#pragma once
// vram::planned_pool: a stream_pool that learns a repeating step (a training iteration, a
// batch of inference) and serves the next steps from an offline placement of it.
// Design: docs/planned_pool.md.

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/alloc/detail/planned_pool/plan.hpp>
#include <vram/alloc/detail/stream_pool/lanes.hpp>
#include <vram/alloc/detail/stream_pool/mutex.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/alignment.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/throw.hpp>
#include <vram/source/host_source.hpp>  // for the static_assert below

namespace vram {

struct planned_pool_options {
  /// The pool that serves everything off the plan (and the recording steps), and holds the
  /// plan's range as one of its blocks.
  stream_pool_options online{};
  /// Time the placement search may take at each new plan (the greedy orders always run).
  std::chrono::milliseconds planning_budget{200};
  /// A step whose requests off the plan (matching no entry, entries skipped, entries served
  /// online because their place was taken) exceed this fraction of the plan's entries drops
  /// the plan as soon as they do, and the next mark starts a new recording.
  double max_off_plan = 0.10;
  /// How far ahead of the expected entry a request may match (a missing allocation skips
  /// entries; beyond the window the request is off the plan).
  std::size_t match_window = 16;
};

/// Where a planned_pool stands, and what its plan is.
struct plan_summary {
  enum class phase : std::uint8_t {
    online,     ///< before the first mark_step: everything from the online pool
    recording,  ///< between two marks: the step is recorded, served online
    serving,    ///< from the plan (and online for what is off it)
  };
  phase now = phase::online;
  std::size_t entries = 0;          ///< allocations of the recorded step
  std::size_t planned_entries = 0;  ///< those placed in the range (freed inside the step)
  std::uint64_t range_bytes = 0;    ///< the plan's range
  /// A plan in two parts (blocks cross the step boundary): its lower part, taken at the mark;
  /// the rest is taken in the first served step once the recording's leftovers are freed. 0
  /// for a plan in one part.
  std::uint64_t lower_part_bytes = 0;
  std::uint64_t lower_bound_bytes = 0;  ///< the peak of the planned blocks' live bytes: no range is smaller
  std::chrono::nanoseconds planning_time{0};  ///< the mark's: both plans where it made two (plan_recording)
  std::size_t orders_tried = 0;     ///< placements evaluated by the search
  std::size_t plans_made = 0;
  std::size_t plans_refused = 0;    ///< plans dropped: the online pool could not hold their range
  /// Plans dropped because holding their range would have raised the online pool's peak
  /// reserve (planned_pool::take_part).
  std::size_t plans_declined = 0;
  std::size_t steps_served = 0;     ///< steps closed while serving from a plan
  std::size_t last_step_planned = 0;   ///< allocations of the last step served at their planned place
  std::size_t last_step_off_plan = 0;  ///< in the last step served
};

/// A pool for work that repeats: it records one step (between two mark_step() calls), places
/// every block that lived inside it, or from it into the next step (a gradient the next
/// zero_grad frees), offline in one range (best fit by size and lifetime, then a search), and
/// from the next step on serves the requests that match the recording at their planned
/// offsets. Where the pattern repeats exactly, the range is the step's peak of live bytes or
/// close to it: no fragmentation, which an online allocator cannot promise. Where blocks cross
/// the boundary, the range is in two parts, so that the first served step never holds it
/// beside the recording's leftovers (plan_recording). A part is taken only where it does not
/// raise the online pool's peak reserve (take_part): else the plan is declined.
///
/// Matching: requests are matched in order against the recorded allocations by size,
/// alignment and stream (a missing allocation skips ahead, within match_window). A request
/// off the plan, or whose planned place is still taken (a block freed late, a leftover of an
/// earlier step), is served by the online stream_pool: the plan is never corrupted. A step too
/// far off the plan (max_off_plan) drops the plan at once (its range returns to the online
/// pool when its last block is freed) and is followed by a new recording. Blocks that outlive
/// the next step, or ask for an alignment above 256, are always served online.
///
/// Streams: a planned block handed to stream T is ordered after every other stream that freed
/// any byte of its place last (what happened, whatever the plan says: last_freers), by an
/// event as stream_pool's steal. A range goes back to the online pool on the stream of the
/// request or free that retires it, after the other streams that freed planned blocks (a wait
/// enqueued, never blocking); at a mark or at destruction, on the synchronous stream (blocking).
///
/// Thread safety: all members may be called concurrently; one mutex serializes them (the
/// online pool's per-stream fast path is behind it). Planning runs inside mark_step().
/// Statistics: exact (one ledger); reserved and free blocks are the online pool's, the range
/// counting as reserved.
/// Complexity: a planned allocation O(match_window + log n) amortized (plus O(live planned
/// blocks) in a step off the plan, where the quick proof that its place is free does not
/// apply), a planned free O(log n); planning O(n^2) per order tried (n allocations in the step),
/// within planning_budget per plan, two plans at most per mark (plan_recording).
/// Misuse (foreign pointer, double free, wrong size) is reported and changes nothing.
template <class Upstream>
class planned_pool : public forward_properties<planned_pool<Upstream>, Upstream> {
  using plan = detail::planned_pool::plan;
  using plan_entry = detail::planned_pool::plan_entry;
  using recorded_allocation = detail::planned_pool::recorded_allocation;
  using carried_in_free = detail::planned_pool::carried_in_free;
  using last_freers = detail::planned_pool::last_freers;
  static constexpr std::size_t quantum = detail::stream_pool::size_classes::quantum;

 public:
  explicit planned_pool(Upstream upstream = Upstream{}, planned_pool_options options = {})
      : options_(options), online_(std::move(upstream), options.online) {
    if (!(options_.max_off_plan >= 0.0)) detail::throw_invalid_argument(name(), "max_off_plan must be 0 or more");
    if (options_.match_window == 0) detail::throw_invalid_argument(name(), "match_window must be at least 1");
  }

  planned_pool(const planned_pool&) = delete;
  planned_pool& operator=(const planned_pool&) = delete;

  /// Gives the plans' ranges back to the online pool (which gives everything to the upstream).
  /// Live planned blocks are reported as misuse.
  ~planned_pool() {
    std::lock_guard lock(mutex_);
    if (plan_) retired_.push_back(std::move(plan_));
    for (auto& p : retired_) {
      if (!p->live.empty()) report_misuse({misuse::live_at_destruction, name(), nullptr, p->live_bytes, 0});
      if (!p->held && !p->low_held) continue;
      // Its streams may be destroyed by now (CUDA streams are not named: wait_before_release).
      detail::stream_pool::wait_before_release(
          online_.upstream(),
          [&](auto&& visit) {
            for (const auto& freed : p->streams) visit(freed.stream);
          },
          [&] { report_misuse({misuse::upstream_failure, name(), reinterpret_cast<void*>(p->base), 0, 0}); });
      free_parts(*p, stream_ref{});
    }
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "planned_pool"; }

  /// Allocates `bytes` ordered on `s`, at its planned offset when the request matches the plan.
  /// Throws what stream_pool::allocate throws (nothing changed).
  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    if (bytes == 0) return online_.allocate(s, 0, align);  // nullptr, or the online pool's error
    detail::check_request(name(), bytes, align);
    std::lock_guard lock(mutex_);
    void* p = nullptr;
    switch (phase_) {
      case plan_summary::phase::online: p = online_.allocate(s, bytes, align); break;
      case plan_summary::phase::recording: p = allocate_recorded(s, bytes, align); break;
      case plan_summary::phase::serving: p = allocate_served(s, bytes, align); break;
    }
    ledger_.book(align_up(bytes, quantum), bytes);
    if (phase_ == plan_summary::phase::recording) recording_peak_ = std::max<std::uint64_t>(recording_peak_, ledger_.live);
    return p;
  }

  [[nodiscard]] void* try_allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    try {
      return allocate(s, bytes, align);
    } catch (const out_of_memory&) {
      return nullptr;
    }
  }

  /// Frees `p` ordered on `s`: a planned block's place is reusable on `s` at once, on other
  /// streams after they wait for `s`.
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(mutex_);
    if (phase_ == plan_summary::phase::recording) ++ticks_;
    if (plan_ && plan_->contains(addr)) return free_planned(*plan_, s, addr, bytes);
    for (std::size_t i = 0; i < retired_.size(); ++i) {
      plan& old = *retired_[i];
      if (!old.contains(addr)) continue;
      free_planned(old, s, addr, bytes);
      if (old.live.empty()) {
        give_range_back(old, s);
        retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(i));
      }
      return;
    }
    std::uint64_t reports = detail::misuse_reports_on_this_thread();
    online_.deallocate(s, p, bytes, align);
    if (detail::misuse_reports_on_this_thread() != reports) return;  // refused: nothing changed
    ledger_.unbook(align_up(bytes, quantum), bytes);
    if (phase_ == plan_summary::phase::serving && !plan_->unpaired.empty() &&
        std::binary_search(plan_->unpaired.begin(), plan_->unpaired.end(), std::pair<std::uint64_t, std::size_t>(bytes, align)))
      plan_->unpaired_freed = true;
    if (phase_ == plan_summary::phase::recording) {
      if (auto it = recorded_live_.find(addr); it != recorded_live_.end()) {
        recording_[it->second].freed = ticks_;
        recorded_live_.erase(it);
      } else {
        try {
          carried_in_.push_back({bytes, align, ticks_});
        } catch (...) {  // not remembered: the leftover it would pair with stays unplanned
        }
      }
    }
  }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) { return allocate(stream_ref{}, bytes, align); }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align);
  }

  /// Marks the boundary between two steps. The first mark starts a recording; the next one
  /// plans the recorded step (within planning_budget) and serving begins; later marks close a
  /// served step, and start a new recording when it was too far off the plan. Returns where
  /// the pool stands after the mark. Where the online pool cannot hold the plan's range (out
  /// of memory), the plan is dropped, counted in plans_refused, and the next step is recorded;
  /// where holding it would raise the online pool's peak reserve, it is declined (take_part).
  plan_summary mark_step() {
    std::lock_guard lock(mutex_);
    switch (phase_) {
      case plan_summary::phase::online:
        if (marks_online_ > 0) --marks_online_;  // a plan declined lately: online a while yet
        else start_recording();
        break;
      case plan_summary::phase::recording: finish_recording(); break;
      case plan_summary::phase::serving: close_served_step(); break;
    }
    return summary_locked();
  }

  [[nodiscard]] plan_summary summary() const {
    std::lock_guard lock(mutex_);
    return summary_locked();
  }

  /// Returns the online pool's free memory to the upstream (the plan's range stays).
  std::size_t release() {
    std::lock_guard lock(mutex_);
    return online_.release();
  }

  [[nodiscard]] bool owns(const void* p) const {
    auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(mutex_);
    bool in_a_range = false;
    for (const plan* pl : plans()) {
      if (!pl->contains(addr)) continue;
      in_a_range = true;
      if (const_cast<plan*>(pl)->live_block_at(addr) != nullptr) return true;
    }
    return !in_a_range && online_.owns(p);
  }

  /// The online pool's figures with the live figures of every block, planned or not: the
  /// ranges count as reserved, not live.
  [[nodiscard]] vram::stats stats() const {
    std::lock_guard lock(mutex_);
    vram::stats st = online_.stats();
    st.live_bytes = ledger_.live;
    st.requested_bytes = ledger_.requested;
    st.peak_live_bytes = ledger_.peak_live;
    st.peak_requested_bytes = ledger_.peak_requested;
    st.total_allocations = ledger_.allocations;
    st.total_deallocations = ledger_.deallocations;
    st.live_allocations = ledger_.allocations - ledger_.deallocations;
    st.free_bytes = st.reserved_bytes - st.live_bytes;
    return st;
  }

  /// The online pool's free blocks, then the gaps between live blocks in each range.
  template <class F>
  void for_each_free_block(F&& f) const {
    std::lock_guard lock(mutex_);
    online_.for_each_free_block(f);
    for (const plan* pl : plans()) {
      std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;
      for (std::uint32_t i : pl->live) taken.emplace_back(pl->entries[i].offset, pl->entries[i].size);
      std::sort(taken.begin(), taken.end());
      // Each part held on its own: no block crosses the wall, nor does a gap.
      auto gaps = [&](std::uint64_t from, std::uint64_t to) {
        std::uint64_t at = from;
        for (auto [offset, size] : taken) {
          if (offset < from || offset >= to) continue;
          if (offset > at) f(static_cast<std::size_t>(offset - at));
          at = offset + size;
        }
        if (to > at) f(static_cast<std::size_t>(to - at));
      };
      if (pl->low_held) gaps(0, pl->wall);
      if (pl->held) gaps(pl->wall, pl->range);
    }
  }

  /// Verifies the online pool and every plan: live blocks inside their range, pairwise
  /// disjoint, ordered after the streams that freed their bytes last, and the live lists,
  /// offsets and byte counts in agreement. Throws std::logic_error.
  void check_invariants() const {
    std::lock_guard lock(mutex_);
    online_.check_invariants();
    auto fail = [](const char* what) { throw std::logic_error(std::string("planned_pool invariant: ") + what); };
    std::uint64_t planned_live = 0;
    for (const plan* pl : plans()) {
      if (pl->held && pl->range > pl->wall && !online_.owns(reinterpret_cast<void*>(pl->base)))
        fail("a range is not an online block");
      if (pl->low_held && !online_.owns(reinterpret_cast<void*>(pl->low_base))) fail("a range's lower part is not an online block");
      if (pl->wall > pl->range) fail("the wall outside the range");
      std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;
      std::uint64_t bytes = 0;
      for (std::size_t k = 0; k < pl->live.size(); ++k) {
        const plan_entry& e = pl->entries[pl->live[k]];
        if (!e.live || e.live_at != k || !e.planned) fail("live list and flags disagree");
        if (pl->live_at_slot[e.slot] != pl->live[k] + 1) fail("offset table disagrees");
        if (e.offset + e.size > pl->range) fail("a block outside its range");
        if (e.offset < pl->wall && e.offset + e.size > pl->wall) fail("a block across the wall");
        if (!pl->holds(e.offset)) fail("a live planned block where its part of the range is not held");
        taken.emplace_back(e.offset, e.offset + e.size);
        bytes += e.size;
      }
      std::sort(taken.begin(), taken.end());
      for (std::size_t k = 1; k < taken.size(); ++k)
        if (taken[k].first < taken[k - 1].second) fail("two live blocks overlap");
      std::size_t carried = 0;
      for (std::uint32_t i : pl->live) carried += !pl->expected_carry(pl->entries[i]);
      if (pl == plan_.get() && carried != pl->carried) fail("blocks of earlier steps miscounted");
      // Stream order: every live block's stream was ordered after each stream that freed any
      // of its bytes last (nothing repaints a live block's bytes: its place is its own). Checked
      // where the tree is kept; before, one stream at most has freed into the range.
      if (!pl->freers.consistent()) fail("the last freers' tree disagrees with itself");
      if (!pl->freers_kept && pl->streams.size() > 1) fail("two streams freed into the range, the tree not kept");
      for (std::uint32_t i : pl->live) {
        if (!pl->freers_kept) break;
        const plan_entry& e = pl->entries[i];
        if ((pl->last_freers_of(e) & ~e.ordered_after) != 0)
          fail("a live block not ordered after a stream that freed its bytes");
      }
      if (bytes != pl->live_bytes) fail("live bytes miscounted");
      planned_live += bytes;
    }
    if (planned_live > ledger_.live) fail("planned bytes above live bytes");
    if (ledger_.peak_live < ledger_.live || ledger_.peak_requested < ledger_.requested) fail("peak below current");
  }

  [[nodiscard]] const planned_pool_options& options() const noexcept { return options_; }
  [[nodiscard]] const stream_pool<Upstream>& online() const noexcept { return online_; }
  [[nodiscard]] const Upstream& upstream() const noexcept { return online_.upstream(); }

  friend bool operator==(const planned_pool& a, const planned_pool& b) noexcept { return &a == &b; }

 private:
  std::vector<const plan*> plans() const {  // pre: mutex_ held
    std::vector<const plan*> all;
    if (plan_) all.push_back(plan_.get());
    for (const auto& p : retired_) all.push_back(p.get());
    return all;
  }

  // ---- recording ----------------------------------------------------------------------

  void start_recording() {
    recording_.clear();
    recorded_live_.clear();
    carried_in_.clear();
    ticks_ = 0;
    recording_peak_ = ledger_.live;
    phase_ = plan_summary::phase::recording;
  }

  void* allocate_recorded(stream_ref s, std::size_t bytes, std::size_t align) {
    void* p = online_.allocate(s, bytes, align);
    try {
      recorded_live_.emplace(reinterpret_cast<std::uintptr_t>(p), recording_.size());
      recording_.push_back({bytes, align, s.key(), ticks_++});
    } catch (...) {
      recorded_live_.erase(reinterpret_cast<std::uintptr_t>(p));
      online_.deallocate(s, p, bytes, align);
      throw;
    }
    return p;
  }

  void finish_recording() {
    detail::planned_pool::pair_leftovers(recording_, carried_in_);
    plan next = plan_recording();
    if (carried_in_.empty()) {
      for (const recorded_allocation& r : recording_)
        if (r.freed == detail::planned_pool::no_tick) next.unpaired.emplace_back(r.requested, r.align);
      std::sort(next.unpaired.begin(), next.unpaired.end());
    }
    // Nothing wraps: the range is taken now. A plan in two parts: its lower part now.
    const bool refused = next.range != 0 && (next.take_at == 0 ? !take_range(next, stream_ref{})
                                                                : next.wall != 0 && !take_lower_part(next));
    if (refused) {  // no room for the range, or it would cost more than the online pool
      if (marks_online_ == 0) start_recording();  // record the next step
      else phase_ = plan_summary::phase::online;
      return;
    }
    plan_ = std::make_unique<plan>(std::move(next));
    ++plans_made_;
    last_off_plan_ = last_planned_ = 0;  // the step just closed was recorded, not served
    recording_.clear();
    recorded_live_.clear();
    carried_in_.clear();
    phase_ = plan_summary::phase::serving;
  }

  /// The plan of the recorded step. Where blocks wrap, the recording's leftovers that wrap are
  /// online blocks the first served step frees: a range held beside them counts them twice.
  /// The plan is then made in two parts: the upper one, holding the wrapping blocks, is taken
  /// in the first served step once the last of those leftovers is freed (plan::take_at); the
  /// lower one, holding what the step allocates before that, at the mark; the blocks allocated
  /// later go in either. Its first served step peaks at the outside blocks plus the larger of
  /// the leftovers with the lower part and the whole range. A wrapping block allocated before
  /// that tick stays online. Where that peak would pass what the online pool holds now (the
  /// online pool's own cost of the step), the plan is one range taken where choose_take says,
  /// the step served online before it.
  plan plan_recording() {
    using detail::planned_pool::no_tick;
    std::uint32_t last_free = 0;  // of the leftovers that wrap: all freed at this tick
    std::uint64_t leftovers = 0;
    for (const auto& [addr, index] : recorded_live_) {
      const recorded_allocation& r = recording_[index];
      if (!r.wraps) continue;
      last_free = std::max(last_free, r.freed);
      leftovers += align_up(r.requested, quantum);
    }
    if (leftovers == 0) return detail::planned_pool::make_plan(recording_, quantum, options_.planning_budget);
    const std::uint32_t take_at = last_free + 1;
    std::vector<recorded_allocation> step = recording_;
    for (recorded_allocation& r : step)
      if (r.wraps && r.allocated < take_at) r = {r.requested, r.align, r.stream, r.allocated, no_tick, false};
    const std::size_t reserved = online_.stats().reserved_bytes;
    const std::uint64_t outside = ledger_.live > leftovers ? ledger_.live - leftovers : 0;
    plan two = detail::planned_pool::make_plan(step, quantum, options_.planning_budget, take_at);
    if (outside + std::max(leftovers + two.wall, two.range) <= reserved) return two;
    plan one = detail::planned_pool::make_plan(recording_, quantum, options_.planning_budget);
    one.planning_time += two.planning_time;
    const auto take = detail::planned_pool::choose_take(one, outside, reserved, recording_peak_);
    one.take_at = take.tick;
    if (take.release_at_mark) online_.release();
    return one;
  }

  /// Takes the upper part of the plan's range, [wall, range) (all of it for a plan in one
  /// part), from the online pool on `s`. What the online pool holds free (the recorded step's
  /// fragmentation included) goes back to the upstream first, so the range adds nothing to the
  /// peak where that memory was free. A range taken on a stream is ordered after that stream
  /// for everyone else (its bytes are painted with it). False where take_part refuses or
  /// declines it.
  bool take_range(plan& pl, stream_ref s) {
    if (pl.range > pl.wall) {
      void* p = take_part(s, static_cast<std::size_t>(pl.range - pl.wall));
      if (p == nullptr) return false;
      pl.base = reinterpret_cast<std::uintptr_t>(p);
    }
    pl.held = true;
    if (s.key() != 0) pl.note_free(pl.wall == 0 ? 0 : first_atom_above(pl), static_cast<std::uint32_t>(pl.freers.atoms()), freer_bit(pl, s));
    return true;
  }

  /// Takes the lower part of a plan in two parts, [0, wall), at the mark (the synchronous
  /// stream), the online pool's free memory given back first. False where take_part refuses
  /// or declines it.
  bool take_lower_part(plan& pl) {
    void* p = take_part(stream_ref{}, static_cast<std::size_t>(pl.wall));
    if (p == nullptr) return false;
    pl.low_base = reinterpret_cast<std::uintptr_t>(p);
    pl.low_held = true;
    return true;
  }

  /// `bytes` of a plan's range from the online pool on `s`, its free memory given back to the
  /// upstream first; nullptr where the online pool cannot hold them (plans_refused) or where
  /// holding them would raise its peak reserve (plans_declined): over an upstream that is not
  /// contiguous, a part larger than every free block is a growth of its own while the blocks
  /// outside the plan keep the old memory, and the plan would cost more than serving the step
  /// online. A declined plan is not tried again for the next 1, 2, 4, ... 64 marks.
  void* take_part(stream_ref s, std::size_t bytes) {
    const std::size_t peak = online_.stats().peak_reserved_bytes;
    online_.release();
    const vram::stats now = online_.stats();
    const std::size_t cap = options_.online.maximum_size;  // past it the online pool refuses
    const bool grows = now.largest_free_block < bytes, past_cap = cap != 0 && now.reserved_bytes + bytes > cap;
    if (grows && !past_cap && now.reserved_bytes + bytes > peak) {
      ++plans_declined_;
      marks_online_ = next_backoff_;
      next_backoff_ = std::min<std::size_t>(2 * next_backoff_, 64);
      last_off_plan_ = last_planned_ = 0;
      return nullptr;
    }
    try {
      void* p = online_.allocate(s, bytes, quantum);
      next_backoff_ = 1;
      return p;
    } catch (const std::bad_alloc&) {
      ++plans_refused_;
      last_off_plan_ = last_planned_ = 0;
      return nullptr;
    }
  }

  /// The first last_freers atom at or above the wall (the atoms are cut at every planned
  /// block's edges, and no block crosses the wall, so one starts there where any lies above).
  static std::uint32_t first_atom_above(const plan& pl) noexcept {
    std::uint32_t first = static_cast<std::uint32_t>(pl.freers.atoms());
    for (const plan_entry& e : pl.entries)
      if (e.planned && e.offset >= pl.wall) first = std::min(first, e.atom_lo);
    return first;
  }

  // ---- serving ------------------------------------------------------------------------

  void* allocate_served(stream_ref s, std::size_t bytes, std::size_t align) {
    plan& pl = *plan_;
    const std::uint32_t k = pl.match(bytes, align, s.key(), options_.match_window);
    if (k != plan::no_match && !pl.held && pl.range != 0 && pl.entries[k].allocated >= pl.take_at &&
        !take_range(pl, s)) {
      abandon_plan(s);  // no room for the range: online until the next mark records a step
      return online_.allocate(s, bytes, align);
    }
    if (k == plan::no_match) {
      void* p = online_.allocate(s, bytes, align);
      ++pl.off_plan;
      if (too_far_off(pl)) abandon_plan(s);
      return p;
    }
    const plan_entry& e = pl.entries[k];
    const bool in_order = k >= pl.frontier;  // every entry matched so far in this step comes before it
    if (!in_order) pl.in_order_step = false;
    const bool at_place = e.planned && pl.holds(e.offset) && place_is_free(pl, k) && order_after_frees(pl, k, s);
    // The online pool may throw: nothing has changed yet.
    void* p = at_place ? reinterpret_cast<void*>(pl.address_of(e.offset)) : online_.allocate(s, bytes, align);
    pl.consume(k, options_.match_window);
    if (at_place) {
      pl.mark_live(k);
      ++pl.served;
    } else if (e.planned && pl.holds(e.offset)) {  // its place was taken
      ++pl.off_plan;
    }
    if (too_far_off(pl)) abandon_plan(s);
    return p;
  }

  bool too_far_off(const plan& pl) const noexcept {
    return double(pl.off_plan) > options_.max_off_plan * double(pl.entries.size());
  }

  /// A step already too far off its plan: the plan is retired at once, so that its range
  /// returns to the online pool as soon as its blocks are freed (a step that does not repeat
  /// must not hold a range it does not use), and the next mark starts a new recording.
  void abandon_plan(stream_ref s) {
    last_off_plan_ = plan_->off_plan;
    last_planned_ = plan_->served;
    ++steps_served_;
    retire(std::move(plan_), s);
    phase_ = plan_summary::phase::online;
  }

  /// No live block overlaps entry k's place.
  static bool place_is_free(plan& pl, std::uint32_t k) {
    const plan_entry& e = pl.entries[k];
    if (e.live) return false;  // its block of an earlier step is still live
    return pl.planned_frees_done(k) || !pl.overlaps_live(e.offset, e.size);
  }

  /// Makes `s` wait for every other stream that freed any byte of entry k's place last (what
  /// happened, whatever the plan said: see last_freers), and notes them in the entry; false
  /// (nothing noted) where the pool cannot order it (a stream's event could not be recorded).
  bool order_after_frees(plan& pl, std::uint32_t k, stream_ref s) noexcept {
    plan_entry& e = pl.entries[k];
    const std::uint64_t freers = pl.last_freers_of(e);
    auto wait_for = [&](std::size_t stream_index) {
      const auto& freed = pl.streams[stream_index];
      if (freed.key != s.key()) freed.stream.record().make_wait(s);
    };
    try {
      for (std::uint64_t bits = freers; bits != 0; bits &= bits - 1) {
        const auto b = static_cast<std::size_t>(std::countr_zero(bits));
        if (b < last_freers::overflow_bit) {
          wait_for(b);
        } else {
          for (std::size_t i = last_freers::overflow_bit; i < pl.streams.size(); ++i) wait_for(i);
        }
      }
    } catch (...) {
      return false;
    }
    e.ordered_after = freers;
    return true;
  }

  void free_planned(plan& pl, stream_ref s, std::uintptr_t addr, std::size_t bytes) noexcept {
    plan_entry* e = pl.live_block_at(addr);
    if (e == nullptr || e->requested != bytes) {
      misuse kind = e != nullptr ? misuse::wrong_size : misuse::double_free;
      if (e == nullptr && pl.slots.find(pl.offset_of(addr)) == detail::planned_pool::offset_table::none)
        kind = misuse::foreign_pointer;  // inside the range but where no block ever starts
      report_misuse({kind, name(), reinterpret_cast<void*>(addr), bytes, e != nullptr ? e->requested : 0});
      return;
    }
    pl.mark_free(static_cast<std::uint32_t>(e - pl.entries.data()));
    pl.note_free(e->atom_lo, e->atom_hi, freer_bit(pl, s));
    ledger_.unbook(e->size, bytes);
  }

  /// The last_freers bit of `s`, listed in plan::streams on its first free. None for the
  /// synchronous stream, whose frees anyone may reuse at once; none either where `s` cannot be
  /// listed (no memory for the list): then the free waits for s here, so that nothing is pending.
  static std::uint64_t freer_bit(plan& pl, stream_ref s) noexcept {
    if (s.key() == 0) return 0;
    for (std::size_t i = 0; i < pl.streams.size(); ++i) {
      if (pl.streams[i].key != s.key()) continue;
      if (pl.streams[i].stream.stale(s)) pl.streams[i].stream.refresh(s);
      return last_freers::bit_of(i);
    }
    try {
      pl.streams.push_back({s.key(), detail::stream_pool::freeing_stream(s)});
      return last_freers::bit_of(pl.streams.size() - 1);
    } catch (...) {
    }
    try {
      detail::stream_pool::freeing_stream(s).record().make_wait(stream_ref{});
    } catch (...) {
      report_misuse({misuse::upstream_failure, name(), nullptr, 0, 0});
    }
    return 0;
  }

  void close_served_step() {
    plan& pl = *plan_;
    for (std::size_t i = pl.cursor; i < pl.entries.size(); ++i)  // never requested
      if (pl.entries[i].matched != pl.step) ++pl.off_plan;
    last_off_plan_ = pl.off_plan;
    last_planned_ = pl.served;
    ++steps_served_;
    // Too far off; made from the first step of a loop, whose leftovers (gradients) turn out
    // to cross the boundary; or the recording's leftovers not freed in the step as paired:
    // the next step is recorded again.
    if (too_far_off(pl) || pl.unpaired_freed || (pl.range != 0 && !pl.held)) {
      retire(std::move(plan_), stream_ref{});
      start_recording();
      return;
    }
    // The first served step held the recording's leftovers online, and whatever it allocated
    // before the range was taken: that memory goes back to the upstream.
    if (pl.step == 1) online_.release();
    pl.cursor = 0;
    pl.frontier = 0;
    pl.off_plan = 0;
    pl.served = 0;
    ++pl.step;
    pl.free_cursor = 0;
    pl.in_order_step = true;
    pl.carried = 0;
    for (std::uint32_t i : pl.live) pl.carried += !pl.expected_carry(pl.entries[i]);
  }

  /// Gives the range back now on `s` when no block of the plan is live, else keeps the plan
  /// until its last block is freed.
  void retire(std::unique_ptr<plan> old, stream_ref s) {
    if (old->live.empty()) {
      give_range_back(*old, s);
    } else {
      retired_.push_back(std::move(old));
    }
  }

  /// Frees the range into the online pool on `s`, after every stream that freed planned
  /// blocks (s waits for them: blocking when s is the synchronous stream).
  void give_range_back(plan& pl, stream_ref s) noexcept {
    if (!pl.held && !pl.low_held) return;
    for (const auto& freed : pl.streams) {
      if (freed.key == s.key()) continue;
      try {
        freed.stream.record().make_wait(s);
      } catch (...) {
        report_misuse({misuse::upstream_failure, name(), reinterpret_cast<void*>(pl.base), 0, 0});
      }
    }
    free_parts(pl, s);
  }

  /// Frees the parts of the range that are held into the online pool on `s` (its streams
  /// already waited for).
  void free_parts(plan& pl, stream_ref s) noexcept {
    if (pl.held && pl.range > pl.wall)
      online_.deallocate(s, reinterpret_cast<void*>(pl.base), static_cast<std::size_t>(pl.range - pl.wall), quantum);
    if (pl.low_held) online_.deallocate(s, reinterpret_cast<void*>(pl.low_base), static_cast<std::size_t>(pl.wall), quantum);
    pl.held = pl.low_held = false;
  }

  plan_summary summary_locked() const {
    plan_summary out;
    out.now = phase_;
    out.plans_made = plans_made_;
    out.plans_refused = plans_refused_;
    out.plans_declined = plans_declined_;
    out.steps_served = steps_served_;
    out.last_step_off_plan = last_off_plan_;
    out.last_step_planned = last_planned_;
    if (plan_ && phase_ == plan_summary::phase::serving) {
      out.entries = plan_->entries.size();
      out.planned_entries = plan_->planned_entries;
      out.range_bytes = plan_->range;
      out.lower_part_bytes = plan_->wall;
      out.lower_bound_bytes = plan_->lower_bound;
      out.planning_time = plan_->planning_time;
      out.orders_tried = plan_->orders_tried;
    }
    return out;
  }

  planned_pool_options options_;
  mutable detail::stream_pool::heap_mutex mutex_;  // guards everything below; taken before the online pool's locks
  stream_pool<Upstream> online_;
  plan_summary::phase phase_ = plan_summary::phase::online;
  std::vector<recorded_allocation> recording_;
  std::unordered_map<std::uintptr_t, std::size_t> recorded_live_;  // recording_ index of each recorded live block
  std::vector<carried_in_free> carried_in_;                        // frees in the recording of blocks from before it
  std::uint32_t ticks_ = 0;                                        // events of the step being recorded
  std::uint64_t recording_peak_ = 0;                               // live bytes at their highest since the recording began
  std::unique_ptr<plan> plan_;                                     // while serving
  std::vector<std::unique_ptr<plan>> retired_;                     // earlier plans with blocks still live
  detail::stream_pool::ledger ledger_;
  std::size_t marks_online_ = 0, next_backoff_ = 1;  // after a declined plan (take_part)
  std::size_t plans_made_ = 0, plans_refused_ = 0, plans_declined_ = 0, steps_served_ = 0, last_off_plan_ = 0, last_planned_ = 0;
};

static_assert(resource<planned_pool<host_source>>);
static_assert(resource_with<planned_pool<host_source>, host_accessible>);
static_assert(has_try_allocate<planned_pool<host_source>> && has_release<planned_pool<host_source>> &&
              has_stats<planned_pool<host_source>> && has_owns<planned_pool<host_source>> &&
              has_check_invariants<planned_pool<host_source>> && has_free_blocks<planned_pool<host_source>>);

}  // namespace vram

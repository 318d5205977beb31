#pragma once
// vram::fault_injection_adaptor<Upstream>: fault injection for tests — an adaptor that makes chosen
// upstream allocations fail with vram::out_of_memory, so code built on vram (ours and
// users') can be proven to survive every failure point of a workload.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <iterator>
#include <map>
#include <utility>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/throw.hpp>
#include <vram/source/host_source.hpp>  // for the static_assert below

namespace vram {

/// When a fault_injection_adaptor fails. The modes combine: a call fails when any of them says so.
struct fault_plan {
  /// Fail the Nth allocation call (1-based, counted since the plan was set); 0: never.
  std::size_t fail_call = 0;
  /// With fail_call: fail every call from the Nth on (the upstream "stays full"), not only the Nth.
  bool sticky = false;
  /// Fail each allocation call with this probability, drawn from `seed` (deterministic).
  double probability = 0.0;
  std::uint64_t seed = 1;
  /// Fail any call that would take the bytes live through this source above this budget.
  std::size_t byte_budget = ~std::size_t{0};
};

/// Wraps any resource and injects allocation failures following a fault_plan.
///
/// Purpose: a test utility (public, so users can test their own code with it). Put it under
/// the allocator being tested — `stream_pool<fault_injection_adaptor<recording_resource<host_source>>>`
/// — and place a fault at every upstream call of a workload.
/// Failures: an injected failure throws vram::out_of_memory naming "fault_injection_adaptor", before the
/// upstream is touched; zero-byte requests and invalid arguments are never counted as calls
/// (they are forwarded as they are, so the upstream decides). Deallocation never fails.
/// Counting: allocations() counts every non-zero allocation call (failed ones included),
/// failures() the injected failures, live_bytes() the bytes live through this source (each
/// live range is recorded, so a misused free — foreign pointer, double free, wrong size —
/// changes no count here and is passed on for the upstream to report). Over a contiguous
/// upstream (contiguous() true), a free may name any piece of live memory, across ranges
/// handed out separately (a pool that grew in place and merged them gives them back so):
/// the piece is un-charged when every byte of it is live here; otherwise a free must name
/// exactly one range it handed out. A free is un-charged after the upstream has the memory
/// back, so the byte budget holds at every instant.
/// Thread safety: all members may be called concurrently (one small mutex, taken twice per
/// allocation and once per free; the plan, the counters and the table are shared by copies).
/// Streams, alignment, properties: those of the upstream, which is held by value and owned;
/// contiguous() / granularity() are forwarded when the upstream has them (pools grow in place).
/// Complexity: O(log n) in the live ranges (an ordered map; a free over a contiguous
/// upstream also walks the ranges it covers) plus the upstream's.
template <class Upstream>
  requires resource<Upstream>
class fault_injection_adaptor : public forward_properties<fault_injection_adaptor<Upstream>, Upstream> {
 public:
  explicit fault_injection_adaptor(Upstream upstream = Upstream{}, fault_plan plan = {})
      : upstream_(std::move(upstream)), state_(std::make_shared<state>()) {
    set_plan(plan);
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "fault_injection_adaptor"; }

  /// Replaces the plan and restarts the call count (so fail_call counts from here).
  void set_plan(fault_plan plan) {
    std::lock_guard lock(state_->mutex);
    state_->plan = plan;
    state_->calls_since_plan = 0;
    state_->random = plan.seed == 0 ? 0x9e3779b97f4a7c15ull : plan.seed;
  }
  /// No more faults: every call goes to the upstream.
  void clear() { set_plan({}); }
  [[nodiscard]] fault_plan plan() const {
    std::lock_guard lock(state_->mutex);
    return state_->plan;
  }

  /// Allocation calls with a non-zero size, failed ones included, since construction.
  [[nodiscard]] std::size_t allocations() const noexcept { return state_->allocations.load(); }
  /// Injected failures since construction.
  [[nodiscard]] std::size_t failures() const noexcept { return state_->failures.load(); }
  /// Bytes allocated through this source and not yet deallocated.
  [[nodiscard]] std::size_t live_bytes() const noexcept { return state_->live_bytes.load(); }

  /// Throws out_of_memory when the plan says so, else the upstream's allocate.
  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    if (!counts(bytes, align)) return upstream_.allocate(s, bytes, align);
    admit(s, bytes);
    return commit(bytes, align, [&] { return upstream_.allocate(s, bytes, align); });
  }
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    std::size_t charged = forget(p, bytes);
    upstream_.deallocate(s, p, bytes, align);
    state_->live_bytes.fetch_sub(charged);  // after the upstream has it: the budget holds at every instant
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    if (!counts(bytes, align)) return upstream_.allocate_sync(bytes, align);
    admit(stream_ref{}, bytes);
    return commit(bytes, align, [&] { return upstream_.allocate_sync(bytes, align); });
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    std::size_t charged = forget(p, bytes);
    upstream_.deallocate_sync(p, bytes, align);
    state_->live_bytes.fetch_sub(charged);
  }

  [[nodiscard]] bool contiguous() const noexcept
    requires has_contiguous_growth<Upstream>
  { return upstream_.contiguous(); }
  [[nodiscard]] std::size_t granularity() const noexcept
    requires has_contiguous_growth<Upstream>
  { return upstream_.granularity(); }
  [[nodiscard]] vram::stats stats() const
    requires has_stats<Upstream>
  { return upstream_.stats(); }
  [[nodiscard]] bool owns(const void* p) const
    requires has_owns<Upstream>
  { return upstream_.owns(p); }

  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }

  friend bool operator==(const fault_injection_adaptor& a, const fault_injection_adaptor& b) {
    return a.state_ == b.state_ && a.upstream_ == b.upstream_;
  }

 private:
  struct state {
    std::mutex mutex;  // guards plan, calls_since_plan, random, live, charged
    fault_plan plan;
    std::size_t calls_since_plan = 0;
    std::uint64_t random = 1;
    // live_bytes == sum of live's sizes + bytes of calls admitted and not yet recorded + bytes
    // of frees removed from `live` whose upstream call has not returned;
    // live: disjoint ranges, address -> size
    std::map<std::uintptr_t, std::size_t> live;
    std::atomic<std::size_t> allocations{0}, failures{0}, live_bytes{0};
  };

  /// Removes memory given back from the live ranges and returns the bytes to un-charge (once
  /// the upstream has them back). A pointer or size this source did not hand out changes
  /// nothing here and returns 0 (the upstream reports the misuse).
  std::size_t forget(void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return 0;
    std::lock_guard lock(state_->mutex);
    auto& live = state_->live;
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    if (auto it = live.find(addr); it != live.end() && it->second == bytes) {
      live.erase(it);
      return bytes;
    }
    if (!upstream_contiguous() || bytes == 0 || addr + bytes < addr) return 0;
    return forget_piece(addr, addr + bytes);
  }

  /// Over a contiguous upstream: removes [from, to) if every byte of it is live here, cutting
  /// the ranges it begins and ends in; returns its size, or 0. Pre: mutex held.
  std::size_t forget_piece(std::uintptr_t from, std::uintptr_t to) noexcept {
    auto& live = state_->live;
    auto first = live.upper_bound(from);
    if (first == live.begin()) return 0;
    --first;  // the range that holds `from`, if any
    auto last = first;
    for (std::uintptr_t at = from;;) {  // the ranges must tile [from, to) without a hole
      if (last == live.end() || last->first > at || last->first + last->second <= at) return 0;
      at = last->first + last->second;
      if (at >= to) break;
      ++last;
    }
    const std::uintptr_t head_start = first->first, tail_end = last->first + last->second;
    if (head_start < from && tail_end > to && first == last) {
      // A piece strictly inside one range: the range keeps its head, and its tail needs a new
      // entry; without memory for it the free is not un-charged (counts stay as they were).
      try {
        live.emplace(to, tail_end - to);
      } catch (...) {
        return 0;
      }
      first->second = from - head_start;
    } else {
      const bool one_range = first == last;
      auto erase_to = std::next(last);
      if (tail_end > to) {  // the last range keeps its tail: re-key its node (no allocation)
        auto node = live.extract(last);
        node.key() = to;
        node.mapped() = tail_end - to;
        erase_to = live.insert(std::move(node)).position;
      }
      auto erase_from = first;
      if (one_range && tail_end > to) {
        erase_from = erase_to;  // that range was `first` (and keeps no head: head_start == from)
      } else if (head_start < from) {  // the first range keeps its head
        first->second = from - head_start;
        erase_from = std::next(first);
      }
      live.erase(erase_from, erase_to);
    }
    return to - from;
  }

  bool upstream_contiguous() const noexcept {
    if constexpr (has_contiguous_growth<Upstream>) return upstream_.contiguous();
    else return false;
  }

  /// A call the plan applies to: valid and non-empty (the rest is the upstream's business).
  static bool counts(std::size_t bytes, std::size_t align) noexcept {
    return bytes != 0 && bytes <= max_request_bytes && is_valid_alignment(align);
  }

  /// Counts the call and throws when the plan fails it. The byte budget is charged here
  /// (under the lock), so concurrent callers cannot pass it together.
  void admit(stream_ref s, std::size_t bytes) {
    std::unique_lock lock(state_->mutex);
    state_->allocations.fetch_add(1);
    std::size_t n = ++state_->calls_since_plan;
    const fault_plan& plan = state_->plan;
    bool fail = plan.fail_call != 0 && (n == plan.fail_call || (plan.sticky && n > plan.fail_call));
    if (plan.probability > 0.0) fail |= next_unit() < plan.probability;
    std::size_t live = state_->live_bytes.load();
    fail |= live > plan.byte_budget || bytes > plan.byte_budget - live;
    if (fail) {
      state_->failures.fetch_add(1);
      lock.unlock();
      detail::throw_out_of_memory(name(), bytes, s);
    }
    state_->live_bytes.fetch_add(bytes);
  }

  /// Calls the upstream and records the block; un-charges the bytes when that fails.
  template <class F>
  void* commit(std::size_t bytes, std::size_t align, F&& f) {
    void* p = nullptr;
    try {
      p = f();
      if (p == nullptr) {
        state_->live_bytes.fetch_sub(bytes);
        return p;
      }
      std::lock_guard lock(state_->mutex);
      state_->live.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
    } catch (...) {
      if (p != nullptr) upstream_.deallocate_sync(p, bytes, align);  // the table could not grow: give it back
      state_->live_bytes.fetch_sub(bytes);
      throw;
    }
    return p;
  }

  /// A uniform number in [0, 1) from splitmix64 (pre: mutex held).
  double next_unit() noexcept {
    std::uint64_t z = (state_->random += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

  [[no_unique_address]] Upstream upstream_;
  std::shared_ptr<state> state_;
};

static_assert(resource_with<fault_injection_adaptor<host_source>, host_accessible>);

}  // namespace vram

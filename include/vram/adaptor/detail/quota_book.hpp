#pragma once
// The books a quota_adaptor keeps its limits and usage in. The adaptor does everything else
// (argument checks, per-pointer records, statistics, the observer, errors, soft-limit
// callbacks); a book only answers "may t have b more bytes?" and counts.
//
//   local_book    in this process: a tenant_registry and one cache line of atomics per tenant
//   ledger_book   across processes: a vram::quota_ledger in shared memory (ledger_quota_adaptor.hpp)
//
// A book provides:
//   using argument = ...;  explicit Book(argument)   (what the adaptor's constructor takes)
//   tenant default_tenant() const                    (the tenant of a request that names none)
//   bool contains(tenant) const;  const char* name(tenant) const
//   charge_result charge(tenant t, std::size_t b)    (b on t and every ancestor, or on none)
//   void uncharge(tenant t, std::size_t b) noexcept
//   template <class F> void for_each_level(tenant t, F f)   (f(level) for t, then its ancestors)
//   hard/soft limits (get, set), usage, peak_usage, refusals
//   void check(const std::vector<std::size_t>& own) const  (own[t]: the adaptor's live bytes for t)

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include <vram/core/tenant.hpp>
#include <vram/core/throw.hpp>
#include <vram/adaptor/detail/charge_result.hpp>

namespace vram::detail::adaptor {

/// Limits and usage inside one process, for the tenants of a tenant_registry.
///
/// Each level reserves with a compare-and-swap loop that refuses to pass its hard limit;
/// a refusal rolls back the levels already reserved. So usage never exceeds a hard limit,
/// not even transiently; others may briefly see a refused request's reservation and be
/// refused conservatively, never the reverse.
class local_book {
 public:
  using argument = std::shared_ptr<const tenant_registry>;
  /// quota_adaptor may reserve ahead for its threads (reserve, chain, raise_peaks, soft_limited).
  static constexpr bool lends_credit = true;
  static constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();

  explicit local_book(argument registry) : registry_(std::move(registry)) {
    if (!registry_) throw_invalid_argument("quota_adaptor", "null tenant registry");
  }

  [[nodiscard]] tenant default_tenant() const noexcept { return current_tenant(); }
  [[nodiscard]] bool contains(tenant t) const noexcept { return registry_->contains(t); }
  [[nodiscard]] const char* name(tenant t) const noexcept { return registry_->name(t); }
  [[nodiscard]] const tenant_registry& registry() const noexcept { return *registry_; }

  /// Charges `bytes` on t and every ancestor, or on none: the request's own charge (raises
  /// the peaks, notes soft crossings, counts a refusal when `count_refusal`).
  charge_result charge(tenant t, std::size_t bytes, bool count_refusal = true) noexcept {
    return reserve_levels<true>(t, bytes, count_refusal);
  }

  /// Reserves `bytes` on t and every ancestor, or on none, for credit a thread will spend
  /// later (quota_adaptor): no peak, soft crossing or refusal is recorded for it.
  bool reserve(tenant t, std::size_t bytes) noexcept { return reserve_levels<false>(t, bytes, false).granted; }

  /// True when t or an ancestor has a soft limit (its crossings must be seen per request).
  [[nodiscard]] bool soft_limited(tenant t) const noexcept {
    bool any = false;
    for_each_level(t, [&](tenant level) { any = any || levels_[level.id].soft.load(std::memory_order_relaxed) != unlimited; });
    return any;
  }

  /// Writes the ids of t and its ancestors, t first, into `ids` and returns how many; 0 when
  /// the chain is longer than `capacity`.
  std::size_t chain(tenant t, std::uint32_t* ids, std::size_t capacity) const noexcept {
    std::size_t n = 0;
    for_each_level(t, [&](tenant level) {
      if (n < capacity) ids[n] = level.id;
      ++n;
    });
    return n <= capacity ? n : 0;
  }

  /// Raises the peak of each of the n levels in `ids` (a chain from chain()) to its usage less
  /// `unspent`, the credit reserved on that chain that no request holds yet.
  void raise_peaks(const std::uint32_t* ids, std::size_t n, std::size_t unspent) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      level_t& q = levels_[ids[i]];
      raise(q.peak, q.usage.load(std::memory_order_relaxed) - unspent);
    }
  }

  void uncharge(tenant t, std::size_t bytes) noexcept { unreserve(t, ~std::size_t{0}, bytes); }

  template <class F>
  void for_each_level(tenant t, F&& f) const {
    for (;;) {
      f(t);
      if (!registry_->parent(t, t)) return;
    }
  }

  void set_hard_limit(tenant t, std::size_t bytes) noexcept { levels_[t.id].hard.store(bytes, std::memory_order_relaxed); }
  void set_soft_limit(tenant t, std::size_t bytes) noexcept { levels_[t.id].soft.store(bytes, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t hard_limit(tenant t) const noexcept { return levels_[t.id].hard.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t soft_limit(tenant t) const noexcept { return levels_[t.id].soft.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t usage(tenant t) const noexcept { return levels_[t.id].usage.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t peak_usage(tenant t) const noexcept { return levels_[t.id].peak.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t refusals(tenant t) const noexcept { return levels_[t.id].refusals.load(std::memory_order_relaxed); }

  /// usage(t) == own(t) + the usage of t's children, for every tenant (exact when quiescent).
  void check(const std::vector<std::size_t>& own) const {
    const std::size_t n = registry_->size();
    std::vector<std::size_t> expected(n, 0);
    for (std::size_t i = 0; i < n && i < own.size(); ++i) expected[i] = own[i];
    for (std::size_t i = n; i-- > 1;) {  // parents have smaller ids: carry each subtree up
      tenant p;
      if (registry_->parent(tenant{static_cast<std::uint32_t>(i)}, p)) expected[p.id] += expected[i];
    }
    for (std::size_t i = 0; i < n; ++i)
      if (expected[i] != levels_[i].usage.load()) throw std::logic_error("quota_adaptor: usage != own + children");
  }

 private:
  // One cache line per tenant. usage <= hard whenever hard was not lowered below it; usage <= peak.
  struct alignas(64) level_t {
    std::atomic<std::size_t> usage{0};
    std::atomic<std::size_t> peak{0};
    std::atomic<std::size_t> hard{unlimited};
    std::atomic<std::size_t> soft{unlimited};
    std::atomic<std::size_t> refusals{0};
  };

  static void raise(std::atomic<std::size_t>& peak, std::size_t v) noexcept {
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }
  template <bool Request>
  charge_result reserve_levels(tenant t, std::size_t bytes, bool count_refusal) noexcept {
    std::uint64_t crossed = 0;
    std::size_t i = 0;
    for (tenant at = t;; ++i) {
      level_t& q = levels_[at.id];
      std::size_t cur = q.usage.load(std::memory_order_relaxed);
      for (;;) {
        std::size_t limit = q.hard.load(std::memory_order_relaxed);
        if (cur > limit || bytes > limit - cur) [[unlikely]] {
          unreserve(t, i, bytes);
          if (count_refusal) q.refusals.fetch_add(1, std::memory_order_relaxed);
          return {false, 0, at, limit, cur};
        }
        if (q.usage.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed)) break;
      }
      if constexpr (Request) {
        raise(q.peak, cur + bytes);
        std::size_t soft = q.soft.load(std::memory_order_relaxed);
        if (i < 64 && cur <= soft && cur + bytes > soft) crossed |= std::uint64_t{1} << i;
      }
      if (!registry_->parent(at, at)) break;
    }
    return {true, crossed, t, 0, 0};
  }

  /// Gives back `bytes` on the first n levels of t's chain.
  void unreserve(tenant t, std::size_t n, std::size_t bytes) noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      levels_[t.id].usage.fetch_sub(bytes, std::memory_order_relaxed);
      if (!registry_->parent(t, t)) return;
    }
  }

  argument registry_;
  std::array<level_t, max_tenants> levels_{};
};

}  // namespace vram::detail::adaptor

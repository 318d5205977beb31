#pragma once
// Lock-free allocation counters shared by statistics_adaptor (and usable as an observer).
// Relaxed atomics: each counter is exact on its own; a snapshot taken while other threads
// allocate is a mix of moments (as any concurrent statistic is).

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include <vram/core/stats.hpp>
#include <vram/core/tenant.hpp>

namespace vram {

/// What statistics_adaptor knows about one tenant. live_bytes is signed: a tenant that frees
/// memory another tenant allocated goes negative instead of wrapping (see statistics_adaptor).
struct tenant_stats {
  std::int64_t live_bytes = 0;
  std::int64_t peak_live_bytes = 0;
  std::size_t allocations = 0;
  std::size_t deallocations = 0;
  [[nodiscard]] std::size_t live_allocations() const noexcept { return allocations - deallocations; }
};

namespace detail {

inline void raise_to(std::atomic<std::int64_t>& peak, std::int64_t v) noexcept {
  std::int64_t p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

class adaptor_counters {
 public:
  // Per tenant, one cache line each so tenants on different threads do not share lines.
  // Invariant (at rest): live_ == sum over tenants of live_bytes
  //                      total allocations == sum of allocations, likewise deallocations.
  struct alignas(64) per_tenant {
    std::atomic<std::int64_t> live_bytes{0};
    std::atomic<std::int64_t> peak_live_bytes{0};
    std::atomic<std::size_t> allocations{0};
    std::atomic<std::size_t> deallocations{0};
  };

  void on_allocate(tenant t, std::size_t bytes) noexcept {
    auto& c = slot(t);
    std::int64_t b = static_cast<std::int64_t>(bytes);
    raise_to(peak_, live_.fetch_add(b, std::memory_order_relaxed) + b);
    raise_to(c.peak_live_bytes, c.live_bytes.fetch_add(b, std::memory_order_relaxed) + b);
    c.allocations.fetch_add(1, std::memory_order_relaxed);
  }

  void on_deallocate(tenant t, std::size_t bytes) noexcept {
    auto& c = slot(t);
    std::int64_t b = static_cast<std::int64_t>(bytes);
    live_.fetch_sub(b, std::memory_order_relaxed);
    c.live_bytes.fetch_sub(b, std::memory_order_relaxed);
    c.deallocations.fetch_add(1, std::memory_order_relaxed);
  }

  void on_out_of_memory() noexcept { ooms_.fetch_add(1, std::memory_order_relaxed); }

  [[nodiscard]] tenant_stats of(tenant t) const noexcept {
    const auto& c = slot(t);
    return {c.live_bytes.load(std::memory_order_relaxed), c.peak_live_bytes.load(std::memory_order_relaxed),
            c.allocations.load(std::memory_order_relaxed), c.deallocations.load(std::memory_order_relaxed)};
  }

  /// Request-level totals: live/requested bytes, their peaks, counts, OOMs.
  [[nodiscard]] vram::stats totals() const noexcept {
    vram::stats s;
    std::int64_t live = live_.load(std::memory_order_relaxed);
    s.live_bytes = s.requested_bytes = live > 0 ? static_cast<std::size_t>(live) : 0;
    s.peak_live_bytes = s.peak_requested_bytes = static_cast<std::size_t>(peak_.load(std::memory_order_relaxed));
    for (const auto& c : tenants_) {
      s.total_allocations += c.allocations.load(std::memory_order_relaxed);
      s.total_deallocations += c.deallocations.load(std::memory_order_relaxed);
    }
    s.live_allocations = s.total_allocations - s.total_deallocations;
    s.ooms = ooms_.load(std::memory_order_relaxed);
    return s;
  }

  /// Sets every peak to the current value (for per-step peaks).
  void reset_peaks() noexcept {
    peak_.store(live_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    for (auto& c : tenants_) c.peak_live_bytes.store(c.live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }

  /// Verifies the sums above; only meaningful when no other thread is allocating.
  [[nodiscard]] bool consistent() const noexcept {
    std::int64_t sum = 0;
    for (const auto& c : tenants_) sum += c.live_bytes.load(std::memory_order_relaxed);
    return sum == live_.load(std::memory_order_relaxed) && peak_.load(std::memory_order_relaxed) >= live_.load(std::memory_order_relaxed);
  }

 private:
  // Ids beyond the table (a foreign registry) are counted on the default tenant.
  per_tenant& slot(tenant t) noexcept { return tenants_[t.id < max_tenants ? t.id : 0]; }
  const per_tenant& slot(tenant t) const noexcept { return tenants_[t.id < max_tenants ? t.id : 0]; }

  alignas(64) std::atomic<std::int64_t> live_{0};  // live_ <= peak_
  std::atomic<std::int64_t> peak_{0};
  std::atomic<std::size_t> ooms_{0};
  std::array<per_tenant, max_tenants> tenants_{};
};

}  // namespace detail
}  // namespace vram

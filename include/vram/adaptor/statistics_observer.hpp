#pragma once
// vram::statistics_observer: statistics_adaptor's counters as an allocator Observer, for
// counting inside an allocator (stream_pool<Upstream, statistics_observer>) instead of around it.

#include <atomic>
#include <cstddef>
#include <memory>

#include <vram/core/observer.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/tenant.hpp>
#include <vram/adaptor/detail/counters.hpp>

namespace vram {

/// Counts what an allocator reports: live bytes and their peak (as statistics_adaptor defines
/// it across threads), allocations, deallocations and OOMs in total and per tenant (the tenant
/// in scope at each call, as statistics_adaptor),
/// plus the bytes the allocator holds from its upstream (grow minus release) and their peak.
///
/// Copies share the counters, so keep a copy to read them while the allocator owns another:
///   vram::statistics_observer obs;
///   vram::stream_pool<vram::host_source, vram::statistics_observer> pool({}, {}, obs);
///   obs.stats().live_bytes ...
/// Thread safety: every member may be called concurrently. Cost: as statistics_adaptor.
class statistics_observer {
 public:
  statistics_observer() : state_(std::make_shared<state>()) {}

  void on_allocate(const void*, std::size_t bytes, stream_ref) noexcept {
    state_->counters.on_allocate(current_tenant(), bytes);
  }
  void on_deallocate(const void*, std::size_t bytes, stream_ref) noexcept {
    state_->counters.on_deallocate(current_tenant(), bytes);
  }
  void on_grow(const void*, std::size_t bytes) noexcept {
    std::size_t r = state_->reserved.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::size_t peak = state_->peak_reserved.load(std::memory_order_relaxed);
    while (r > peak && !state_->peak_reserved.compare_exchange_weak(peak, r, std::memory_order_relaxed)) {
    }
    state_->grows.fetch_add(1, std::memory_order_relaxed);
  }
  void on_release(const void*, std::size_t bytes) noexcept {
    state_->reserved.fetch_sub(bytes, std::memory_order_relaxed);
    state_->releases.fetch_add(1, std::memory_order_relaxed);
  }
  void on_out_of_memory(std::size_t, stream_ref, const vram::stats&) noexcept { state_->counters.on_out_of_memory(); }

  /// Totals: live/requested bytes and peak, counts, OOMs, reserved bytes and peak, upstream calls.
  [[nodiscard]] vram::stats stats() const noexcept {
    vram::stats s = state_->counters.totals();
    s.reserved_bytes = state_->reserved.load(std::memory_order_relaxed);
    s.peak_reserved_bytes = state_->peak_reserved.load(std::memory_order_relaxed);
    s.upstream_allocations = state_->grows.load(std::memory_order_relaxed);
    s.upstream_deallocations = state_->releases.load(std::memory_order_relaxed);
    return s;
  }
  [[nodiscard]] tenant_stats stats(tenant t) const noexcept { return state_->counters.of(t); }
  void reset_peak() noexcept { state_->counters.reset_peak(); }

 private:
  struct state {
    detail::adaptor::adaptor_counters counters;
    std::atomic<std::size_t> reserved{0}, peak_reserved{0}, grows{0}, releases{0};
  };
  std::shared_ptr<state> state_;
};

static_assert(observer<statistics_observer>);

}  // namespace vram

#pragma once
// Allocation counters for statistics_adaptor, cheap enough for production hot paths.
//
// No atomic read-modify-write on the common path. Each of the first `thread_slots` threads
// owns a shard and updates it with plain relaxed loads and stores (no lock prefix): its
// per-tenant live bytes and counts, and its share of the total live bytes not yet published.
// The total is published to one shared word only when a shard's share reaches
// `publish_batch` or would go below zero (a free of bytes another thread allocated), so a
// loop of allocate/free pairs never writes a shared line. Threads beyond the first
// `thread_slots` share an overflow shard updated with atomic adds, publishing at once.
// Readers sum the shards.
//
// The peak: every allocation compares the published total plus its own shard's share against
// that shard's peak. Each share is never negative, so what an allocation sees is never above
// the true total at that moment; it misses only the other shards' unpublished shares (each
// below publish_batch). So peak_live_bytes is never above the true peak, exact when one
// thread allocates through the counters, and below the true peak by less than
// publish_batch per other thread holding an unpublished share; and never below live_bytes
// (a read takes the larger). Every counter is exact once the writers are quiet; a snapshot
// taken while other threads allocate is a mix of moments.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <vram/core/stats.hpp>
#include <vram/core/tenant.hpp>
#include <vram/detail/thread_slot.hpp>

namespace vram {

namespace detail::adaptor {

/// A shard's unpublished share of the live bytes stays below this (see the top of the file).
inline constexpr std::int64_t publish_batch = std::int64_t{64} << 10;

class adaptor_counters {
 public:
  // on_allocate / on_deallocate are always inlined (with their helpers; publish() stays out
  // of line): GCC had left them out of line, and a pair over a trivial upstream cost 4.4 ns
  // where it costs 3.0 inlined.
  [[gnu::always_inline]] void on_allocate(tenant t, std::size_t bytes) noexcept {
    auto b = static_cast<std::int64_t>(bytes);
    std::size_t s = thread_slot::get_inline();
    shard& sh = shards_[s];
    if (s < thread_slots) [[likely]] {
      std::int64_t share = sh.unpublished.load(std::memory_order_relaxed) + b;
      std::int64_t seen;
      if (share < publish_batch) [[likely]] {
        sh.unpublished.store(share, std::memory_order_relaxed);
        seen = published_.load(std::memory_order_relaxed) + share;
      } else {
        seen = publish(sh, share);
      }
      if (seen > sh.peak.load(std::memory_order_relaxed)) sh.peak.store(seen, std::memory_order_relaxed);
    } else {
      raise(peak_, published_.fetch_add(b, std::memory_order_relaxed) + b);
    }
    auto& c = sh.tenants[index(t)];
    add(s, c.live_bytes, b);
    add(s, c.allocations, 1);
  }

  [[gnu::always_inline]] void on_deallocate(tenant t, std::size_t bytes) noexcept {
    auto b = static_cast<std::int64_t>(bytes);
    std::size_t s = thread_slot::get_inline();
    shard& sh = shards_[s];
    unpublish(s, sh, b);
    auto& c = sh.tenants[index(t)];
    add(s, c.live_bytes, -b);
    add(s, c.deallocations, 1);
  }

  /// Takes back an on_deallocate whose free the upstream refused (misuse): the block is
  /// still live. The peak stays: live was at least this high before the free.
  void undo_deallocate(tenant t, std::size_t bytes) noexcept {
    auto b = static_cast<std::int64_t>(bytes);
    std::size_t s = thread_slot::get_inline();
    shard& sh = shards_[s];
    published_.fetch_add(b, std::memory_order_relaxed);  // rare: published at once
    auto& c = sh.tenants[index(t)];
    add(s, c.live_bytes, b);
    add(s, c.deallocations, -1);
  }

  void on_out_of_memory() noexcept { ooms_.fetch_add(1, std::memory_order_relaxed); }

  [[nodiscard]] tenant_stats of(tenant t) const noexcept {
    tenant_stats r;
    for (const auto& sh : shards_) {
      const auto& c = sh.tenants[index(t)];
      r.live_bytes += c.live_bytes.load(std::memory_order_relaxed);
      r.allocations += static_cast<std::size_t>(c.allocations.load(std::memory_order_relaxed));
      r.deallocations += static_cast<std::size_t>(c.deallocations.load(std::memory_order_relaxed));
    }
    return r;
  }

  /// Request-level totals: live/requested bytes, their peaks, counts, OOMs.
  [[nodiscard]] vram::stats totals() const noexcept {
    vram::stats s;
    std::int64_t live = live_now();
    std::int64_t peak = std::max(peak_.load(std::memory_order_relaxed), live);
    for (const auto& sh : shards_) peak = std::max(peak, sh.peak.load(std::memory_order_relaxed));
    s.live_bytes = s.requested_bytes = live > 0 ? static_cast<std::size_t>(live) : 0;
    s.peak_live_bytes = s.peak_requested_bytes = static_cast<std::size_t>(peak);
    for (const auto& sh : shards_)
      for (const auto& c : sh.tenants) {
        s.total_allocations += static_cast<std::size_t>(c.allocations.load(std::memory_order_relaxed));
        s.total_deallocations += static_cast<std::size_t>(c.deallocations.load(std::memory_order_relaxed));
      }
    s.live_allocations = s.total_allocations - s.total_deallocations;
    s.ooms = ooms_.load(std::memory_order_relaxed);
    return s;
  }

  /// Starts the peak again from the current live bytes (e.g. at each training step). A reset
  /// concurrent with allocations may keep one total an allocation saw just before it.
  void reset_peak() noexcept {
    for (auto& sh : shards_) sh.peak.store(0, std::memory_order_relaxed);
    peak_.store(live_now(), std::memory_order_relaxed);
  }

  /// The published total plus every shard's share == the sum over shards and tenants of
  /// live_bytes, and every share in [0, publish_batch). Only meaningful when no other thread
  /// is allocating.
  [[nodiscard]] bool consistent() const noexcept {
    std::int64_t sum = 0;
    for (const auto& sh : shards_) {
      std::int64_t share = sh.unpublished.load(std::memory_order_relaxed);
      if (share < 0 || share >= publish_batch) return false;
      for (const auto& c : sh.tenants) sum += c.live_bytes.load(std::memory_order_relaxed);
    }
    return sum == live_now();
  }

 private:
  struct per_tenant {
    std::atomic<std::int64_t> live_bytes{0};
    std::atomic<std::int64_t> allocations{0};
    std::atomic<std::int64_t> deallocations{0};
  };
  struct alignas(64) shard {
    std::atomic<std::int64_t> unpublished{0};  // this shard's live bytes not in published_: [0, publish_batch)
    std::atomic<std::int64_t> peak{0};         // the highest total an allocation through this shard saw
    std::array<per_tenant, max_tenants> tenants{};
  };

  // Ids beyond the table (a foreign registry) are counted on the default tenant.
  static std::size_t index(tenant t) noexcept { return t.id < max_tenants ? t.id : 0; }

  // The owner of shard s is its only writer: a plain load + store is exact and costs no lock.
  [[gnu::always_inline]] static void add(std::size_t s, std::atomic<std::int64_t>& c, std::int64_t v) noexcept {
    if (s < thread_slots) [[likely]]
      c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
    else
      c.fetch_add(v, std::memory_order_relaxed);
  }

  static void raise(std::atomic<std::int64_t>& peak, std::int64_t v) noexcept {
    std::int64_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }

  /// Moves the whole share to the published total; returns the total after it. The share is
  /// zeroed before the total grows (the release orders them), so a reader that loads the
  /// total first (acquire) and then the shares never counts these bytes twice.
  [[gnu::noinline]] std::int64_t publish(shard& sh, std::int64_t share) noexcept {
    sh.unpublished.store(0, std::memory_order_relaxed);
    return published_.fetch_add(share, std::memory_order_release) + share;
  }

  /// Takes b off shard s's share; a share that would go negative (bytes allocated through
  /// another shard) is published instead, so that no share is ever negative.
  [[gnu::always_inline]] void unpublish(std::size_t s, shard& sh, std::int64_t b) noexcept {
    if (s < thread_slots) [[likely]] {
      std::int64_t share = sh.unpublished.load(std::memory_order_relaxed) - b;
      if (share >= 0) [[likely]] {
        sh.unpublished.store(share, std::memory_order_relaxed);
        return;
      }
      publish(sh, share);
    } else {
      published_.fetch_sub(b, std::memory_order_relaxed);
    }
  }

  /// The published total plus every share, read in that order (see publish()).
  [[nodiscard]] std::int64_t live_now() const noexcept {
    std::int64_t live = published_.load(std::memory_order_acquire);
    for (const auto& sh : shards_) live += sh.unpublished.load(std::memory_order_relaxed);
    return live;
  }

  alignas(64) std::atomic<std::int64_t> published_{0};  // the live total but the shards' shares
  std::atomic<std::int64_t> peak_{0};  // the overflow shard's peaks and the last reset's total
  std::atomic<std::size_t> ooms_{0};
  std::array<shard, thread_slots + 1> shards_{};
};

}  // namespace detail::adaptor
}  // namespace vram

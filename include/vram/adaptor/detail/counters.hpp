#pragma once
// Allocation counters for statistics_adaptor, cheap enough for production hot paths.
//
// One atomic read-modify-write per operation: the total live bytes, kept in one word so its
// peak is exact. Everything else (per-tenant live bytes, allocation and deallocation counts)
// goes to per-thread shards: each of the first `counter_shards` threads owns a shard and
// updates it with plain relaxed loads and stores (no lock prefix); threads beyond that share
// an overflow shard updated with atomic adds. Readers sum the shards. Every counter is exact
// once the writers are quiet; a snapshot taken while other threads allocate is a mix of moments.

#include <array>
#include <atomic>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include <vram/core/stats.hpp>
#include <vram/core/tenant.hpp>

namespace vram {

namespace detail::adaptor {

/// Threads that get a shard of their own; later threads share the overflow shard.
inline constexpr std::size_t counter_shards = 16;

/// The calling thread's shard in [0, counter_shards], counter_shards being the shared
/// overflow shard. Slots are handed back when a thread exits, so thread churn reuses them.
inline constexpr std::size_t unassigned_counter_slot = ~std::size_t{0};
// A trivially destructible thread_local on the hot path (no init guard). The slot is taken on
// first use and handed back by counter_slot::owner's destructor at thread exit, which also
// moves this thread to the overflow shard for any allocation made later during its exit.
inline thread_local std::size_t counter_slot_index = unassigned_counter_slot;

class counter_slot {
 public:
  static std::size_t get() noexcept {
    std::size_t i = counter_slot_index;
    if (i == unassigned_counter_slot) [[unlikely]] i = counter_slot_index = acquire();
    return i;
  }

 private:
  struct pool {
    std::mutex mutex;
    std::bitset<counter_shards> used;
  };
  static pool& the_pool() noexcept {
    static pool p;
    return p;
  }
  struct owner {
    std::size_t index = counter_shards;
    ~owner() {
      counter_slot_index = counter_shards;
      if (index == counter_shards) return;
      auto& p = the_pool();
      std::lock_guard lock(p.mutex);
      p.used[index] = false;
    }
  };
  [[gnu::noinline]] static std::size_t acquire() noexcept {
    thread_local owner o;
    auto& p = the_pool();
    std::lock_guard lock(p.mutex);
    for (std::size_t i = 0; i < counter_shards; ++i)
      if (!p.used[i]) {
        p.used[i] = true;
        o.index = i;
        return i;
      }
    return counter_shards;
  }
};

class adaptor_counters {
 public:
  void on_allocate(tenant t, std::size_t bytes) noexcept {
    auto b = static_cast<std::int64_t>(bytes);
    std::int64_t live = live_.fetch_add(b, std::memory_order_relaxed) + b;
    std::int64_t peak = peak_.load(std::memory_order_relaxed);
    while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    std::size_t s = counter_slot::get();
    auto& c = shards_[s].tenants[index(t)];
    add(s, c.live_bytes, b);
    add(s, c.allocations, 1);
  }

  void on_deallocate(tenant t, std::size_t bytes) noexcept {
    auto b = static_cast<std::int64_t>(bytes);
    live_.fetch_sub(b, std::memory_order_relaxed);
    std::size_t s = counter_slot::get();
    auto& c = shards_[s].tenants[index(t)];
    add(s, c.live_bytes, -b);
    add(s, c.deallocations, 1);
  }

  /// Takes back an on_deallocate whose free the upstream refused (misuse): the block is
  /// still live. The peak stays: live was at least this high before the free.
  void undo_deallocate(tenant t, std::size_t bytes) noexcept {
    auto b = static_cast<std::int64_t>(bytes);
    live_.fetch_add(b, std::memory_order_relaxed);
    std::size_t s = counter_slot::get();
    auto& c = shards_[s].tenants[index(t)];
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
    std::int64_t live = live_.load(std::memory_order_relaxed);
    s.live_bytes = s.requested_bytes = live > 0 ? static_cast<std::size_t>(live) : 0;
    s.peak_live_bytes = s.peak_requested_bytes = static_cast<std::size_t>(peak_.load(std::memory_order_relaxed));
    for (const auto& sh : shards_)
      for (const auto& c : sh.tenants) {
        s.total_allocations += static_cast<std::size_t>(c.allocations.load(std::memory_order_relaxed));
        s.total_deallocations += static_cast<std::size_t>(c.deallocations.load(std::memory_order_relaxed));
      }
    s.live_allocations = s.total_allocations - s.total_deallocations;
    s.ooms = ooms_.load(std::memory_order_relaxed);
    return s;
  }

  /// Starts the peak again from the current live bytes (e.g. at each training step).
  void reset_peak() noexcept { peak_.store(live_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

  /// live_ == sum over shards and tenants of live_bytes, and peak_ >= live_. Only meaningful
  /// when no other thread is allocating.
  [[nodiscard]] bool consistent() const noexcept {
    std::int64_t sum = 0;
    for (const auto& sh : shards_)
      for (const auto& c : sh.tenants) sum += c.live_bytes.load(std::memory_order_relaxed);
    std::int64_t live = live_.load(std::memory_order_relaxed);
    return sum == live && peak_.load(std::memory_order_relaxed) >= live;
  }

 private:
  struct per_tenant {
    std::atomic<std::int64_t> live_bytes{0};
    std::atomic<std::int64_t> allocations{0};
    std::atomic<std::int64_t> deallocations{0};
  };
  struct alignas(64) shard {
    std::array<per_tenant, max_tenants> tenants{};
  };

  // Ids beyond the table (a foreign registry) are counted on the default tenant.
  static std::size_t index(tenant t) noexcept { return t.id < max_tenants ? t.id : 0; }

  // The owner of shard s is its only writer: a plain load + store is exact and costs no lock.
  static void add(std::size_t s, std::atomic<std::int64_t>& c, std::int64_t v) noexcept {
    if (s < counter_shards) [[likely]]
      c.store(c.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
    else
      c.fetch_add(v, std::memory_order_relaxed);
  }

  alignas(64) std::atomic<std::int64_t> live_{0};  // live_ <= peak_
  std::atomic<std::int64_t> peak_{0};
  std::atomic<std::size_t> ooms_{0};
  std::array<shard, counter_shards + 1> shards_{};
};

}  // namespace detail::adaptor
}  // namespace vram

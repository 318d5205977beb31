#pragma once
// vram::statistics_adaptor<Upstream>: counts what passes through it, per tenant.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>

#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/tenant.hpp>
#include <vram/adaptor/detail/adaptor_base.hpp>
#include <vram/adaptor/detail/counters.hpp>

namespace vram {

/// Counts live bytes, their peak, allocations, deallocations and OOMs of everything allocated
/// through it, in total and per tenant. Cheap enough to leave on in production: no atomic
/// read-modify-write on the common path. Each thread (the first 16; later ones share one
/// shard updated with atomic adds) writes its own shard of counters with plain stores; a shard publishes its
/// share of the total live bytes to one shared word only every 64 KiB of net growth or when a
/// free would take its share below zero (docs/PERFORMANCE.md, "Adaptor overhead": 0.3 ns per
/// pair over a trivial upstream, 2 over a stream_pool). The counters take about 100 KiB
/// (17 shards x 256 tenants x 24 bytes).
///
/// What the figures mean across threads: current figures (live bytes, counts, per tenant) are
/// exact whenever no other thread is in the middle of an operation. peak_live_bytes is the
/// highest total any allocation saw, and never below live_bytes: never above the true peak,
/// exact when one thread allocates, and otherwise below it by less than 64 KiB per other
/// thread that allocated through the adaptor (the bytes such a thread has not yet published).
///
/// Tenants: an allocation counts for the explicit tenant argument, else vram::current_tenant().
/// A deallocation counts for the tenant in effect at the free (explicit or current scope):
/// nothing is recorded per pointer, which is what keeps this adaptor cheap. Code that frees
/// under another tenant than it allocated sees that tenant's live_bytes move (it is signed);
/// quota_adaptor and tracker_adaptor record the tenant per pointer instead.
/// Thread safety: as the upstream; the counters themselves are thread-safe.
/// Streams, alignment: those of the upstream (forwarded unchanged).
/// Upstream: held by value. Copies share the counters and compare equal when the upstreams do.
/// Misuse: a free the upstream refuses (it reports the misuse through the error handler: a
/// foreign pointer, a double free, a wrong size) leaves the counters as they were; every vram
/// resource reports so. An upstream that frees foreign pointers silently gets them counted.
/// Capabilities: those of adaptor_base (release, owns, try_allocate, check_invariants pass
/// through); stats() adds the upstream's (reserved bytes, free blocks) to the counters here.
/// Complexity: O(1) per operation; stats() is O(shards x max_tenants).
template <class Upstream>
class statistics_adaptor : public detail::adaptor::adaptor_base<statistics_adaptor<Upstream>, Upstream> {
  using base = detail::adaptor::adaptor_base<statistics_adaptor<Upstream>, Upstream>;
  using base::upstream_;

 public:
  explicit statistics_adaptor(Upstream upstream = Upstream{})
      : base(std::move(upstream)), counters_(std::make_shared<detail::adaptor::adaptor_counters>()) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "statistics_adaptor"; }

  // The resource's calls are always inlined, so that the upstream's own inline path (a
  // pool's bin path) stays in the caller: GCC calls them out of line otherwise, and the
  // calls cost a pair over a stream_pool more than the counters do (docs/observability.md).
  [[gnu::always_inline]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(s, bytes, align, current_tenant());
  }
  /// Allocates for tenant `t` (overriding the current tenant_scope).
  [[gnu::always_inline]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align, tenant t) {
    void* p;
    try {
      p = upstream_.allocate(s, bytes, align);
    } catch (const out_of_memory&) {
      counters_->on_out_of_memory();
      throw;
    }
    if (p != nullptr) counters_->on_allocate(t, bytes);
    return p;
  }
  [[gnu::always_inline]] void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(s, p, bytes, align, current_tenant());
  }
  [[gnu::always_inline]] void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align, tenant t) noexcept {
    if (p == nullptr) return;
    // Counted before the upstream frees, so a thread that gets the same memory next cannot
    // count it first (a false peak); taken back if the upstream refuses the free (it reports
    // the misuse on this thread: a foreign pointer, a double free, a wrong size). No owns()
    // query: over a pool that would cost a lock per free.
    counters_->on_deallocate(t, bytes);
    std::uint64_t reports = detail::misuse_reports_on_this_thread();
    upstream_.deallocate(s, p, bytes, align);
    if (detail::misuse_reports_on_this_thread() != reports) [[unlikely]]
      counters_->undo_deallocate(t, bytes);
  }

  [[gnu::always_inline]] void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align, current_tenant());
  }
  [[gnu::always_inline]] void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align, current_tenant());
  }

  /// Totals. Where the upstream has stats(), its reserved/free/upstream fields are kept and
  /// the request-level fields (requested bytes, counts, OOMs) are this adaptor's; otherwise
  /// live_bytes is the requested bytes.
  [[nodiscard]] vram::stats stats() const {
    vram::stats ours = counters_->totals();
    if constexpr (has_stats<Upstream>) {
      vram::stats s = upstream_.stats();
      s.requested_bytes = ours.requested_bytes;
      s.peak_requested_bytes = ours.peak_requested_bytes;
      s.live_allocations = ours.live_allocations;
      s.total_allocations = ours.total_allocations;
      s.total_deallocations = ours.total_deallocations;
      s.ooms = ours.ooms;
      return s;
    } else {
      return ours;
    }
  }

  /// One tenant's counters (the tenant alone; children are separate tenants).
  [[nodiscard]] tenant_stats stats(tenant t) const noexcept { return counters_->of(t); }

  /// Starts the peak again from the current live bytes (e.g. at the start of each step).
  void reset_peak() noexcept { counters_->reset_peak(); }

  /// Verifies its own records, then the upstream's: per-tenant live bytes sum to the total and
  /// every shard's unpublished share is in range (under VRAM_DEBUG). Exact when no other
  /// thread is allocating through the adaptor: the counters are per-thread shards written
  /// without a lock.
  void check_invariants() const {
#if VRAM_DEBUG
    if (!counters_->consistent()) throw std::logic_error("statistics_adaptor: per-tenant live bytes do not sum to the total");
#endif
    this->check_upstream_invariants();
  }

  friend bool operator==(const statistics_adaptor& a, const statistics_adaptor& b) {
    return a.counters_ == b.counters_ && a.upstream_ == b.upstream_;
  }

 private:
  std::shared_ptr<detail::adaptor::adaptor_counters> counters_;
};

}  // namespace vram

#include <vram/source/host_source.hpp>
static_assert(vram::resource<vram::statistics_adaptor<vram::host_source>>);

#pragma once
// vram::quota_adaptor<Upstream, Observer>: per-tenant hard and soft memory limits over any
// upstream, with hierarchical tenants (a tenant's usage counts against every ancestor).

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/observer.hpp>
#include <vram/core/tenant.hpp>
#include <vram/adaptor/detail/adaptor_base.hpp>
#include <vram/adaptor/detail/pointer_map.hpp>
#include <vram/detail/throw.hpp>
#include <vram/detail/throw.hpp>

namespace vram {

/// Called once per upward crossing of a soft limit: usage went from <= soft_limit to above it.
/// Runs on the allocating thread, after the allocation succeeded, outside every lock; an
/// exception it throws is swallowed (the allocation stands).
using soft_limit_callback = std::function<void(tenant t, std::size_t soft_limit, std::size_t usage)>;

/// Enforces per-tenant memory limits.
///
/// Accounting: usage(t) is the sum of the requested bytes of t's live allocations and of all
/// its descendants'. A request of b bytes for tenant t first reserves b on t and on every
/// ancestor, each with a compare-and-swap loop that refuses to pass that tenant's hard limit;
/// only when every level accepted is the upstream called. A refusal (or an upstream failure)
/// rolls back the levels already reserved and throws vram::quota_exceeded (or the upstream's
/// error). So usage never exceeds a hard limit, not even transiently, and a refused request
/// leaves every counter as it was (others may briefly see its reservation and be refused
/// conservatively — never the reverse).
/// Soft limits: the callback runs once per upward crossing (see soft_limit_callback).
/// Limits may be changed at any time; a hard limit lowered below usage refuses new requests
/// until frees bring usage under it (frees always succeed).
/// Tenants: the explicit tenant argument, else vram::current_tenant(); the tenant is recorded
/// per pointer, so deallocation needs no tenant and may happen on any thread or scope.
/// Misuse: freeing a pointer not live here, or with another size, is reported (error handler)
/// and changes nothing (the upstream is not called).
/// Thread safety: fully thread-safe if the upstream is; the per-pointer table is sharded.
/// Streams, alignment: those of the upstream. Usage drops when deallocate is called, not when
/// the stream later reaches the free.
/// Upstream: held by value; copies share limits and usage. Observer: told of every successful
/// allocation (after usage was reserved), every deallocation and every refusal.
/// Capabilities: owns() from its records; release, try_allocate (a refusal gives nullptr) and
/// the upstream's check_invariants pass through (adaptor_base); stats() adds the upstream's.
/// Complexity: O(depth of the tenant) atomics + one sharded hash-map update per operation.
template <class Upstream, class Observer = no_observer>
class quota_adaptor : public detail::adaptor::adaptor_base<quota_adaptor<Upstream, Observer>, Upstream> {
  using base = detail::adaptor::adaptor_base<quota_adaptor<Upstream, Observer>, Upstream>;
  using base::upstream_;

 public:
  static constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();

  explicit quota_adaptor(Upstream upstream = Upstream{},
                         std::shared_ptr<const tenant_registry> registry = tenant_registry::global(),
                         Observer observer = Observer{})
      : base(std::move(upstream)), observer_(std::move(observer)),
        state_(std::make_shared<state>(std::move(registry))) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "quota_adaptor"; }

  // ---- limits -------------------------------------------------------------------------

  /// Sets t's hard limit (unlimited to remove it). Throws invalid_argument for an unknown tenant.
  void set_hard_limit(tenant t, std::size_t bytes) { level(checked(t)).hard.store(bytes, std::memory_order_relaxed); }
  /// Sets t's soft limit (unlimited to remove it).
  void set_soft_limit(tenant t, std::size_t bytes) { level(checked(t)).soft.store(bytes, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t hard_limit(tenant t) const { return level(checked(t)).hard.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t soft_limit(tenant t) const { return level(checked(t)).soft.load(std::memory_order_relaxed); }
  /// Installs the soft-limit callback (replacing any previous one; empty to remove).
  void set_soft_limit_callback(soft_limit_callback cb) {
    std::lock_guard lock(state_->callback_mutex);
    state_->callback = std::move(cb);
  }

  /// Bytes held by t and its descendants.
  [[nodiscard]] std::size_t usage(tenant t) const { return level(checked(t)).usage.load(std::memory_order_relaxed); }
  /// Highest usage(t) so far.
  [[nodiscard]] std::size_t peak_usage(tenant t) const { return level(checked(t)).peak.load(std::memory_order_relaxed); }
  /// Requests refused for t's own limit.
  [[nodiscard]] std::size_t refusals(tenant t) const { return level(checked(t)).refusals.load(std::memory_order_relaxed); }

  [[nodiscard]] const tenant_registry& registry() const noexcept { return *state_->registry; }

  // ---- the resource -------------------------------------------------------------------

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(s, bytes, align, current_tenant());
  }
  /// Allocates for tenant `t` (overriding the current tenant_scope).
  /// Throws quota_exceeded, the upstream's errors, invalid_argument for an unknown tenant.
  void* allocate(stream_ref s, std::size_t bytes, std::size_t align, tenant t) {
    detail::check_request(name(), bytes, align);
    checked(t);
    if (bytes == 0) return nullptr;
    chain c = chain_of(t);
    std::uint64_t crossed = reserve(c, t, bytes, s);
    void* p;
    try {
      p = upstream_.allocate(s, bytes, align);
    } catch (const out_of_memory& e) {
      unreserve(c, c.size, bytes);
      state_->ooms.fetch_add(1, std::memory_order_relaxed);
      observer_.on_out_of_memory(bytes, s, e.stats());
      throw;
    } catch (...) {
      unreserve(c, c.size, bytes);
      throw;
    }
    try {
      state_->pointers.insert(p, record{t, bytes});
    } catch (...) {
      upstream_.deallocate(s, p, bytes, align);
      unreserve(c, c.size, bytes);
      throw;
    }
    std::size_t live = state_->live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise(state_->peak_live, live);
    state_->allocations.fetch_add(1, std::memory_order_relaxed);
    observer_.on_allocate(p, bytes, s);
    if (crossed != 0) fire_soft_callbacks(c, crossed);
    return p;
  }

  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    auto r = state_->pointers.take_if(p, [bytes](const record& rec) { return rec.bytes == bytes; });
    if (!r) {
      report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
      return;
    }
    if (r->bytes != bytes) {
      report_misuse({misuse::wrong_size, name(), p, bytes, r->bytes});
      return;
    }
    upstream_.deallocate(s, p, bytes, align);
    chain c = chain_of(r->owner);
    unreserve(c, c.size, bytes);
    state_->live.fetch_sub(bytes, std::memory_order_relaxed);
    state_->deallocations.fetch_add(1, std::memory_order_relaxed);
    observer_.on_deallocate(p, bytes, s);
  }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align, current_tenant());
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align);
  }

  /// The tenant a live allocation was made for; false when p is not live here.
  [[nodiscard]] bool tenant_of(const void* p, tenant& out) const {
    auto r = state_->pointers.find(p);
    if (r) out = r->owner;
    return r.has_value();
  }

  /// Request-level totals (live = requested bytes); OOMs count quota refusals and upstream failures.
  [[nodiscard]] vram::stats stats() const {
    vram::stats s;
    if constexpr (has_stats<Upstream>) s = upstream_.stats();
    s.requested_bytes = state_->live.load(std::memory_order_relaxed);
    s.peak_requested_bytes = state_->peak_live.load(std::memory_order_relaxed);
    if constexpr (!has_stats<Upstream>) {
      s.live_bytes = s.requested_bytes;
      s.peak_live_bytes = s.peak_requested_bytes;
    }
    s.total_allocations = state_->allocations.load(std::memory_order_relaxed);
    s.total_deallocations = state_->deallocations.load(std::memory_order_relaxed);
    s.live_allocations = s.total_allocations - s.total_deallocations;
    s.ooms = state_->ooms.load(std::memory_order_relaxed);
    return s;
  }

  /// True when `p` is live through this adaptor (from its records, whatever the upstream has).
  [[nodiscard]] bool owns(const void* p) const { return state_->pointers.find(p).has_value(); }

  /// Verifies its own records, then the upstream's (exact when no other thread is allocating): every tenant's
  /// usage equals its own live bytes plus its children's usage; the recorded pointers sum to
  /// the total live bytes.
  void check_invariants() const {
#if VRAM_DEBUG
    const auto& reg = *state_->registry;
    std::size_t n = reg.size();
    std::vector<std::size_t> own(n, 0);
    std::size_t total = 0, count = 0;
    state_->pointers.for_each([&](const void*, const record& r) {
      own[r.owner.id] += r.bytes;
      total += r.bytes;
      ++count;
    });
    if (total != state_->live.load()) throw std::logic_error("quota_adaptor: recorded bytes != live bytes");
    if (count != state_->allocations.load() - state_->deallocations.load())
      throw std::logic_error("quota_adaptor: recorded pointers != live allocations");
    // usage(t) == own(t) + sum of usage(children): accumulate own bytes up the tree.
    std::vector<std::size_t> expected = own;
    for (std::size_t i = n; i-- > 1;) {
      tenant p;
      if (reg.parent(tenant{static_cast<std::uint32_t>(i)}, p)) expected[p.id] += expected[i];
    }
    for (std::size_t i = 0; i < n; ++i)
      if (expected[i] != state_->levels[i].usage.load()) throw std::logic_error("quota_adaptor: usage != own + children");
#endif
    this->check_upstream_invariants();
  }

  [[nodiscard]] Observer& observer() noexcept { return observer_; }

  friend bool operator==(const quota_adaptor& a, const quota_adaptor& b) {
    return a.state_ == b.state_ && a.upstream_ == b.upstream_;
  }

 private:
  struct record {
    tenant owner;
    std::size_t bytes;
  };
  // One cache line per tenant. usage <= hard whenever hard was not lowered below it;
  // usage <= peak.
  struct alignas(64) quota_level {
    std::atomic<std::size_t> usage{0};
    std::atomic<std::size_t> peak{0};
    std::atomic<std::size_t> hard{unlimited};
    std::atomic<std::size_t> soft{unlimited};
    std::atomic<std::size_t> refusals{0};
  };
  struct state {
    explicit state(std::shared_ptr<const tenant_registry> r) : registry(std::move(r)) {
      if (!registry) detail::throw_invalid_argument("quota_adaptor", "null tenant registry");
    }
    std::shared_ptr<const tenant_registry> registry;
    std::array<quota_level, max_tenants> levels{};
    detail::adaptor::adaptor_pointer_map<record> pointers;
    std::atomic<std::size_t> live{0};  // == sum of recorded bytes
    std::atomic<std::size_t> peak_live{0};
    std::atomic<std::size_t> allocations{0};
    std::atomic<std::size_t> deallocations{0};
    std::atomic<std::size_t> ooms{0};
    std::mutex callback_mutex;
    soft_limit_callback callback;
  };
  // t and its ancestors, innermost first. Depth is bounded by max_tenants (parents have
  // smaller ids), and soft-limit crossings are kept in a 64-bit mask, so deeper levels than
  // 64 are accounted but do not report crossings.
  struct chain {
    std::array<std::uint32_t, max_tenants> ids;
    std::size_t size = 0;
  };

  static void raise(std::atomic<std::size_t>& peak, std::size_t v) noexcept {
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }

  tenant checked(tenant t) const {
    if (!state_->registry->contains(t)) detail::throw_invalid_argument(name(), "unknown tenant");
    return t;
  }
  quota_level& level(tenant t) const noexcept { return state_->levels[t.id]; }

  chain chain_of(tenant t) const noexcept {
    chain c;
    c.ids[c.size++] = t.id;
    for (tenant p; state_->registry->parent(t, p); t = p) c.ids[c.size++] = p.id;
    return c;
  }

  /// Reserves `bytes` on every level of c or on none; returns the soft-crossing mask.
  std::uint64_t reserve(const chain& c, tenant requester, std::size_t bytes, stream_ref s) {
    std::uint64_t crossed = 0;
    for (std::size_t i = 0; i < c.size; ++i) {
      quota_level& q = state_->levels[c.ids[i]];
      std::size_t cur = q.usage.load(std::memory_order_relaxed);
      for (;;) {
        std::size_t limit = q.hard.load(std::memory_order_relaxed);
        if (cur > limit || bytes > limit - cur) [[unlikely]] {
          unreserve(c, i, bytes);
          q.refusals.fetch_add(1, std::memory_order_relaxed);
          state_->ooms.fetch_add(1, std::memory_order_relaxed);
          observer_.on_out_of_memory(bytes, s, vram::stats{});
          tenant limited{c.ids[i]};
          detail::throw_quota_exceeded(name(), bytes, s, requester, limited, state_->registry->name(limited), limit,
                                       cur);
        }
        if (q.usage.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed)) break;
      }
      raise(q.peak, cur + bytes);
      std::size_t soft = q.soft.load(std::memory_order_relaxed);
      if (i < 64 && cur <= soft && cur + bytes > soft) crossed |= std::uint64_t{1} << i;
    }
    return crossed;
  }

  /// Gives back `bytes` on the first n levels of c.
  void unreserve(const chain& c, std::size_t n, std::size_t bytes) noexcept {
    for (std::size_t i = 0; i < n; ++i) state_->levels[c.ids[i]].usage.fetch_sub(bytes, std::memory_order_relaxed);
  }

  void fire_soft_callbacks(const chain& c, std::uint64_t crossed) {
    soft_limit_callback cb;
    {
      std::lock_guard lock(state_->callback_mutex);
      cb = state_->callback;
    }
    if (!cb) return;
    for (std::size_t i = 0; i < c.size && i < 64; ++i) {
      if ((crossed >> i & 1) == 0) continue;
      quota_level& q = state_->levels[c.ids[i]];
      try {
        cb(tenant{c.ids[i]}, q.soft.load(std::memory_order_relaxed), q.usage.load(std::memory_order_relaxed));
      } catch (...) {  // the allocation succeeded; a failing notification must not leak it
      }
    }
  }

  [[no_unique_address]] Observer observer_;
  std::shared_ptr<state> state_;
};

}  // namespace vram

#include <vram/source/host_source.hpp>
static_assert(vram::resource<vram::quota_adaptor<vram::host_source>>);

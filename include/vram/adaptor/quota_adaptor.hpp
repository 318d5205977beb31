#pragma once
// vram::quota_adaptor<Upstream, Observer, Book>: per-tenant hard and soft memory limits over
// any upstream, with hierarchical tenants (a tenant's usage counts against every ancestor).
// The book keeps the limits and usage: in this process (the default), or in a ledger shared
// by processes (vram::ledger_quota_adaptor, ledger_quota_adaptor.hpp).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/observer.hpp>
#include <vram/core/tenant.hpp>
#include <vram/core/throw.hpp>
#include <vram/adaptor/detail/adaptor_base.hpp>
#include <vram/adaptor/detail/pointer_map.hpp>
#include <vram/adaptor/detail/quota_book.hpp>

namespace vram {

/// Called once per upward crossing of a soft limit: usage went from <= soft_limit to above it.
/// Runs on the allocating thread, after the allocation succeeded, outside every lock; an
/// exception it throws is swallowed (the allocation stands).
using soft_limit_callback = std::function<void(tenant t, std::size_t soft_limit, std::size_t usage)>;

/// Enforces per-tenant memory limits.
///
/// Accounting: usage(t) is the sum of the requested bytes of t's live allocations and of all
/// its descendants'. A request of b bytes for tenant t is first charged to t and to every
/// ancestor in the book, which refuses unless each stays within its hard limit; only when it
/// was granted is the upstream called. A refusal throws vram::quota_exceeded; an upstream
/// failure returns the charge and rethrows. So usage never exceeds a hard limit, not even
/// transiently, and a refused request leaves every counter as it was but the refusal count.
/// Soft limits: the callback runs once per upward crossing (see soft_limit_callback).
/// Limits may be changed at any time; a hard limit lowered below usage refuses new requests
/// until frees bring usage under it (frees always succeed).
/// Tenants: the explicit tenant argument, else the book's default (local_book:
/// vram::current_tenant(); a ledger: the tenant it was given); the tenant is recorded
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
/// Complexity: the book's charge (local_book: O(depth of the tenant) atomics) + one sharded
/// hash-map update per operation.
template <class Upstream, class Observer = no_observer, class Book = detail::adaptor::local_book>
class quota_adaptor
    : public detail::adaptor::adaptor_base<quota_adaptor<Upstream, Observer, Book>, Upstream> {
  using base = detail::adaptor::adaptor_base<quota_adaptor<Upstream, Observer, Book>, Upstream>;
  using base::upstream_;

 public:
  static constexpr std::size_t unlimited = ~std::size_t{0};
  using book_type = Book;

  /// `book`: local_book takes the tenant registry (default: the global one).
  explicit quota_adaptor(Upstream upstream = Upstream{}, typename Book::argument book = default_book(),
                         Observer observer = Observer{})
      : base(std::move(upstream)), observer_(std::move(observer)), state_(std::make_shared<state>(std::move(book))) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "quota_adaptor"; }

  // ---- limits -------------------------------------------------------------------------

  /// Sets t's hard limit (unlimited to remove it). Throws invalid_argument for an unknown tenant
  /// (a ledger: ledger_error when this handle may not change limits).
  void set_hard_limit(tenant t, std::size_t bytes) { book().set_hard_limit(checked(t), bytes); }
  /// Sets t's soft limit (unlimited to remove it).
  void set_soft_limit(tenant t, std::size_t bytes) { book().set_soft_limit(checked(t), bytes); }
  [[nodiscard]] std::size_t hard_limit(tenant t) const { return book().hard_limit(checked(t)); }
  [[nodiscard]] std::size_t soft_limit(tenant t) const { return book().soft_limit(checked(t)); }
  /// Installs the soft-limit callback (replacing any previous one; empty to remove).
  void set_soft_limit_callback(soft_limit_callback cb) {
    std::lock_guard lock(state_->callback_mutex);
    state_->callback = std::move(cb);
  }

  /// Bytes held by t and its descendants (a ledger: by every process).
  [[nodiscard]] std::size_t usage(tenant t) const { return book().usage(checked(t)); }
  /// Highest usage(t) so far.
  [[nodiscard]] std::size_t peak_usage(tenant t) const { return book().peak_usage(checked(t)); }
  /// Requests refused for t's own limit.
  [[nodiscard]] std::size_t refusals(tenant t) const { return book().refusals(checked(t)); }

  [[nodiscard]] Book& book() const noexcept { return state_->book; }
  [[nodiscard]] const tenant_registry& registry() const noexcept
    requires std::is_same_v<Book, detail::adaptor::local_book>
  {
    return state_->book.registry();
  }

  // ---- the resource -------------------------------------------------------------------

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(s, bytes, align, book().default_tenant());
  }
  /// Allocates for tenant `t` (overriding the default tenant).
  /// Throws quota_exceeded, the upstream's errors, invalid_argument for an unknown tenant.
  void* allocate(stream_ref s, std::size_t bytes, std::size_t align, tenant t) {
    detail::check_request(name(), bytes, align);
    checked(t);
    if (bytes == 0) return nullptr;
    detail::adaptor::charge_result charge = book().charge(t, bytes);
    if (!charge.granted) [[unlikely]] refuse(s, bytes, t, charge);
    void* p;
    try {
      p = upstream_.allocate(s, bytes, align);
    } catch (const out_of_memory& e) {
      book().uncharge(t, bytes);
      state_->ooms.fetch_add(1, std::memory_order_relaxed);
      observer_.on_out_of_memory(bytes, s, e.stats());
      throw;
    } catch (...) {
      book().uncharge(t, bytes);
      throw;
    }
    try {
      state_->pointers.insert(p, record{t, bytes});
    } catch (...) {
      upstream_.deallocate(s, p, bytes, align);
      book().uncharge(t, bytes);
      throw;
    }
    std::size_t live = state_->live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    raise(state_->peak_live, live);
    state_->allocations.fetch_add(1, std::memory_order_relaxed);
    observer_.on_allocate(p, bytes, s);
    if (charge.soft_crossed != 0) fire_soft_callbacks(t, charge.soft_crossed);
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
    book().uncharge(r->owner, bytes);
    state_->live.fetch_sub(bytes, std::memory_order_relaxed);
    state_->deallocations.fetch_add(1, std::memory_order_relaxed);
    observer_.on_deallocate(p, bytes, s);
  }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align, book().default_tenant());
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

  /// Verifies its own records against the book, then the upstream's invariants (exact when
  /// no other thread is allocating): the recorded pointers sum to the total live bytes, and
  /// the book's usage agrees with the records (local_book: usage(t) == own(t) + children's;
  /// a ledger: this process's charges per tenant == own(t), and the ledger's own invariant).
  void check_invariants() const {
#if VRAM_DEBUG
    std::vector<std::size_t> own(max_tenants, 0);
    std::size_t total = 0, count = 0;
    state_->pointers.for_each([&](const void*, const record& r) {
      if (r.owner.id >= own.size()) own.resize(r.owner.id + 1, 0);
      own[r.owner.id] += r.bytes;
      total += r.bytes;
      ++count;
    });
    if (total != state_->live.load()) throw std::logic_error("quota_adaptor: recorded bytes != live bytes");
    if (count != state_->allocations.load() - state_->deallocations.load())
      throw std::logic_error("quota_adaptor: recorded pointers != live allocations");
    book().check(own);
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
  struct state {
    explicit state(typename Book::argument b) : book(std::move(b)) {}
    Book book;
    detail::adaptor::adaptor_pointer_map<record> pointers;
    std::atomic<std::size_t> live{0};  // == sum of recorded bytes
    std::atomic<std::size_t> peak_live{0};
    std::atomic<std::size_t> allocations{0};
    std::atomic<std::size_t> deallocations{0};
    std::atomic<std::size_t> ooms{0};
    std::mutex callback_mutex;
    soft_limit_callback callback;
  };

  static typename Book::argument default_book() {
    if constexpr (std::is_same_v<Book, detail::adaptor::local_book>) return tenant_registry::global();
    else return typename Book::argument{};
  }

  static void raise(std::atomic<std::size_t>& peak, std::size_t v) noexcept {
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }

  tenant checked(tenant t) const {
    if (!book().contains(t)) detail::throw_invalid_argument(name(), "unknown tenant");
    return t;
  }

  [[noreturn, gnu::cold]] void refuse(stream_ref s, std::size_t bytes, tenant requester,
                                      const detail::adaptor::charge_result& c) {
    state_->ooms.fetch_add(1, std::memory_order_relaxed);
    observer_.on_out_of_memory(bytes, s, vram::stats{});
    detail::throw_quota_exceeded(name(), bytes, s, requester, c.limited, book().name(c.limited), c.limit, c.usage,
                                 book().name(requester));
  }

  /// Runs the soft-limit callback for each level of t's chain whose bit is set in `crossed`.
  void fire_soft_callbacks(tenant t, std::uint64_t crossed) {
    soft_limit_callback cb;
    {
      std::lock_guard lock(state_->callback_mutex);
      cb = state_->callback;
    }
    if (!cb) return;
    std::size_t i = 0;
    book().for_each_level(t, [&](tenant level) {
      if (i < 64 && (crossed >> i & 1) != 0) {
        try {
          cb(level, book().soft_limit(level), book().usage(level));
        } catch (...) {  // the allocation succeeded; a failing notification must not leak it
        }
      }
      ++i;
    });
  }

  [[no_unique_address]] Observer observer_;
  std::shared_ptr<state> state_;
};

}  // namespace vram

#include <vram/source/host_source.hpp>
static_assert(vram::resource<vram::quota_adaptor<vram::host_source>>);

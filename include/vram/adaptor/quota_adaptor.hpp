#pragma once
// vram::quota_adaptor<Upstream, Observer, Book>: per-tenant hard and soft memory limits over
// any upstream, with hierarchical tenants (a tenant's usage counts against every ancestor).
// The book keeps the limits and usage: in this process (the default), or in a ledger shared
// by processes (vram::ledger_quota_adaptor, ledger_quota_adaptor.hpp).

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
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
#include <vram/adaptor/detail/quota_book.hpp>
#include <vram/adaptor/detail/quota_shard.hpp>
#include <vram/detail/thread_slot.hpp>

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
/// Limits may be changed at any time, and bind every request that starts after the setter
/// returns; a hard limit lowered below usage refuses new requests until frees bring usage
/// under it (frees always succeed).
/// Credit (a book that lends it: local_book): each thread (thread_slot.hpp) reserves up to
/// `credit_batch` bytes ahead on its tenant's chain, in the book, and serves its next requests
/// for that tenant from them; its frees for that tenant go back to its credit (it keeps at most
/// 2 x credit_batch). So a loop of allocations and frees changes no shared word. Credit counts
/// against the hard limits (so usage plus all credit never passes one) but not in usage(): a
/// request the book refuses takes every thread's credit back and is asked once more, so it is
/// refused only when usage plus the request passes a limit. A tenant with a soft limit on its
/// chain gets no credit (each crossing is seen by the request that makes it), nor does a
/// request where the request and a batch do not fit below a hard limit, nor a tenant more than
/// quota_shard::max_chain (8) levels deep; setting a limit takes all credit back. A free's
/// bytes serve no other request before the upstream freed the block. Peaks (peak_usage,
/// stats' peak_requested_bytes) are taken at each request as the book's reservation less this
/// thread's credit: exact while one thread holds credit, otherwise never below the true peak
/// and above it by at most the other threads' credit, and never above a hard limit.
/// Tenants: the explicit tenant argument, else the book's default (local_book:
/// vram::current_tenant(); a ledger: the tenant it was given); the tenant is recorded
/// per pointer, so deallocation needs no tenant and may happen on any thread or scope.
/// Misuse: freeing a pointer not live here, or with another size, is reported (error handler)
/// and changes nothing (the upstream is not called).
/// Thread safety: fully thread-safe if the upstream is. Records, credit and counters are kept
/// per thread (quota_shard.hpp); a free from another thread finds its record in the shard
/// that made it.
/// Streams, alignment: those of the upstream. Usage drops when deallocate is called, not when
/// the stream later reaches the free.
/// Upstream: held by value; copies share limits and usage. Observer: told of every successful
/// allocation (after usage was reserved), every deallocation and every refusal.
/// Capabilities: owns() from its records; release, try_allocate (a refusal gives nullptr) and
/// the upstream's check_invariants pass through (adaptor_base); stats() adds the upstream's.
/// Complexity: served from credit, an allocation and a free each take their thread's shard
/// lock once, on its bias (biased_lock.hpp: no locked instruction while no other thread took
/// it lately; another thread's first entry costs one process-wide barrier), with a hash-map
/// update unless the free is of the thread's newest allocation; else the book's charge
/// (local_book: O(depth of the tenant) atomics). A free from another thread than the
/// allocation's looks in up to thread_slots + 1 shards; usage() and a refusal lock each shard
/// once.
template <class Upstream, class Observer = no_observer, class Book = detail::adaptor::local_book>
class quota_adaptor
    : public detail::adaptor::adaptor_base<quota_adaptor<Upstream, Observer, Book>, Upstream> {
  using base = detail::adaptor::adaptor_base<quota_adaptor<Upstream, Observer, Book>, Upstream>;
  using base::upstream_;

 public:
  static constexpr std::size_t unlimited = ~std::size_t{0};
  using book_type = Book;
  /// Whether threads reserve ahead (see Credit above).
  static constexpr bool lends_credit = requires { requires Book::lends_credit; };
  /// The credit a thread keeps after taking more from the book.
  static constexpr std::size_t credit_batch = std::size_t{1} << 20;

  /// `book`: local_book takes the tenant registry (default: the global one).
  explicit quota_adaptor(Upstream upstream = Upstream{}, typename Book::argument book = default_book(),
                         Observer observer = Observer{})
      : base(std::move(upstream)), observer_(std::move(observer)), state_(std::make_shared<state>(std::move(book))) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "quota_adaptor"; }

  // ---- limits -------------------------------------------------------------------------

  /// Sets t's hard limit (unlimited to remove it). Throws invalid_argument for an unknown tenant
  /// (a ledger: ledger_error when this handle may not change limits).
  void set_hard_limit(tenant t, std::size_t bytes) {
    book().set_hard_limit(checked(t), bytes);
    reclaim_credit();
  }
  /// Sets t's soft limit (unlimited to remove it).
  void set_soft_limit(tenant t, std::size_t bytes) {
    book().set_soft_limit(checked(t), bytes);
    reclaim_credit();
  }
  [[nodiscard]] std::size_t hard_limit(tenant t) const { return book().hard_limit(checked(t)); }
  [[nodiscard]] std::size_t soft_limit(tenant t) const { return book().soft_limit(checked(t)); }
  /// Installs the soft-limit callback (replacing any previous one; empty to remove).
  void set_soft_limit_callback(soft_limit_callback cb) {
    std::lock_guard lock(state_->callback_mutex);
    state_->callback = std::move(cb);
  }

  /// Bytes held by t and its descendants (a ledger: by every process); credit is not usage.
  [[nodiscard]] std::size_t usage(tenant t) const {
    checked(t);
    if constexpr (!lends_credit) {
      return book().usage(t);
    } else {
      std::size_t lent = 0;  // with every shard locked, no credit moves
      for (auto& sh : state_->shards) sh.lock.lock();
      for (auto& sh : state_->shards)  // bytes in flight are still held: usage
        if (sh.lending && sh.credit != 0 && on_chain(sh.credit_tenant, t))
          lent += sh.credit - sh.in_flight.load(std::memory_order_acquire);
      std::size_t reserved = book().usage(t);
      for (auto& sh : state_->shards) sh.lock.unlock();
      return reserved - lent;
    }
  }
  /// Highest usage(t) so far (see Credit above for what it means while threads race).
  [[nodiscard]] std::size_t peak_usage(tenant t) const { return book().peak_usage(checked(t)); }
  /// Requests refused for t's own limit.
  [[nodiscard]] std::size_t refusals(tenant t) const { return book().refusals(checked(t)); }

  /// The book; with credit lent, its usage includes the credit (usage() here does not). Set
  /// limits through the adaptor, which takes the credit back.
  [[nodiscard]] Book& book() const noexcept { return state_->book; }
  [[nodiscard]] const tenant_registry& registry() const noexcept
    requires std::is_same_v<Book, detail::adaptor::local_book>
  {
    return state_->book.registry();
  }

  // ---- the resource -------------------------------------------------------------------

  // Always inlined, as statistics_adaptor's are: the upstream's inline path stays in the caller.
  [[gnu::always_inline]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(s, bytes, align, book().default_tenant());
  }
  /// Allocates for tenant `t` (overriding the default tenant).
  /// Throws quota_exceeded, the upstream's errors, invalid_argument for an unknown tenant.
  [[gnu::always_inline]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align, tenant t) {
    detail::check_request(name(), bytes, align);
    checked(t);
    if (bytes == 0) return nullptr;
    const std::size_t slot = detail::thread_slot::get_inline();
    shard_t& sh = state_->shards[slot];
    detail::adaptor::charge_result charge{true, 0, t, 0, 0};
    if (!spend_credit(sh, t, bytes)) [[unlikely]] {
      charge = take(sh, t, bytes);
      if (!charge.granted) [[unlikely]] refuse(s, bytes, t, charge);
    }
    void* p;
    try {
      p = upstream_.allocate(s, bytes, align);
    } catch (const out_of_memory& e) {
      give_back(sh, t, bytes);
      state_->ooms.fetch_add(1, std::memory_order_relaxed);
      observer_.on_out_of_memory(bytes, s, e.stats());
      throw;
    } catch (...) {
      give_back(sh, t, bytes);
      throw;
    }
    if (slot < detail::thread_slots) [[likely]] {
      sh.set_newest(key(p), record{t, bytes});
    } else {
      try {
        detail::biased_guard lock(sh.lock);
        sh.insert(key(p), record{t, bytes});  // present already: the first record stays
      } catch (...) {
        upstream_.deallocate(s, p, bytes, align);
        give_back(sh, t, bytes);
        throw;
      }
    }
    observer_.on_allocate(p, bytes, s);
    if (charge.soft_crossed != 0) fire_soft_callbacks(t, charge.soft_crossed);
    return p;
  }

  [[gnu::always_inline]] void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    const std::size_t slot = detail::thread_slot::get_inline();
    shard_t& own = state_->shards[slot];
    record r;
    bool credited = false;  // the bytes went back to own's credit, held in flight
    {
      detail::biased_guard lock(own.lock);
      r = own.take(key(p), bytes);
      if (r.bytes == bytes && slot < detail::thread_slots) [[likely]]
        credited = credit_in_flight(own, r.owner, bytes);
    }
    for (std::size_t i = 0; !r && i < state_->shards.size(); ++i)
      if (&state_->shards[i] != &own) r = take_record(state_->shards[i], p, bytes);
    if (!r) [[unlikely]] {
      report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
      return;
    }
    if (r.bytes != bytes) [[unlikely]] {
      report_misuse({misuse::wrong_size, name(), p, bytes, r.bytes});
      return;
    }
    upstream_.deallocate(s, p, bytes, align);
    if (credited) {
      own.in_flight.store(0, std::memory_order_release);  // now they may serve any request
    } else {
      detail::biased_guard lock(own.lock);  // only now: the bytes may serve a request at once
      return_bytes(own, r.owner, bytes);
    }
    observer_.on_deallocate(p, bytes, s);
  }

  [[gnu::always_inline]] void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align, book().default_tenant());
  }
  [[gnu::always_inline]] void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align);
  }

  /// The tenant a live allocation was made for; false when p is not live here.
  [[nodiscard]] bool tenant_of(const void* p, tenant& out) const {
    record r = find(p);
    if (r) out = r.owner;
    return static_cast<bool>(r);
  }

  /// Request-level totals (live = requested bytes); OOMs count quota refusals and upstream failures.
  [[nodiscard]] vram::stats stats() const {
    vram::stats s;
    if constexpr (has_stats<Upstream>) s = upstream_.stats();
    std::size_t live = 0, allocations = 0, deallocations = 0;
    for (auto& sh : state_->shards) {  // frees before allocations: never more frees than allocations
      deallocations += sh.deallocations.load(std::memory_order_relaxed);
      allocations += sh.allocations.load(std::memory_order_relaxed);
      live += sh.live.load(std::memory_order_relaxed);
    }
    s.requested_bytes = live;
    s.peak_requested_bytes = std::max(live, state_->peak_requested.load(std::memory_order_relaxed));
    if constexpr (!has_stats<Upstream>) {
      s.live_bytes = s.requested_bytes;
      s.peak_live_bytes = s.peak_requested_bytes;
    }
    s.total_allocations = allocations;
    s.total_deallocations = deallocations;
    s.live_allocations = allocations - deallocations;
    s.ooms = state_->ooms.load(std::memory_order_relaxed);
    return s;
  }

  /// True when `p` is live through this adaptor (from its records, whatever the upstream has).
  [[nodiscard]] bool owns(const void* p) const { return static_cast<bool>(find(p)); }

  /// Verifies its own records against the book, then the upstream's invariants (exact when
  /// no other thread is allocating): each shard's counters agree with its records, the book's
  /// reservations through this adaptor are the records' bytes plus the credit, and the book's
  /// usage agrees (local_book: usage(t) == own(t) + children's, own(t) counting t's credit;
  /// a ledger: this process's charges per tenant == own(t), and the ledger's own invariant).
  void check_invariants() const {
#if VRAM_DEBUG
    std::vector<std::size_t> own(max_tenants, 0);
    std::size_t reserved = 0;
    for (auto& sh : state_->shards) {
      detail::biased_guard lock(sh.lock);
      std::size_t bytes = 0, count = 0;
      sh.for_each([&](std::uintptr_t, const record& r) {
        if (r.owner.id >= own.size()) own.resize(r.owner.id + 1, 0);
        own[r.owner.id] += r.bytes;
        bytes += r.bytes;
        ++count;
      });
      if (bytes != sh.live.load()) throw std::logic_error("quota_adaptor: a shard's recorded bytes != its live bytes");
      if (count != sh.allocations.load() - sh.deallocations.load())
        throw std::logic_error("quota_adaptor: a shard's recorded pointers != its live allocations");
      if (sh.lending) {
        if (sh.credit_tenant.id >= own.size()) own.resize(sh.credit_tenant.id + 1, 0);
        own[sh.credit_tenant.id] += sh.credit;
        bytes += sh.credit;
      } else if (sh.credit != 0) {
        throw std::logic_error("quota_adaptor: credit without a tenant");
      }
      reserved += bytes;
    }
    if (reserved != state_->reserved.load()) throw std::logic_error("quota_adaptor: reserved bytes != records + credit");
    book().check(own);
#endif
    this->check_upstream_invariants();
  }

  [[nodiscard]] Observer& observer() noexcept { return observer_; }

  friend bool operator==(const quota_adaptor& a, const quota_adaptor& b) {
    return a.state_ == b.state_ && a.upstream_ == b.upstream_;
  }

 private:
  using record = detail::adaptor::quota_record;
  using shard_t = detail::adaptor::quota_shard;
  struct state {
    explicit state(typename Book::argument b) : book(std::move(b)) {}
    Book book;
    std::array<shard_t, detail::thread_slots + 1> shards;
    // Bytes charged to the book through this adaptor: the records', the credit's and those of
    // requests between their charge and their record. Moves with the book, not per request
    // served from credit.
    std::atomic<std::size_t> reserved{0};
    // Reservations the book granted through this adaptor (it only counts up): a shard that
    // sees it unchanged since its last note_peaks knows no level's usage went up.
    std::atomic<std::uint64_t> reservations{0};
    std::atomic<std::size_t> peak_requested{0};
    std::atomic<std::size_t> ooms{0};
    std::mutex callback_mutex;
    soft_limit_callback callback;
  };

  static typename Book::argument default_book() {
    if constexpr (std::is_same_v<Book, detail::adaptor::local_book>) return tenant_registry::global();
    else return typename Book::argument{};
  }

  static std::uintptr_t key(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  static void raise(std::atomic<std::size_t>& peak, std::size_t v) noexcept {
    std::size_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }

  tenant checked(tenant t) const {
    if (!book().contains(t)) detail::throw_invalid_argument(name(), "unknown tenant");
    return t;
  }

  /// True when `level` is t or one of its ancestors.
  bool on_chain(tenant t, tenant level) const {
    bool found = false;
    book().for_each_level(t, [&](tenant l) { found = found || l.id == level.id; });
    return found;
  }

  /// The common case of take(): serves the request from sh's credit, or returns false
  /// (nothing changed but the newest record settled).
  [[gnu::always_inline]] bool spend_credit(shard_t& sh, tenant t, std::size_t bytes) {
    if constexpr (!lends_credit) {
      return false;
    } else {
      detail::biased_guard lock(sh.lock);
      sh.settle_newest();
      if (!sh.lending || sh.credit_tenant.id != t.id || sh.credit < bytes) [[unlikely]]
        return false;
      sh.credit -= bytes;
      count(sh, bytes);
      note_peaks(sh);
      return true;
    }
  }

  /// Charges a request of `bytes` for t: from sh's credit, else from the book (taking more
  /// credit where it may), else, refused, once more after taking all credit back.
  /// Counts the request in sh once granted. Settles sh's newest record first (so a failure
  /// to record it, std::bad_alloc, comes before any charge).
  detail::adaptor::charge_result take(shard_t& sh, tenant t, std::size_t bytes) {
    const detail::adaptor::charge_result granted{true, 0, t, 0, 0};
    {
      detail::biased_guard lock(sh.lock);
      sh.settle_newest();
      if constexpr (lends_credit) {
        if (sh.lending && sh.credit_tenant.id == t.id && sh.credit >= bytes) {
          sh.credit -= bytes;
          note_peaks(sh);
          return count(sh, bytes), granted;
        }
        if (lend(sh, t, bytes)) return count(sh, bytes), granted;
        drop_credit(sh);
      }
      detail::adaptor::charge_result c = charge_exactly(t, bytes, !lends_credit);
      if (c.granted) count(sh, bytes);
      if (c.granted || !lends_credit) return c;
    }
    reclaim_credit();
    detail::adaptor::charge_result c = charge_exactly(t, bytes, true);
    if (c.granted) {
      detail::biased_guard lock(sh.lock);
      count(sh, bytes);
    }
    return c;
  }

  /// Under sh's lock: counts a granted request.
  static void count(shard_t& sh, std::size_t bytes) noexcept {
    shard_t::add(sh.live, bytes);
    shard_t::add(sh.allocations, 1);
  }

  /// Under sh's lock: reserves `bytes` plus a batch of credit for t; false (nothing reserved)
  /// where t's chain has a soft limit or the batch would not fit below a hard limit.
  bool lend(shard_t& sh, tenant t, std::size_t bytes) {
    if (book().soft_limited(t) || bytes > unlimited - credit_batch) return false;
    const bool same = sh.lending && sh.credit_tenant.id == t.id;
    std::size_t held = same ? sh.credit : 0;
    std::array<std::uint32_t, shard_t::max_chain> chain;
    std::size_t length = same ? sh.chain_length : book().chain(t, chain.data(), chain.size());
    if (length == 0) return false;  // a chain too deep to cache: every request charges the book
    std::size_t more = bytes + credit_batch - held;
    if (!book().reserve(t, more)) return false;
    if (!same) {
      drop_credit(sh);
      sh.chain = chain;
      sh.chain_length = length;
    }
    state_->reserved.fetch_add(more, std::memory_order_relaxed);
    state_->reservations.fetch_add(1, std::memory_order_release);
    sh.lending = true;
    sh.credit_tenant = t;
    sh.credit = credit_batch;
    note_peaks(sh);
    return true;
  }

  detail::adaptor::charge_result charge_exactly(tenant t, std::size_t bytes, bool count_refusal) {
    detail::adaptor::charge_result c;
    if constexpr (lends_credit) c = book().charge(t, bytes, count_refusal);
    else c = book().charge(t, bytes);
    if (c.granted) {
      raise(state_->peak_requested, state_->reserved.fetch_add(bytes, std::memory_order_relaxed) + bytes);
      state_->reservations.fetch_add(1, std::memory_order_release);
    }
    return c;
  }

  /// Under sh's lock: raises the peaks after a request was served from sh's credit, where
  /// they can have risen: each level's usage less sh's credit only goes up when the book took
  /// a reservation or the credit went down since sh last raised them.
  [[gnu::always_inline]] void note_peaks(shard_t& sh) noexcept {
    const std::uint64_t reservations = state_->reservations.load(std::memory_order_acquire);
    if (reservations == sh.noted_reservations && sh.credit >= sh.noted_credit) [[likely]]
      return;
    sh.noted_reservations = reservations;
    sh.noted_credit = sh.credit;
    raise_peaks(sh);
  }
  [[gnu::noinline]] void raise_peaks(const shard_t& sh) noexcept {
    book().raise_peaks(sh.chain.data(), sh.chain_length, sh.credit);
    raise(state_->peak_requested, state_->reserved.load(std::memory_order_relaxed) - sh.credit);
  }

  /// Under sh's lock: gives sh's credit back to the book, but bytes in flight (their block not
  /// yet freed upstream: they stay, and the shard keeps lending for its tenant).
  void drop_credit(shard_t& sh) noexcept {
    if constexpr (lends_credit) {
      const std::size_t kept = sh.in_flight.load(std::memory_order_acquire);
      if (sh.credit > kept) {
        book().uncharge(sh.credit_tenant, sh.credit - kept);
        state_->reserved.fetch_sub(sh.credit - kept, std::memory_order_relaxed);
      }
      sh.credit = kept;
      sh.lending = kept != 0;
    }
  }

  /// Under the lock of own, a shard of one thread, in that thread's free of a block of t:
  /// puts the block's bytes in own's credit at once, marked in flight until the upstream freed
  /// the block (no other request may have them before: drop_credit leaves them, and the one
  /// thread that could spend them is inside the free). False (nothing changed) where own does
  /// not lend for t or would keep more than two batches.
  bool credit_in_flight(shard_t& own, tenant t, std::size_t bytes) noexcept {
    if constexpr (!lends_credit) {
      return false;
    } else {
      if (!own.lending || own.credit_tenant.id != t.id || own.credit + bytes > 2 * credit_batch) return false;
      own.credit += bytes;
      own.in_flight.store(bytes, std::memory_order_relaxed);
      return true;
    }
  }

  /// Gives every shard's credit back, one shard locked at a time.
  void reclaim_credit() noexcept {
    if constexpr (lends_credit)
      for (auto& sh : state_->shards) {
        detail::biased_guard lock(sh.lock);
        drop_credit(sh);
      }
  }

  /// Under sh's lock: returns the charge of a request (a free's: after the upstream freed the
  /// block), to sh's credit when it lends for t.
  void return_bytes(shard_t& sh, tenant t, std::size_t bytes) noexcept {
    if (sh.lending && sh.credit_tenant.id == t.id) {
      sh.credit += bytes;
      if (sh.credit <= 2 * credit_batch) return;
      bytes = sh.credit - credit_batch;  // keep one batch, give back the rest
      sh.credit = credit_batch;
    }
    book().uncharge(t, bytes);
    state_->reserved.fetch_sub(bytes, std::memory_order_relaxed);
  }

  /// Returns the charge of a request that made no allocation, and uncounts it.
  void give_back(shard_t& sh, tenant t, std::size_t bytes) noexcept {
    detail::biased_guard lock(sh.lock);
    shard_t::add(sh.live, 0 - bytes);
    shard_t::add(sh.allocations, ~std::size_t{0});
    return_bytes(sh, t, bytes);
  }

  /// Looks for p in `where`'s records and removes it when found with `bytes`; returns the
  /// record found, removed or not. Its charge stays until the caller returns it.
  static record take_record(shard_t& where, const void* p, std::size_t bytes) noexcept {
    detail::biased_guard lock(where.lock);
    return where.take(key(p), bytes);
  }

  record find(const void* p) const {
    for (auto& sh : state_->shards) {
      detail::biased_guard lock(sh.lock);
      if (record r = sh.find(key(p))) return r;
    }
    return {};
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

#pragma once
// One thread's share of a quota_adaptor's state (thread_slot.hpp says which shard a thread
// has): the records of the allocations made through it, the credit it holds, and its
// counters. Every field changes under the shard's lock, normally taken by the one thread the
// shard belongs to, so it is biased to that thread (biased_lock.hpp: no locked instruction
// while no other thread came lately); other threads take it to free a block the shard
// recorded, to take its credit back, or to read it whole. The exceptions, the newest record
// and the bytes in flight (below), let an allocation and a free take it once.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include <vram/core/tenant_id.hpp>
#include <vram/detail/flat_map.hpp>
#include <vram/detail/biased_lock.hpp>

namespace vram::detail::adaptor {

/// What a quota_adaptor remembers of a live allocation; bytes == 0: no record (no
/// allocation of 0 bytes is recorded). Returned by value in registers, where an optional
/// would go through memory.
struct quota_record {
  tenant owner{};
  std::size_t bytes = 0;
  [[nodiscard]] explicit operator bool() const noexcept { return bytes != 0; }
};

struct alignas(64) quota_shard {
  mutable biased_lock lock;

  // Credit: bytes reserved in the book on credit_tenant's chain that no request holds yet, so
  // that this shard's next requests for credit_tenant are served without touching the book.
  bool lending = false;  // credit_tenant and its chain are meaningful
  tenant credit_tenant{};
  std::size_t credit = 0;
  static constexpr std::size_t max_chain = 8;  // a deeper tenant gets no credit
  std::array<std::uint32_t, max_chain> chain{};  // credit_tenant's level ids, itself first
  std::size_t chain_length = 0;
  // Bytes of `credit` whose block the upstream has not freed yet: set under the lock by the
  // shard's one thread in its free, cleared by it without the lock once the upstream freed
  // the block. Nobody else spends or gives them back while set.
  std::atomic<std::size_t> in_flight{0};
  // The last time this shard raised the peaks (quota_adaptor::note_peaks): the adaptor's
  // reservation count and this shard's credit then. While neither the book took a reservation
  // since nor the credit went lower, no level's usage less the credit can have risen.
  std::uint64_t noted_reservations = ~std::uint64_t{0};
  std::size_t noted_credit = 0;

  // Written under the lock, read without it (stats() sums them). A request counts from its
  // charge, so live and allocations include requests still in the upstream.
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> allocations{0};
  std::atomic<std::size_t> deallocations{0};

  /// Adds `delta` (wrapping) to a counter; the caller holds the lock, so a load and a store
  /// suffice where readers need only an untorn value.
  [[gnu::always_inline]] static void add(std::atomic<std::size_t>& counter, std::size_t delta) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }

  /// The owner's newest allocation, without the lock (a shard of one thread only): it stays
  /// out of the table until that thread's next request settles it, under the lock. Another
  /// thread reads it under the lock. That is safe: a block it frees was handed to it after
  /// these stores, and the owner writes them again only after settling this record, which
  /// takes the lock. So a thread that frees what it just allocated touches no table at all.
  [[gnu::always_inline]] void set_newest(std::uintptr_t address, quota_record r) noexcept {
    newest_owner_.store(r.owner.id, std::memory_order_relaxed);
    newest_bytes_.store(r.bytes, std::memory_order_relaxed);
    newest_.store(address, std::memory_order_release);
  }

  /// Under the lock: moves the newest record into the table. May throw std::bad_alloc, the
  /// record staying newest.
  [[gnu::always_inline]] void settle_newest() {
    if (newest_.load(std::memory_order_acquire) != 0) settle();
  }

  /// Under the lock: records an allocation in the table. May throw std::bad_alloc.
  void insert(std::uintptr_t address, quota_record r) { records_.insert(address, r); }

  /// Under the lock: the record of `address`, or none when it is not live here.
  [[nodiscard]] quota_record find(std::uintptr_t address) const noexcept {
    if (newest_.load(std::memory_order_acquire) == address) return newest();
    if (const quota_record* r = records_.find(address)) return *r;
    return {};
  }

  /// Under the lock: the record of `address`, removed (and counted as freed) when it has
  /// `bytes`; none when `address` is not live here.
  [[gnu::always_inline]] quota_record take(std::uintptr_t address, std::size_t bytes) noexcept {
    if (newest_.load(std::memory_order_acquire) != address) [[unlikely]]
      return take_from_table(address, bytes);
    quota_record r = newest();
    if (r.bytes != bytes) [[unlikely]]
      return r;
    newest_.store(0, std::memory_order_relaxed);
    add(live, 0 - bytes);
    add(deallocations, 1);
    return r;
  }

  /// Under the lock: f(address, record) for every record here.
  template <class F>
  void for_each(F&& f) const {
    if (std::uintptr_t a = newest_.load(std::memory_order_acquire); a != 0) f(a, newest());
    records_.for_each(f);
  }

 private:
  [[gnu::noinline]] void settle() {
    records_.insert(newest_.load(std::memory_order_relaxed), newest());  // present already: the first record stays
    newest_.store(0, std::memory_order_relaxed);
  }

  [[gnu::noinline]] quota_record take_from_table(std::uintptr_t address, std::size_t bytes) noexcept {
    std::size_t slot = records_.locate(address);
    if (slot == records_.npos) return {};
    quota_record r = records_.at(slot);
    if (r.bytes != bytes) return r;
    records_.erase_at(slot);
    add(live, 0 - bytes);
    add(deallocations, 1);
    return r;
  }

  [[nodiscard, gnu::always_inline]] quota_record newest() const noexcept {
    return {tenant{newest_owner_.load(std::memory_order_relaxed)}, newest_bytes_.load(std::memory_order_relaxed)};
  }

  flat_map<quota_record> records_;  // address -> record of the other live allocations made here
  std::atomic<std::uintptr_t> newest_{0};
  std::atomic<std::uint32_t> newest_owner_{0};
  std::atomic<std::size_t> newest_bytes_{0};
};

}  // namespace vram::detail::adaptor

#pragma once
// vram::ledger_quota_adaptor<Upstream, Observer>: quota_adaptor whose limits and usage live in
// a vram::quota_ledger shared by processes, so every process that allocates through one is
// held to the same hard limits, exactly. The same adaptor, with another book.
//
//   auto ledger = vram::quota_ledger::attach("vram-gpu0");            // claims a process slot
//   vram::ledger_quota_adaptor<vram::cuda_device_source> charged(
//       vram::cuda_device_source{0}, {ledger, ledger->at("serving/llama")});
//   vram::stream_pool pool(vram::ref(charged));                        // the pool's chunks are charged
//
// Below a pool it charges what the process holds from the device (the pool's chunks, cached
// free bytes included); above one, the bytes requested. Which to choose: docs/quotas.md.

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include <vram/core/observer.hpp>
#include <vram/core/tenant_id.hpp>
#include <vram/core/throw.hpp>
#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/quota_ledger.hpp>

namespace vram {

/// A ledger and the tenant a process charges when a request names none.
struct ledger_tenant {
  std::shared_ptr<quota_ledger> ledger;
  tenant t;
};

namespace detail::adaptor {

/// The book of a quota_adaptor whose limits and usage are a quota_ledger's (quota_book.hpp).
class ledger_book {
 public:
  using argument = ledger_tenant;

  explicit ledger_book(argument a) : ledger_(std::move(a.ledger)), default_(a.t) {
    if (!ledger_) throw_invalid_argument("ledger_quota_adaptor", "no ledger");
    if (ledger_->access() != ledger_access::charge)
      throw_invalid_argument("ledger_quota_adaptor", "the ledger must be attached with charge access");
    if (!ledger_->contains(default_)) throw_invalid_argument("ledger_quota_adaptor", "unknown tenant");
  }

  [[nodiscard]] tenant default_tenant() const noexcept { return default_; }
  [[nodiscard]] bool contains(tenant t) const { return ledger_->contains(t); }
  [[nodiscard]] const char* name(tenant t) const noexcept { return ledger_->name(t); }
  [[nodiscard]] quota_ledger& ledger() const noexcept { return *ledger_; }

  charge_result charge(tenant t, std::size_t bytes) { return ledger_->charge(t, bytes); }
  void uncharge(tenant t, std::size_t bytes) noexcept { ledger_->uncharge(t, bytes); }

  template <class F>
  void for_each_level(tenant t, F&& f) const {
    for (;;) {
      f(t);
      if (!ledger_->parent(t, t)) return;
    }
  }

  void set_hard_limit(tenant t, std::size_t bytes) { ledger_->set_hard_limit(t, bytes); }
  void set_soft_limit(tenant t, std::size_t bytes) { ledger_->set_soft_limit(t, bytes); }
  [[nodiscard]] std::size_t hard_limit(tenant t) const { return ledger_->hard_limit(t); }
  [[nodiscard]] std::size_t soft_limit(tenant t) const { return ledger_->soft_limit(t); }
  [[nodiscard]] std::size_t usage(tenant t) const { return ledger_->usage(t); }
  [[nodiscard]] std::size_t peak_usage(tenant t) const { return ledger_->peak_usage(t); }
  [[nodiscard]] std::size_t refusals(tenant t) const { return ledger_->refusals(t); }

  /// This process's charges per tenant equal the adaptor's records (one adaptor per ledger
  /// handle), and the ledger's own invariant holds.
  void check(const std::vector<std::size_t>& own) const {
    for (std::size_t t = 0; t < ledger_->tenant_count(); ++t) {
      std::size_t mine = t < own.size() ? own[t] : 0;
      if (ledger_->charged(tenant{static_cast<std::uint32_t>(t)}) != mine)
        throw std::logic_error("ledger_quota_adaptor: the ledger's charges != recorded bytes");
    }
    ledger_->check_invariants();
  }

 private:
  std::shared_ptr<quota_ledger> ledger_;
  tenant default_;
};

}  // namespace detail::adaptor

/// quota_adaptor charging a quota_ledger. Give each adaptor its own ledger handle (attach):
/// the handle's process slot is the adaptor's account, and its check_invariants compares them.
template <class Upstream, class Observer = no_observer>
using ledger_quota_adaptor = quota_adaptor<Upstream, Observer, detail::adaptor::ledger_book>;

}  // namespace vram

#pragma once
// The forwarding every adaptor shares, written once so that no adaptor drops a capability of
// its upstream or forwards one it does not honour.

#include <cstddef>
#include <utility>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram::detail::adaptor {

/// The base of every adaptor `Derived` over `Upstream`:
/// - holds the upstream by value (an empty one takes no space) and gives it out by upstream();
/// - advertises exactly the upstream's properties;
/// - release(), owns() and stats() pass through when the upstream has them (an adaptor that
///   keeps its own records or counters defines its own owns() or stats(), which hide these);
/// - try_allocate() exists when the upstream has it, and goes through Derived's allocate(),
///   so the adaptor's own accounting sees the refusal (counted OOM, quota rolled back);
/// - check_invariants() passes through when the upstream has it; an adaptor that keeps records
///   defines its own, which checks them and then calls check_upstream_invariants().
/// Not forwarded: contiguous growth. Adaptors that record pointers cannot honour a free of a
/// piece of a merged range, so a pool over an adaptor grows in separate chunks.
template <class Derived, class Upstream>
class adaptor_base : public forward_properties<Derived, Upstream> {
 public:
  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }

  std::size_t release()
    requires has_release<Upstream>
  { return upstream_.release(); }

  [[nodiscard]] bool owns(const void* p) const
    requires has_owns<Upstream>
  { return upstream_.owns(p); }

  [[nodiscard]] vram::stats stats() const
    requires has_stats<Upstream>
  { return upstream_.stats(); }

  /// Like allocate(), but nullptr where it throws out_of_memory (counted as the adaptor counts it).
  [[nodiscard]] void* try_allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment)
    requires has_try_allocate<Upstream>
  {
    try {
      return static_cast<Derived&>(*this).allocate(s, bytes, align);
    } catch (const out_of_memory&) {
      return nullptr;
    }
  }

  void check_invariants() const
    requires has_check_invariants<Upstream>
  { upstream_.check_invariants(); }

 protected:
  explicit adaptor_base(Upstream upstream) : upstream_(std::move(upstream)) {}

  /// The upstream's check, where it has one (for an adaptor's own check_invariants()).
  void check_upstream_invariants() const {
    if constexpr (has_check_invariants<Upstream>) upstream_.check_invariants();
  }

  [[no_unique_address]] Upstream upstream_;
};

}  // namespace vram::detail::adaptor

#pragma once
// vram::ref(r) / vram::ref_t<R>: a typed, non-owning handle to a resource that forwards
// everything the resource has and nothing it lacks, so a pool (which cannot move) can sit
// under adaptors by value without losing its stats(), release(), owns() or try_allocate().

#include <cstddef>
#include <memory>
#include <type_traits>

#include <vram/core/concepts.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram {

/// Refers to a resource it does not own; the resource must outlive every copy.
///
/// Forwards allocate/deallocate (both forms), the properties, and each optional capability
/// of R exactly when R has it: try_allocate, owns, release, stats, check_invariants,
/// contiguous()/granularity() (frees go straight to R, so R's piece-freeing rules hold),
/// name(). Two refs are equal when their resources compare equal. A pointer's worth of
/// state, trivially copyable: stacks build it by value (`statistics_adaptor{vram::ref(pool)}`).
/// Where one type must stand for many resources, use resource_ref (type-erased) instead.
template <class R>
  requires resource<R>
class ref_t : public forward_properties<ref_t<R>, R> {
 public:
  /// A reference converts implicitly (as to resource_ref), so `adaptor<ref_t<P>> a(pool)` reads naturally.
  ref_t(R& r) noexcept : r_(std::addressof(r)) {}  // NOLINT(google-explicit-constructor)

  // The four calls are always inlined: a reference must cost nothing, and GCC would otherwise
  // call them out of line under an adaptor, with the pool's bin path inside them.
  [[gnu::always_inline]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return r_->allocate(s, bytes, align);
  }
  [[gnu::always_inline]] void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    r_->deallocate(s, p, bytes, align);
  }
  [[gnu::always_inline]] void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) { return r_->allocate_sync(bytes, align); }
  [[gnu::always_inline]] void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    r_->deallocate_sync(p, bytes, align);
  }

  [[nodiscard]] void* try_allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment)
    requires has_try_allocate<R>
  { return r_->try_allocate(s, bytes, align); }
  [[nodiscard]] bool owns(const void* p) const
    requires has_owns<R>
  { return r_->owns(p); }
  std::size_t release()
    requires has_release<R>
  { return r_->release(); }
  [[nodiscard]] vram::stats stats() const
    requires has_stats<R>
  { return r_->stats(); }
  void check_invariants() const
    requires has_check_invariants<R>
  { r_->check_invariants(); }
  [[nodiscard]] bool contiguous() const noexcept
    requires has_contiguous_growth<R>
  { return r_->contiguous(); }
  [[nodiscard]] std::size_t granularity() const noexcept
    requires has_contiguous_growth<R>
  { return r_->granularity(); }
  [[nodiscard]] const char* name() const noexcept { return name_of(*r_); }

  /// The resource referred to.
  [[nodiscard]] R& get() const noexcept { return *r_; }

  friend bool operator==(const ref_t& a, const ref_t& b) { return a.r_ == b.r_ || *a.r_ == *b.r_; }

 private:
  R* r_;
};

/// A ref_t to `r`: `statistics_adaptor{vram::ref(pool)}`.
template <class R>
  requires resource<R>
[[nodiscard]] ref_t<R> ref(R& r) noexcept {
  return ref_t<R>(r);
}

}  // namespace vram

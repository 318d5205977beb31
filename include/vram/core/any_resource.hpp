#pragma once
// vram::any_resource<Properties...>: an owning, type-erased resource, for API boundaries
// where a template parameter is not wanted. Move-only; holds its resource on the heap.

#include <utility>

#include <vram/core/resource_ref.hpp>

namespace vram {

template <class... Properties>
class any_resource {
 public:
  template <class R>
    requires(!std::is_same_v<std::remove_cvref_t<R>, any_resource> &&
             resource_with<std::remove_cvref_t<R>, Properties...>)
  any_resource(R&& r)  // NOLINT(google-explicit-constructor)
      : object_(new std::remove_cvref_t<R>(std::forward<R>(r))),
        vtable_(&detail::vtable_for<std::remove_cvref_t<R>>) {}

  any_resource(any_resource&& o) noexcept
      : object_(std::exchange(o.object_, nullptr)), vtable_(o.vtable_) {}
  any_resource& operator=(any_resource&& o) noexcept {
    any_resource tmp(std::move(o));
    std::swap(object_, tmp.object_);
    std::swap(vtable_, tmp.vtable_);
    return *this;
  }
  any_resource(const any_resource&) = delete;
  any_resource& operator=(const any_resource&) = delete;
  ~any_resource() {
    if (object_ != nullptr) vtable_->destroy(object_);
  }

  /// False after being moved from.
  [[nodiscard]] explicit operator bool() const noexcept { return object_ != nullptr; }

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return vtable_->allocate(object_, s, bytes, align);
  }
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    vtable_->deallocate(object_, s, p, bytes, align);
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return vtable_->allocate_sync(object_, bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    vtable_->deallocate_sync(object_, p, bytes, align);
  }

  /// The held resource, if it is an `R` (else nullptr).
  template <class R>
  [[nodiscard]] R* target() noexcept {
    return vtable_ == &detail::vtable_for<R> ? static_cast<R*>(object_) : nullptr;
  }

  // A template, so no implicit conversion to any_resource is considered (that would recurse
  // into the concept checks of the converting constructor).
  template <class T>
    requires std::is_same_v<T, any_resource>
  friend bool operator==(const T& a, const T& b) {
    return a.vtable_->type == b.vtable_->type && a.vtable_->equal(a.object_, b.object_);
  }

  template <class P>
    requires(std::is_same_v<P, Properties> || ...)
  friend constexpr void get_property(const any_resource&, P) noexcept {}

 private:
  void* object_;
  const detail::resource_vtable* vtable_;
};

static_assert(resource<any_resource<>>);

}  // namespace vram

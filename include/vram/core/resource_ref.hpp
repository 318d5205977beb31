#pragma once
// vram::resource_ref<Properties...>: a non-owning, type-erased reference to any vram::resource
// with the given properties (cuda::mr::resource_ref's shape). Two words: object + vtable.

#include <cstddef>
#include <type_traits>

#include <vram/core/concepts.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram {

namespace detail {
struct resource_vtable {
  void* (*allocate)(void*, stream_ref, std::size_t, std::size_t);
  void (*deallocate)(void*, stream_ref, void*, std::size_t, std::size_t) noexcept;
  void* (*allocate_sync)(void*, std::size_t, std::size_t);
  void (*deallocate_sync)(void*, void*, std::size_t, std::size_t) noexcept;
  bool (*equal)(const void*, const void*);
  const void* type;  // identity of the erased type, so == compares like types only
  void (*destroy)(void*) noexcept;  // used by any_resource only
};

template <class R>
struct type_tag {
  static constexpr char id = 0;
};

template <class R>
inline constexpr resource_vtable vtable_for{
    [](void* r, stream_ref s, std::size_t b, std::size_t a) { return static_cast<R*>(r)->allocate(s, b, a); },
    [](void* r, stream_ref s, void* p, std::size_t b, std::size_t a) noexcept {
      static_cast<R*>(r)->deallocate(s, p, b, a);
    },
    [](void* r, std::size_t b, std::size_t a) { return static_cast<R*>(r)->allocate_sync(b, a); },
    [](void* r, void* p, std::size_t b, std::size_t a) noexcept { static_cast<R*>(r)->deallocate_sync(p, b, a); },
    [](const void* a, const void* b) { return *static_cast<const R*>(a) == *static_cast<const R*>(b); },
    &type_tag<R>::id,
    [](void* r) noexcept { delete static_cast<R*>(r); },
};
}  // namespace detail

/// Refers to a resource it does not own; the resource must outlive the reference.
/// Has exactly the properties it was declared with.
template <class... Properties>
class resource_ref {
 public:
  template <class R>
    requires(!std::is_same_v<std::remove_cvref_t<R>, resource_ref> && resource_with<R, Properties...>)
  resource_ref(R& r) noexcept  // NOLINT(google-explicit-constructor): a reference converts implicitly
      : object_(&r), vtable_(&detail::vtable_for<R>) {}

  /// Narrowing to fewer properties is allowed.
  template <class... Others>
    requires(sizeof...(Others) > sizeof...(Properties) && (has_property<resource_ref<Others...>, Properties> && ...))
  resource_ref(const resource_ref<Others...>& other) noexcept  // NOLINT(google-explicit-constructor)
      : object_(other.object_), vtable_(other.vtable_) {}

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

  /// Equal when both refer to resources of the same type that compare equal.
  // A template, so no implicit conversion to resource_ref is considered (that would recurse
  // into the concept checks of the converting constructor).
  template <class T>
    requires std::is_same_v<T, resource_ref>
  friend bool operator==(const T& a, const T& b) {
    return a.vtable_->type == b.vtable_->type && a.vtable_->equal(a.object_, b.object_);
  }

  template <class P>
    requires(std::is_same_v<P, Properties> || ...)
  friend constexpr void get_property(const resource_ref&, P) noexcept {}

 private:
  template <class...>
  friend class resource_ref;
  void* object_;
  const detail::resource_vtable* vtable_;
};

static_assert(resource<resource_ref<>>);
static_assert(resource_with<resource_ref<device_accessible>, device_accessible>);
static_assert(!has_property<resource_ref<device_accessible>, host_accessible>);

}  // namespace vram

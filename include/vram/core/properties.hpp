#pragma once
// Resource properties: empty tags a resource advertises through a hidden friend
// `get_property(const R&, P)`, found by ADL (the cuda::mr shape).

#include <type_traits>

namespace vram {

/// Memory a kernel on the device may access.
struct device_accessible {};
/// Memory the host may access.
struct host_accessible {};

/// True when `R` advertises property `P`.
template <class R, class P>
concept has_property = requires(const R& r) { get_property(r, P{}); };

/// Adaptors derive from this to advertise every property their `Upstream` has: the friend
/// below exists exactly for the properties of Upstream (ADL finds friends of base classes).
template <class Derived, class Upstream>
struct forward_properties {
  template <class P>
    requires has_property<Upstream, P>
  friend constexpr void get_property(const Derived&, P) noexcept {}
};

}  // namespace vram

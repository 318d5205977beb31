#pragma once
// vram::device_registry: which resource serves which device (RMM's per-device resource, as
// an explicit object instead of function-local statics).

#include <cstddef>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <utility>
#include <vector>

#include <vram/core/concepts.hpp>
#include <vram/core/config.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/resource_ref.hpp>
#include <vram/core/throw.hpp>

namespace vram {

/// Returns the calling thread's current device id.
using current_device_fn = int (*)();

namespace detail {
/// The CUDA current device (cudaGetDevice); 0 without CUDA, where there is one "device".
inline int interop_cuda_current_device() {
#if VRAM_HAS_CUDA
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
#else
  return 0;
#endif
}

inline int interop_cuda_device_count() {
#if VRAM_HAS_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no GPU: behave like a host build
    return 1;
  }
  return count > 0 ? count : 1;
#else
  return 1;
#endif
}
}  // namespace detail

/// A registered resource bound to its device: allocating from it while another device is
/// current throws vram::wrong_device (instead of handing out memory on a device the caller's
/// kernels do not run on). Deallocation is allowed from any device: the memory goes back to
/// the resource that owns it. A non-owning reference: the registered resource must outlive it.
template <class... Properties>
class device_bound_ref {
 public:
  device_bound_ref(resource_ref<Properties...> ref, int device, current_device_fn current) noexcept
      : ref_(ref), device_(device), current_(current) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "device_registry"; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] resource_ref<Properties...> get() const noexcept { return ref_; }

  /// Throws wrong_device when device() is not current, else whatever the resource throws.
  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    check_device();
    return ref_.allocate(s, bytes, align);
  }
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    ref_.deallocate(s, p, bytes, align);
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    check_device();
    return ref_.allocate_sync(bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    ref_.deallocate_sync(p, bytes, align);
  }

  friend bool operator==(const device_bound_ref& a, const device_bound_ref& b) {
    return a.device_ == b.device_ && a.ref_ == b.ref_;
  }

  template <class P>
    requires(std::is_same_v<P, Properties> || ...)
  friend constexpr void get_property(const device_bound_ref&, P) noexcept {}

 private:
  void check_device() const {
    int current = current_();
    if (current != device_) [[unlikely]]
      detail::throw_wrong_device(name(), device_, current);
  }

  resource_ref<Properties...> ref_;
  int device_;
  current_device_fn current_;
};

static_assert(resource_with<device_bound_ref<device_accessible>, device_accessible>);

/// Maps device ids to the resources that serve them.
///
/// Purpose: multi-GPU code asks "the resource for device d" in one place. It is an explicit
/// object the application creates and passes around (or keeps in one shared library), not a
/// hidden static: a header included into several shared libraries would otherwise give each
/// library its own silent copy of "the" per-device table.
/// Entries are non-owning references: a registered resource must outlive its registration.
/// Errors: an id outside [0, device_count()) or an unregistered device is
/// vram::invalid_argument; registering a resource that knows its device (a `device()` member,
/// like cuda_device_source) for another id, or allocating through get(d) while device d is
/// not current, is vram::wrong_device.
/// Thread safety: all members may be called concurrently (a reader-writer lock; get() takes
/// it shared). Complexity: O(1) per call.
/// The current device comes from `current_device_fn` (cudaGetDevice by default, 0 without
/// CUDA); tests and host code may supply their own, so fake device ids work without a GPU.
template <class... Properties>
class basic_device_registry {
 public:
  /// A registry for devices 0 .. device_count-1 (default: the CUDA device count, 1 without).
  explicit basic_device_registry(int device_count = detail::interop_cuda_device_count(),
                                 current_device_fn current = &detail::interop_cuda_current_device)
      : current_(current != nullptr ? current : &detail::interop_cuda_current_device) {
    if (device_count <= 0) detail::throw_invalid_argument(name(), "device_count must be positive");
    slots_.resize(static_cast<std::size_t>(device_count));
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "device_registry"; }
  [[nodiscard]] int device_count() const noexcept { return static_cast<int>(slots_.size()); }
  [[nodiscard]] int current_device() const { return current_(); }

  /// Registers `r` for `device`, replacing any previous registration (the previous resource
  /// is not touched: it is not owned). Throws wrong_device when `r` reports another device.
  template <class R>
    requires(!std::is_same_v<std::remove_cvref_t<R>, resource_ref<Properties...>> && resource_with<R, Properties...>)
  void set(int device, R& r) {
    if constexpr (requires { { r.device() } -> std::convertible_to<int>; }) {
      if (static_cast<int>(r.device()) != device) detail::throw_wrong_device(name(), device, static_cast<int>(r.device()));
    }
    set(device, resource_ref<Properties...>(r));
  }
  void set(int device, resource_ref<Properties...> r) {
    std::size_t i = index(device);
    std::unique_lock lock(mutex_);
    slots_[i] = r;
  }

  /// Forgets the registration of `device` (no-op when there is none).
  void reset(int device) {
    std::size_t i = index(device);
    std::unique_lock lock(mutex_);
    slots_[i].reset();
  }

  [[nodiscard]] bool contains(int device) const {
    std::size_t i = index(device);
    std::shared_lock lock(mutex_);
    return slots_[i].has_value();
  }

  /// The resource of `device`, bound to it. Throws invalid_argument when none is registered.
  [[nodiscard]] device_bound_ref<Properties...> get(int device) const {
    std::size_t i = index(device);
    std::shared_lock lock(mutex_);
    if (!slots_[i]) detail::throw_invalid_argument(name(), "no resource registered for this device");
    return device_bound_ref<Properties...>(*slots_[i], device, current_);
  }

  /// The resource of the current device.
  [[nodiscard]] device_bound_ref<Properties...> get_current() const { return get(current_()); }

 private:
  std::size_t index(int device) const {
    if (device < 0 || device >= device_count()) detail::throw_invalid_argument(name(), "device id out of range");
    return static_cast<std::size_t>(device);
  }

  mutable std::shared_mutex mutex_;
  std::vector<std::optional<resource_ref<Properties...>>> slots_;  // slots_.size() == device_count()
  current_device_fn current_;
};

/// The registry of device memory resources.
using device_registry = basic_device_registry<device_accessible>;

}  // namespace vram

#pragma once
// vram::cuda_managed_source: unified memory from cudaMallocManaged.

#include <vram/source/detail/cuda_only.hpp>  // first: stops a build without CUDA with a message

#include <cstddef>

#include <vram/core/concepts.hpp>
#include <vram/core/config.hpp>
#include <vram/core/event.hpp>
#include <vram/detail/synchronous_source.hpp>
#include <vram/detail/cuda_device_guard.hpp>

#if VRAM_HAS_CUDA
namespace vram {

/// Managed (unified) memory: host and device may both access it; the driver migrates pages.
/// Oversubscribing the device with it pages silently (up to 100x slower), which is why
/// budget_slab spills explicitly instead.
///
/// Thread safety, zero bytes, errors: as cuda_device_source. Streams: usable at once;
/// deallocate(s, ...) synchronizes `s` first. Alignment: 256 bytes.
class cuda_managed_source : public detail::synchronous_source<cuda_managed_source> {
 public:
  [[nodiscard]] static constexpr const char* name() noexcept { return "cuda_managed_source"; }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (align > default_alignment) detail::throw_invalid_argument(name(), "alignment above 256 bytes");
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    detail::check_cuda_allocation(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal), name(), "cudaMallocManaged",
                                  bytes, stream_ref{});
    return p;
  }

  void deallocate_sync(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    if (p == nullptr) return;
    detail::report_cuda_free(cudaFree(p), name(), p, bytes);
  }

  // allocate(stream_ref, ...) and deallocate(stream_ref, ...): detail::synchronous_source.

  friend constexpr bool operator==(const cuda_managed_source&, const cuda_managed_source&) noexcept { return true; }
  friend constexpr void get_property(const cuda_managed_source&, device_accessible) noexcept {}
  friend constexpr void get_property(const cuda_managed_source&, host_accessible) noexcept {}
};

static_assert(resource_with<cuda_managed_source, device_accessible, host_accessible>);

}  // namespace vram
#endif

#pragma once
// vram::cuda_pinned_source: page-locked, mapped host memory (cudaHostAlloc) that kernels can read.

#include <vram/source/detail/cuda_only.hpp>  // first: stops a build without CUDA with a message

#include <cstddef>

#include <vram/core/concepts.hpp>
#include <vram/core/config.hpp>
#include <vram/core/event.hpp>
#include <vram/detail/synchronous_source.hpp>
#include <vram/detail/cuda_device_guard.hpp>

#if VRAM_HAS_CUDA
namespace vram {

/// Pinned host memory allocated with cudaHostAllocMapped | cudaHostAllocPortable: the host
/// reads and writes it directly, and a kernel may use the same pointer over the bus (with
/// unified addressing the device pointer equals the host pointer; allocate checks that).
/// It is budget_slab's default spill target.
///
/// Thread safety: all members may be called concurrently. Streams: usable at once;
/// deallocate(s, ...) synchronizes `s` before cudaFreeHost. Alignment: up to 4096 bytes (a page).
/// Zero bytes and errors: as cuda_device_source.
class cuda_pinned_source : public detail::synchronous_source<cuda_pinned_source> {
 public:
  [[nodiscard]] static constexpr const char* name() noexcept { return "cuda_pinned_source"; }
  static constexpr std::size_t page_alignment = 4096;

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (align > page_alignment) detail::throw_invalid_argument(name(), "alignment above a page");
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    detail::check_cuda_allocation(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable), name(),
                                  "cudaHostAlloc", bytes, stream_ref{});
    void* device_pointer = nullptr;
    cudaError_t status = cudaHostGetDevicePointer(&device_pointer, p, 0);
    if (status != cudaSuccess || device_pointer != p) {
      (void)cudaFreeHost(p);
      detail::check_cuda(status == cudaSuccess ? cudaErrorNotSupported : status, "cudaHostGetDevicePointer");
    }
    return p;
  }

  void deallocate_sync(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    if (p == nullptr) return;
    detail::report_cuda_free(cudaFreeHost(p), name(), p, bytes);
  }

  // allocate(stream_ref, ...) and deallocate(stream_ref, ...): detail::synchronous_source.

  friend constexpr bool operator==(const cuda_pinned_source&, const cuda_pinned_source&) noexcept { return true; }
  friend constexpr void get_property(const cuda_pinned_source&, device_accessible) noexcept {}
  friend constexpr void get_property(const cuda_pinned_source&, host_accessible) noexcept {}
};

static_assert(resource_with<cuda_pinned_source, device_accessible, host_accessible>);

}  // namespace vram
#endif

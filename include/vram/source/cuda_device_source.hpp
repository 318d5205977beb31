#pragma once
// vram::cuda_device_source: device memory from cudaMalloc / cudaFree.

#include <vram/source/detail/cuda_only.hpp>  // first: stops a build without CUDA with a message

#include <cstddef>

#include <vram/core/concepts.hpp>
#include <vram/core/config.hpp>
#include <vram/core/event.hpp>
#include <vram/detail/synchronous_source.hpp>
#include <vram/detail/cuda_device_guard.hpp>

#if VRAM_HAS_CUDA
namespace vram {

/// Device memory of one device, straight from cudaMalloc: slow (microseconds to milliseconds,
/// and cudaFree synchronizes the device), which is why pools sit on top of it.
///
/// Thread safety: all members may be called concurrently.
/// Streams: cudaMalloc memory is usable on every stream at once; deallocate(s, ...) first
/// synchronizes `s` (cudaFree would synchronize the device anyway).
/// Alignment: 256 bytes (cudaMalloc's guarantee); a larger alignment is an invalid argument.
/// Zero bytes: allocate returns nullptr; deallocate(nullptr, ...) does nothing.
/// Errors: out_of_memory on cudaErrorMemoryAllocation, cuda_error otherwise; a pointer cudaFree
/// rejects is reported as a foreign pointer.
class cuda_device_source : public detail::synchronous_source<cuda_device_source> {
 public:
  /// Binds to `device`; by default the device current at construction.
  explicit cuda_device_source(int device = current_device()) : device_(device) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "cuda_device_source"; }
  [[nodiscard]] int device() const noexcept { return device_; }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (align > default_alignment) detail::throw_invalid_argument(name(), "alignment above 256 bytes");
    if (bytes == 0) return nullptr;
    detail::cuda_device_guard guard(device_);
    void* p = nullptr;
    detail::check_cuda_allocation(cudaMalloc(&p, bytes), name(), "cudaMalloc", bytes, stream_ref{});
    return p;
  }

  void deallocate_sync(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    if (p == nullptr) return;
    detail::report_cuda_free(cudaFree(p), name(), p, bytes);
  }

  // allocate(stream_ref, ...) and deallocate(stream_ref, ...): detail::synchronous_source.

  friend bool operator==(const cuda_device_source& a, const cuda_device_source& b) noexcept {
    return a.device_ == b.device_;
  }
  friend constexpr void get_property(const cuda_device_source&, device_accessible) noexcept {}

  static int current_device() {
    int d = 0;
    detail::check_cuda(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }

 private:
  int device_;
};

static_assert(resource_with<cuda_device_source, device_accessible>);

}  // namespace vram
#endif

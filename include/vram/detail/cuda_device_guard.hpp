#pragma once
// Makes a device current for a scope and restores the previous one (CUDA builds only).

#include <vram/core/config.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/throw.hpp>

#if VRAM_HAS_CUDA
namespace vram::detail {

class cuda_device_guard {
 public:
  explicit cuda_device_guard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;
  ~cuda_device_guard() { (void)cudaSetDevice(previous_); }  // cannot report from a destructor

 private:
  int previous_ = 0;
};

/// Runs a CUDA allocation call; out-of-memory becomes vram::out_of_memory, other errors cuda_error.
inline void check_cuda_allocation(cudaError_t status, const char* resource, const char* call, std::size_t bytes,
                                  stream_ref s) {
  if (status == cudaSuccess) [[likely]] return;
  (void)cudaGetLastError();
  if (status == cudaErrorMemoryAllocation) throw_out_of_memory(resource, bytes, s);
  throw_cuda_error(static_cast<int>(status), call);
}

/// Reports a failed free from a noexcept deallocate: an invalid pointer is the caller's misuse.
inline void report_cuda_free(cudaError_t status, const char* resource, void* p, std::size_t bytes) noexcept {
  if (status == cudaSuccess) [[likely]] return;
  (void)cudaGetLastError();
  report_misuse({status == cudaErrorInvalidValue ? misuse::foreign_pointer : misuse::upstream_failure, resource, p,
                 bytes, 0});
}

}  // namespace vram::detail
#endif

#pragma once
// The one place vram throws from (STYLE rule 7). Every function is [[noreturn]] and
// cold, so the hot paths that call them stay small. It sits in core because core throws
// (events, tenant scopes) and core includes nothing above itself; the functions keep
// namespace vram::detail, being no part of the API.

#include <cstddef>
#include <string>

#include <vram/core/alignment.hpp>
#include <vram/core/config.hpp>
#include <vram/core/error.hpp>

namespace vram::detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_out_of_memory(const char* resource, std::size_t bytes,
                                                                     stream_ref stream, const stats& snapshot = {},
                                                                     std::size_t limit = 0,
                                                                     const char* limit_name = "limit",
                                                                     const stream_stranding& stranded = {}) {
  throw out_of_memory(resource, bytes, stream, snapshot, limit, limit_name, stranded);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_quota_exceeded(const char* resource, std::size_t bytes,
                                                                      stream_ref stream, tenant requester,
                                                                      tenant limited, const char* tenant_name,
                                                                      std::size_t limit, std::size_t usage,
                                                                      const char* requester_name = nullptr) {
  throw quota_exceeded(resource, bytes, stream, requester, limited, tenant_name, limit, usage, requester_name);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_budgets_exhausted(const char* resource, std::size_t bytes,
                                                                         stream_ref stream, const stats& snapshot,
                                                                         std::size_t device_budget,
                                                                         std::size_t spill_budget) {
  throw budgets_exhausted(resource, bytes, stream, snapshot, device_budget, spill_budget);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_wrong_device(const char* resource, int expected, int actual) {
  throw wrong_device(resource, expected, actual);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_invalid_argument(const char* resource, const char* what) {
  throw invalid_argument(std::string("vram: ") + resource + ": " + what);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cuda_error(int code, const char* call) {
  std::string message = std::string("vram: ") + call + " failed: error " + std::to_string(code);
#if VRAM_HAS_CUDA
  message += std::string(" (") + cudaGetErrorName(static_cast<cudaError_t>(code)) + ": " +
             cudaGetErrorString(static_cast<cudaError_t>(code)) + ")";
#endif
  throw cuda_error(code, message);
}

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_ledger_error(ledger_error::reason r, const std::string& path,
                                                                    const std::string& what) {
  throw ledger_error(r, "vram: quota ledger " + path + ": " + what);
}

/// A CUDA operation was asked of a build without CUDA.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_no_cuda(const char* what) {
  throw cuda_error(35 /* cudaErrorInsufficientDriver */, std::string("vram: ") + what + ": built without CUDA");
}

/// Validates the arguments every allocate() shares: a valid alignment, a sane size.
inline void check_request(const char* resource, std::size_t bytes, std::size_t alignment) {
  if (!is_valid_alignment(alignment)) [[unlikely]]
    throw_invalid_argument(resource, "alignment must be a power of two no larger than vram::max_alignment");
  if (bytes > max_request_bytes) [[unlikely]]
    throw_invalid_argument(resource, "request larger than vram::max_request_bytes");
}

#if VRAM_HAS_CUDA
/// Throws cuda_error unless `status` is cudaSuccess; memory exhaustion is out_of_memory.
inline void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) [[likely]] return;
  (void)cudaGetLastError();  // clear the sticky-free error state for the next call
  throw_cuda_error(static_cast<int>(status), call);
}
#endif

}  // namespace vram::detail

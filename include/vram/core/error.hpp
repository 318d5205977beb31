#pragma once
// The error types every vram resource throws. They form one small family, so they share
// this header (an exception to "one class per header": a user catching one wants all).
//
//   std::bad_alloc      <- vram::out_of_memory      (no memory: bytes, stream, resource, stats)
//   std::runtime_error  <- vram::cuda_error         (a CUDA call failed: the cudaError_t)
//   std::invalid_argument <- vram::invalid_argument (bad alignment, absurd size, ...)
//
// vram::quota_exceeded (an out_of_memory) lives with the quota adaptor.

#include <cstddef>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>

#include <vram/core/config.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram {

/// Thrown when a resource cannot provide the requested bytes. Constructing it and calling
/// what() allocate nothing: the message is formatted into a fixed buffer.
class out_of_memory : public std::bad_alloc {
 public:
  /// `resource` must be a string with static storage duration (a literal). `limit`, when not 0,
  /// is the cap the resource was configured with (a pool's maximum_size), named by `limit_name`
  /// (a literal), so the message says which cap refused.
  out_of_memory(const char* resource, std::size_t bytes, stream_ref stream, const vram::stats& snapshot = {},
                std::size_t limit = 0, const char* limit_name = "limit") noexcept
      : resource_(resource), bytes_(bytes), stream_(stream), stats_(snapshot), limit_(limit) {
    if (limit != 0)
      std::snprintf(message_, sizeof message_,
                    "vram: out of memory in %s: %zu bytes requested (%zu live, %zu reserved; its %s is %zu bytes)",
                    resource, bytes, snapshot.live_bytes, snapshot.reserved_bytes, limit_name, limit);
    else
      std::snprintf(message_, sizeof message_,
                    "vram: out of memory in %s: %zu bytes requested (%zu live, %zu reserved)", resource, bytes,
                    snapshot.live_bytes, snapshot.reserved_bytes);
  }

  [[nodiscard]] const char* what() const noexcept override { return message_; }
  [[nodiscard]] const char* resource() const noexcept { return resource_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  /// The failing resource's statistics at the time of the failure (zeros where it has none).
  [[nodiscard]] const vram::stats& stats() const noexcept { return stats_; }
  /// The configured cap that refused (0: none; the upstream ran out).
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }

 protected:
  char message_[256];  // protected: derived errors format their own message

 private:
  const char* resource_;
  std::size_t bytes_;
  stream_ref stream_;
  vram::stats stats_;
  std::size_t limit_;
};

/// Thrown when a CUDA call fails for a reason other than memory exhaustion.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  /// The cudaError_t (as int, so this header needs no CUDA headers; cast it back).
  [[nodiscard]] int code() const noexcept { return code_; }
#if VRAM_HAS_CUDA
  [[nodiscard]] cudaError_t error() const noexcept { return static_cast<cudaError_t>(code_); }
#endif

 private:
  int code_;
};

/// Thrown for requests that can never succeed: alignment not a power of two or too large,
/// a size beyond any capacity, a configuration that contradicts itself.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace vram

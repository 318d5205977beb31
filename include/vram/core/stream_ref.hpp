#pragma once
// vram::stream_ref: a non-owning reference to a CUDA stream, a host_stream, or the
// synchronous "stream" (no stream at all: everything happens in program order).

#include <cstdint>
#include <cstddef>

#include <vram/core/host_stream.hpp>

struct CUstream_st;  // cudaStream_t is CUstream_st*; declared so this header needs no CUDA headers

namespace vram {

/// Refers to the stream an allocation is ordered on. Cheap to copy (two words).
///
/// - stream_ref{} is the synchronous stream: memory freed on it may be reused at once by
///   anyone, and memory allocated on it is ready at once. allocate_sync() uses it.
/// - stream_ref{host_stream&} orders work on a host_stream (tests, CPU users).
/// - stream_ref{cudaStream_t} orders work on a CUDA stream; nullptr is the legacy default stream.
///
/// The referenced stream must outlive every use of the reference. Operations on streams
/// (synchronize, wait on an event, run after pending work) are in <vram/core/event.hpp>.
class stream_ref {
 public:
  enum class kind : std::uint8_t { synchronous, host, cuda };

  constexpr stream_ref() noexcept = default;
  stream_ref(host_stream& s) noexcept : handle_(&s), kind_(kind::host) {}  // NOLINT(google-explicit-constructor)
  stream_ref(CUstream_st* s) noexcept : handle_(s), kind_(kind::cuda) {}   // NOLINT(google-explicit-constructor)
  stream_ref(std::nullptr_t) = delete;  // ambiguous: say stream_ref{} or stream_ref::cuda_default()

  [[nodiscard]] static constexpr stream_ref synchronous() noexcept { return {}; }
  [[nodiscard]] static stream_ref cuda_default() noexcept { return stream_ref{static_cast<CUstream_st*>(nullptr)}; }

  [[nodiscard]] constexpr kind type() const noexcept { return kind_; }
  [[nodiscard]] constexpr bool is_synchronous() const noexcept { return kind_ == kind::synchronous; }
  [[nodiscard]] constexpr bool is_host() const noexcept { return kind_ == kind::host; }
  [[nodiscard]] constexpr bool is_cuda() const noexcept { return kind_ == kind::cuda; }

  /// The host_stream; pre: is_host().
  [[nodiscard]] host_stream& host() const noexcept { return *static_cast<host_stream*>(handle_); }
  /// The CUDA stream handle; pre: is_cuda().
  [[nodiscard]] CUstream_st* cuda() const noexcept { return static_cast<CUstream_st*>(handle_); }

  /// A value that identifies the stream, for use as a map key. 0 is the synchronous stream;
  /// the CUDA legacy default stream has the key of cudaStreamLegacy (1), as the two are one.
  [[nodiscard]] std::uintptr_t key() const noexcept {
    // Only the synchronous stream and the legacy default stream have no handle.
    if (handle_ != nullptr) return reinterpret_cast<std::uintptr_t>(handle_);
    return kind_ == kind::cuda ? 1 : 0;
  }

  friend constexpr bool operator==(stream_ref a, stream_ref b) noexcept {
    return a.kind_ == b.kind_ && a.handle_ == b.handle_;
  }

 private:
  void* handle_ = nullptr;
  kind kind_ = kind::synchronous;
};

}  // namespace vram


#pragma once
// vram::cuda_mr_adaptor<R>: any vram resource as a CCCL `cuda::mr` memory resource, so it
// plugs into cuda::mr::resource_ref / async_resource_ref and the CUDA code built on them.
//
// CUDA only: it compiles to nothing unless VRAM_HAS_CUDA and CCCL's <cuda/memory_resource>
// is on the include path; VRAM_HAS_CUDA_MR says which. nvcc finds CCCL by itself; with the
// host compiler and CUDA 13+, add ${CUDAToolkit_INCLUDE_DIRS}/cccl to the include path.
// CCCL's memory resources are experimental before CCCL 3.1:
// this header defines LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE, which must be in effect
// before *any* CCCL header is included. Include this header first, or define the macro on
// the command line (-DLIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE).
//
// The two CCCL namings are both served, so one adaptor works with every toolkit:
//   CCCL 3.0 (CUDA 13.0):  allocate(bytes, align)            deallocate(p, bytes, align)
//                          allocate_async(bytes, align, s)   deallocate_async(p, bytes, align, s)
//   CCCL 3.1+:             allocate_sync(bytes, align)       deallocate_sync(p, bytes, align)
//                          allocate(s, bytes, align)         deallocate(s, p, bytes, align)
// The static_asserts at the end prove the concepts of the CCCL version being compiled against.

#include <vram/core/config.hpp>

#if VRAM_HAS_CUDA && __has_include(<cuda/memory_resource>)
#  define VRAM_HAS_CUDA_MR 1
#else
#  define VRAM_HAS_CUDA_MR 0
#endif

#if VRAM_HAS_CUDA_MR

#  ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#    define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#  endif

#  include <cstddef>
#  include <type_traits>
#  include <utility>

#  include <cuda/memory_resource>
#  include <cuda/stream_ref>
#  include <cuda/version>

#  include <vram/core/concepts.hpp>
#  include <vram/core/properties.hpp>
#  include <vram/core/ref.hpp>
#  include <vram/core/resource_ref.hpp>
#  include <vram/core/stream_ref.hpp>

#  if !defined(CCCL_VERSION)
#    error "vram/interop/cuda_mr.hpp: CCCL_VERSION not defined; is the CCCL in the toolkit too old (< 2.x)?"
#  endif
/// 1 when the CCCL being compiled against names the memory-resource concepts the 3.1+ way.
#  define VRAM_CCCL_NEW_MR_NAMING (CCCL_VERSION >= 3001000)

namespace vram {

namespace detail {
template <class P>
inline constexpr bool interop_is_cuda_property =
    std::is_same_v<P, ::cuda::mr::device_accessible> || std::is_same_v<P, ::cuda::mr::host_accessible>;

/// The vram property that corresponds to a cuda::mr property.
template <class P>
using interop_vram_property =
    std::conditional_t<std::is_same_v<P, ::cuda::mr::device_accessible>, vram::device_accessible, vram::host_accessible>;
}  // namespace detail

/// A vram resource seen through CCCL's cuda::mr concepts.
///
/// Purpose: hand a vram pool (with its statistics, quotas, tracking) to code written against
/// cuda::mr (CCCL containers, cuda::mr::resource_ref parameters, libraries built on CCCL).
/// Streams: the stream-ordered calls (allocate_async / allocate(stream, ...)) forward the
/// cuda::stream_ref to `R` as a vram::stream_ref on that CUDA stream; the synchronous calls
/// use the synchronous stream. The stream contract is `R`'s (stream_pool: free on the stream
/// the memory was last used on, or after an event).
/// Properties: cuda::mr::device_accessible / host_accessible exactly when `R` has
/// vram::device_accessible / host_accessible.
/// Alignment: `R`'s; the default alignment is 256 bytes, like cudaMalloc.
/// Upstream: `R` held by value. Share a non-copyable pool through
/// vram::ref(pool); make_cuda_mr(pool) does that for you.
/// Errors: those of `R` (vram::out_of_memory is a std::bad_alloc, as cuda::mr expects).
/// Thread safety and complexity: those of `R`.
template <class R>
  requires vram::resource<R>
class cuda_mr_adaptor {
 public:
  explicit cuda_mr_adaptor(R resource) noexcept(std::is_nothrow_move_constructible_v<R>)
      : resource_(std::move(resource)) {}

  // ---- CCCL 3.0 naming (synchronous allocate/deallocate, *_async) ---------------------------
  void* allocate(std::size_t bytes, std::size_t align = default_alignment) {
    return resource_.allocate_sync(bytes, align);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    resource_.deallocate_sync(p, bytes, align);
  }
  void* allocate_async(std::size_t bytes, std::size_t align, ::cuda::stream_ref s) {
    return resource_.allocate(to_vram(s), bytes, align);
  }
  void* allocate_async(std::size_t bytes, ::cuda::stream_ref s) { return allocate_async(bytes, default_alignment, s); }
  void deallocate_async(void* p, std::size_t bytes, std::size_t align, ::cuda::stream_ref s) noexcept {
    resource_.deallocate(to_vram(s), p, bytes, align);
  }
  void deallocate_async(void* p, std::size_t bytes, ::cuda::stream_ref s) noexcept {
    deallocate_async(p, bytes, default_alignment, s);
  }

  // ---- CCCL 3.1+ naming (allocate_sync, stream-first allocate) -------------------------------
  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return resource_.allocate_sync(bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    resource_.deallocate_sync(p, bytes, align);
  }
  void* allocate(::cuda::stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return resource_.allocate(to_vram(s), bytes, align);
  }
  void deallocate(::cuda::stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    resource_.deallocate(to_vram(s), p, bytes, align);
  }

  [[nodiscard]] R& upstream() noexcept { return resource_; }
  [[nodiscard]] const R& upstream() const noexcept { return resource_; }

  friend bool operator==(const cuda_mr_adaptor& a, const cuda_mr_adaptor& b) { return a.resource_ == b.resource_; }
  friend bool operator!=(const cuda_mr_adaptor& a, const cuda_mr_adaptor& b) { return !(a == b); }

  /// cuda::mr properties, mapped from R's vram properties.
  template <class P>
    requires(detail::interop_is_cuda_property<P> && has_property<R, detail::interop_vram_property<P>>)
  friend constexpr void get_property(const cuda_mr_adaptor&, P) noexcept {}

 private:
  static vram::stream_ref to_vram(::cuda::stream_ref s) noexcept {
    return vram::stream_ref(static_cast<CUstream_st*>(s.get()));
  }

  R resource_;
};

namespace detail {
/// What make_cuda_mr holds: a copy of copyable resources, a vram::ref to the others (which
/// keeps their properties and capabilities).
template <class R>
using interop_cuda_mr_held = std::conditional_t<std::is_copy_constructible_v<R>, R, ref_t<R>>;
}  // namespace detail

/// Wraps `r` for cuda::mr: copies copyable resources (sources), refers to the others (pools;
/// `r` must then outlive the adaptor).
template <class R>
  requires vram::resource<R>
[[nodiscard]] cuda_mr_adaptor<detail::interop_cuda_mr_held<R>> make_cuda_mr(R& r) {
  return cuda_mr_adaptor<detail::interop_cuda_mr_held<R>>(detail::interop_cuda_mr_held<R>(r));
}

// The proofs, for the CCCL in use.
#  if VRAM_CCCL_NEW_MR_NAMING
static_assert(::cuda::mr::synchronous_resource<cuda_mr_adaptor<resource_ref<vram::device_accessible>>>);
static_assert(::cuda::mr::resource<cuda_mr_adaptor<resource_ref<vram::device_accessible>>>);
static_assert(::cuda::mr::resource_with<cuda_mr_adaptor<resource_ref<vram::device_accessible>>,
                                        ::cuda::mr::device_accessible>);
#  else
static_assert(::cuda::mr::resource<cuda_mr_adaptor<resource_ref<vram::device_accessible>>>);
static_assert(::cuda::mr::async_resource<cuda_mr_adaptor<resource_ref<vram::device_accessible>>>);
static_assert(::cuda::mr::async_resource_with<cuda_mr_adaptor<resource_ref<vram::device_accessible>>,
                                              ::cuda::mr::device_accessible>);
#  endif
static_assert(!::cuda::has_property<cuda_mr_adaptor<resource_ref<vram::device_accessible>>,
                                    ::cuda::mr::host_accessible>);
static_assert(::cuda::has_property<cuda_mr_adaptor<resource_ref<vram::host_accessible>>, ::cuda::mr::host_accessible>);

}  // namespace vram

#endif  // VRAM_HAS_CUDA_MR

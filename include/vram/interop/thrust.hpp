#pragma once
// vram::thrust_allocator<R>: thrust's temporary storage from a vram resource, on a stream:
//     vram::thrust_allocator alloc(pool, stream);
//     thrust::sort(thrust::cuda::par(alloc).on(stream), v.begin(), v.end());
// and vram::cub_temp_storage: CUB's two-phase temp storage (query, allocate, run, free):
//     vram::cub_temp_storage(pool, stream, [&](void* temp, std::size_t& bytes) {
//       return cub::DeviceRadixSort::SortKeys(temp, bytes, in, out, n, 0, 32, stream);
//     });
// The header needs neither thrust nor CUB; the allocator works with any vram resource.

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#include <vram/core/concepts.hpp>
#include <vram/core/config.hpp>
#include <vram/core/ref.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/throw.hpp>

namespace vram {

/// The allocator thrust's CUDA backend asks for temporary storage (`value_type` char,
/// allocate(bytes) / deallocate(p, bytes)), served by a vram resource on one stream.
///
/// Streams: every block is allocated and freed on `stream()`, the stream the thrust algorithm
/// runs on (`.on(stream)`), so a stream_pool reuses it there at once without synchronizing.
/// Use the allocator with that stream only.
/// Alignment: 256 bytes (what thrust expects of cudaMalloc).
/// Upstream: `R` by value; a non-copyable pool is referred to through vram::ref (the
/// constructor from an lvalue deduces that); the pool must outlive the allocator.
/// Errors: allocate throws what `R` throws (vram::out_of_memory is a std::bad_alloc, which
/// thrust reports as its own bad_alloc). Thread safety: that of `R`.
template <class R>
  requires vram::resource<R>
class thrust_allocator {
 public:
  using value_type = char;
  using size_type = std::size_t;

  thrust_allocator(R resource, stream_ref stream) noexcept(std::is_nothrow_move_constructible_v<R>)
      : resource_(std::move(resource)), stream_(stream) {}

  /// `bytes` bytes of temporary storage, ordered on stream(). Zero bytes: nullptr.
  [[nodiscard]] char* allocate(std::size_t bytes) {
    return static_cast<char*>(resource_.allocate(stream_, bytes, default_alignment));
  }
  void deallocate(char* p, std::size_t bytes) noexcept { resource_.deallocate(stream_, p, bytes, default_alignment); }

  [[nodiscard]] stream_ref stream() const noexcept { return stream_; }
  [[nodiscard]] R& upstream() noexcept { return resource_; }
  [[nodiscard]] const R& upstream() const noexcept { return resource_; }

  friend bool operator==(const thrust_allocator& a, const thrust_allocator& b) {
    return a.stream_ == b.stream_ && a.resource_ == b.resource_;
  }
  friend bool operator!=(const thrust_allocator& a, const thrust_allocator& b) { return !(a == b); }

 private:
  R resource_;
  stream_ref stream_;
};

namespace detail {
template <class R>
using interop_thrust_held = std::conditional_t<std::is_copy_constructible_v<R>, R, ref_t<R>>;
}  // namespace detail

template <class R>
thrust_allocator(R&, stream_ref) -> thrust_allocator<detail::interop_thrust_held<R>>;

/// Runs a CUB device algorithm with temporary storage from `resource`, on `stream`:
/// calls `run(nullptr, bytes)` to learn the size, allocates it (at least 1 byte: a null
/// pointer would make CUB query again instead of running), calls `run(temp, bytes)`, and
/// frees the storage on `stream` (stream-ordered: the free waits for the algorithm, not the
/// caller). `run` returns a cudaError_t (or anything convertible to int where 0 is success);
/// a failure throws vram::cuda_error after the storage is freed.
template <class R, class Run>
  requires vram::resource<std::remove_cvref_t<R>>
void cub_temp_storage(R&& resource, stream_ref stream, Run&& run) {
  auto check = [](auto status, const char* what) {
    if (static_cast<int>(status) != 0) detail::throw_cuda_error(static_cast<int>(status), what);
  };
  std::size_t bytes = 0;
  check(run(static_cast<void*>(nullptr), bytes), "CUB temporary storage query");
  std::size_t allocated = std::max<std::size_t>(bytes, 1);
  void* temp = resource.allocate(stream, allocated, default_alignment);
  try {
    check(run(temp, bytes), "CUB algorithm");
  } catch (...) {
    resource.deallocate(stream, temp, allocated, default_alignment);
    throw;
  }
  resource.deallocate(stream, temp, allocated, default_alignment);
}

}  // namespace vram

#pragma once
// vram::cuda_async_source: cudaMallocAsync on a cudaMemPool_t of its own (the driver's pool).

#include <vram/source/detail/cuda_only.hpp>  // first: stops a build without CUDA with a message

#include <cstddef>
#include <cstdint>
#include <memory>

#include <vram/core/concepts.hpp>
#include <vram/core/config.hpp>
#include <vram/core/event.hpp>
#include <vram/detail/cuda_device_guard.hpp>

#if VRAM_HAS_CUDA
namespace vram {

struct cuda_async_options {
  int device = -1;                     ///< -1: the current device
  /// Bytes the pool keeps reserved across synchronizations (the driver's default is 0:
  /// trim at every synchronization). UINT64_MAX keeps everything.
  std::uint64_t release_threshold = UINT64_MAX;
  /// Handle type for IPC export (cudaMemHandleTypeNone by default).
  cudaMemAllocationHandleType handle_type = cudaMemHandleTypeNone;
};

/// The driver's stream-ordered pool: a cudaMemPool_t created (and destroyed) by this source,
/// served with cudaMallocFromPoolAsync / cudaFreeAsync on CUDA streams.
///
/// Thread safety: all members may be called concurrently. Streams: on a CUDA stream the
/// allocation and free are ordered on it; on a host or the synchronous stream the legacy
/// default stream is used and synchronized, so the memory is ready (or gone) on return.
/// Alignment: 256 bytes. Zero bytes and errors: as cuda_device_source.
/// Copies share the pool (shared ownership) and compare equal.
class cuda_async_source {
 public:
  explicit cuda_async_source(cuda_async_options options = {}) : pool_(make_pool(options)) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "cuda_async_source"; }
  [[nodiscard]] cudaMemPool_t pool() const noexcept { return pool_.get(); }

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (align > default_alignment) detail::throw_invalid_argument(name(), "alignment above 256 bytes");
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    cudaStream_t stream = s.is_cuda() ? s.cuda() : nullptr;
    if (!s.is_cuda()) synchronize(s);
    detail::check_cuda_allocation(cudaMallocFromPoolAsync(&p, bytes, pool_.get(), stream), name(),
                                  "cudaMallocFromPoolAsync", bytes, s);
    if (!s.is_cuda()) detail::check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    return p;
  }

  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    if (p == nullptr) return;
    try {
      if (!s.is_cuda()) synchronize(s);
      cudaStream_t stream = s.is_cuda() ? s.cuda() : nullptr;
      detail::report_cuda_free(cudaFreeAsync(p, stream), name(), p, bytes);
      if (!s.is_cuda()) (void)cudaStreamSynchronize(nullptr);
    } catch (...) {
      report_misuse({misuse::upstream_failure, name(), p, bytes, 0});
    }
  }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align);
  }

  /// Gives unused pool memory back to the driver, down to `keep` bytes.
  std::size_t release(std::size_t keep = 0) {
    detail::check_cuda(cudaMemPoolTrimTo(pool_.get(), keep), "cudaMemPoolTrimTo");
    return 0;  // the driver does not report how much it trimmed
  }

  friend bool operator==(const cuda_async_source& a, const cuda_async_source& b) noexcept {
    return a.pool_ == b.pool_;
  }
  friend constexpr void get_property(const cuda_async_source&, device_accessible) noexcept {}

 private:
  struct pool_deleter {
    void operator()(cudaMemPool_t p) const noexcept { (void)cudaMemPoolDestroy(p); }
  };
  using pool_handle = std::shared_ptr<std::remove_pointer_t<cudaMemPool_t>>;

  static pool_handle make_pool(const cuda_async_options& o) {
    int device = o.device;
    if (device < 0) detail::check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = o.handle_type;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    detail::check_cuda(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    pool_handle handle(pool, pool_deleter{});
    std::uint64_t threshold = o.release_threshold;
    detail::check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                       "cudaMemPoolSetAttribute");
    return handle;
  }

  pool_handle pool_;
};

static_assert(resource_with<cuda_async_source, device_accessible>);

}  // namespace vram
#endif

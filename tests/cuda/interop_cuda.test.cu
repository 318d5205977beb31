// The interop layer on a GPU: cuda::mr over a pool on CUDA streams, thrust with
// thrust_allocator, CUB with cub_temp_storage, and the device registry with real device ids.
// Compiled by nvcc wherever the toolkit is; skipped (exit 77) without a GPU.
#include <vram/interop/cuda_mr.hpp>  // first: it enables CCCL's experimental memory resources

#include <catch2/catch.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/throw.hpp>
#include <vram/interop/device_registry.hpp>
#include <vram/interop/thrust.hpp>
#include <vram/source/cuda_device_source.hpp>

namespace {

struct cuda_stream {
  cudaStream_t handle = nullptr;
  cuda_stream() { vram::detail::check_cuda(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~cuda_stream() { (void)cudaStreamDestroy(handle); }
};

__global__ void iota_kernel(unsigned* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = static_cast<unsigned>(n - i);
}

using pool_t = vram::stream_pool<vram::cuda_device_source>;

}  // namespace

static_assert(VRAM_HAS_CUDA_MR, "nvcc finds CCCL by itself");
#if !VRAM_CCCL_NEW_MR_NAMING
static_assert(::cuda::mr::async_resource_with<vram::cuda_mr_adaptor<vram::resource_ref<vram::device_accessible>>,
                                              ::cuda::mr::device_accessible>);
#endif

TEST_CASE("cuda_mr: a stream_pool behind cuda::mr on a CUDA stream", "[interop][gpu]") {
  pool_t pool(vram::cuda_device_source{});
  auto mr = vram::make_cuda_mr(pool);
  cuda_stream s;
  constexpr std::size_t n = 1 << 20;
#if VRAM_CCCL_NEW_MR_NAMING
  ::cuda::mr::resource_ref<::cuda::mr::device_accessible> ref{mr};
  auto* p = static_cast<unsigned*>(ref.allocate(::cuda::stream_ref{s.handle}, n * sizeof(unsigned), 256));
#else
  ::cuda::mr::async_resource_ref<::cuda::mr::device_accessible> ref{mr};
  auto* p = static_cast<unsigned*>(ref.allocate_async(n * sizeof(unsigned), 256, ::cuda::stream_ref{s.handle}));
#endif
  iota_kernel<<<128, 256, 0, s.handle>>>(p, n);
  vram::detail::check_cuda(cudaGetLastError(), "iota_kernel");
  unsigned last = 0;
  vram::detail::check_cuda(cudaMemcpyAsync(&last, p + n - 1, sizeof last, cudaMemcpyDeviceToHost, s.handle), "memcpy");
  vram::detail::check_cuda(cudaStreamSynchronize(s.handle), "sync");
  CHECK(last == 1u);
#if VRAM_CCCL_NEW_MR_NAMING
  ref.deallocate(::cuda::stream_ref{s.handle}, p, n * sizeof(unsigned), 256);
#else
  ref.deallocate_async(p, n * sizeof(unsigned), 256, ::cuda::stream_ref{s.handle});
#endif
  vram::synchronize(vram::stream_ref{s.handle});
  CHECK(pool.stats().live_bytes == 0);
  pool.check_invariants();
}

TEST_CASE("thrust with thrust_allocator, CUB with cub_temp_storage", "[interop][gpu]") {
  pool_t pool(vram::cuda_device_source{});
  cuda_stream s;
  constexpr std::size_t n = 1 << 20;
  thrust::device_vector<unsigned> v(n);
  thrust::sequence(v.begin(), v.end(), 0u);
  thrust::device_vector<unsigned> reversed(v.rbegin(), v.rend());

  vram::thrust_allocator alloc(pool, vram::stream_ref{s.handle});
  thrust::sort(thrust::cuda::par(alloc).on(s.handle), reversed.begin(), reversed.end());
  unsigned long long sum =
      thrust::reduce(thrust::cuda::par(alloc).on(s.handle), reversed.begin(), reversed.end(), 0ull);
  CHECK(sum == (unsigned long long)n * (n - 1) / 2);
  CHECK(reversed.front() == 0u);
  CHECK(reversed.back() == n - 1);
  CHECK(pool.stats().total_allocations > 0);  // thrust's temporaries came from the pool

  thrust::device_vector<unsigned> in(v.rbegin(), v.rend()), out(n);
  std::size_t before = pool.stats().total_allocations;
  vram::cub_temp_storage(pool, vram::stream_ref{s.handle}, [&](void* temp, std::size_t& bytes) {
    return cub::DeviceRadixSort::SortKeys(temp, bytes, thrust::raw_pointer_cast(in.data()),
                                          thrust::raw_pointer_cast(out.data()), static_cast<int>(n), 0, 32, s.handle);
  });
  vram::synchronize(vram::stream_ref{s.handle});
  CHECK(pool.stats().total_allocations == before + 1);
  CHECK(out[0] == 0u);
  CHECK(out[n - 1] == n - 1);
  CHECK(pool.stats().live_bytes == 0);
}

TEST_CASE("device_registry with real devices", "[interop][gpu]") {
  int count = 0;
  vram::detail::check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  vram::device_registry reg;
  CHECK(reg.device_count() == count);
  std::vector<std::unique_ptr<pool_t>> pools;
  for (int d = 0; d < count; ++d) {
    pools.push_back(std::make_unique<pool_t>(vram::cuda_device_source(d)));
    reg.set(d, *pools.back());
  }
  vram::detail::check_cuda(cudaSetDevice(0), "cudaSetDevice");
  void* p = reg.get_current().allocate_sync(1 << 20);
  CHECK(pools[0]->owns(p));
  reg.get_current().deallocate_sync(p, 1 << 20);
  vram::cuda_device_source dev0(0);
  CHECK_NOTHROW(reg.set(0, dev0));
  if (count > 1) {
    CHECK_THROWS_AS(reg.set(1, dev0), vram::wrong_device);
    CHECK_THROWS_AS(reg.get(1).allocate_sync(256), vram::wrong_device);  // device 0 is current
  }
}

// thrust and CUB taking their temporary storage from a vram pool on a stream:
//   thrust::sort(thrust::cuda::par(alloc).on(stream), ...)     with vram::thrust_allocator
//   cub::DeviceRadixSort::SortKeys via vram::cub_temp_storage  (query, allocate, run, free)
// Needs a GPU: without one it says so loudly and exits 77 (skipped).
#include <cstdio>

#include <cub/device/device_radix_sort.cuh>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/throw.hpp>
#include <vram/interop/thrust.hpp>
#include <vram/source/cuda_device_source.hpp>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "*** SKIPPED: thrust_cub needs a CUDA GPU and found none. ***\n");
    return 77;
  }
  vram::stream_pool<vram::cuda_device_source> pool(vram::cuda_device_source{});
  cudaStream_t stream = nullptr;
  vram::detail::check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  constexpr int n = 1 << 22;

  thrust::device_vector<unsigned> keys(n);
  thrust::sequence(keys.begin(), keys.end(), 0u);
  thrust::device_vector<unsigned> reversed(keys.rbegin(), keys.rend());

  // thrust: every temporary buffer of the sort comes from the pool, ordered on `stream`.
  vram::thrust_allocator alloc(pool, stream);
  thrust::sort(thrust::cuda::par(alloc).on(stream), reversed.begin(), reversed.end());

  // CUB: the two-phase temp-storage dance in one call.
  thrust::device_vector<unsigned> in(keys.rbegin(), keys.rend()), out(n);
  vram::cub_temp_storage(pool, stream, [&](void* temp, std::size_t& bytes) {
    return cub::DeviceRadixSort::SortKeys(temp, bytes, thrust::raw_pointer_cast(in.data()),
                                          thrust::raw_pointer_cast(out.data()), n, 0, 32, stream);
  });
  vram::synchronize(stream);

  bool ok = reversed[0] == 0u && reversed[n - 1] == unsigned(n - 1) && out[0] == 0u && out[n - 1] == unsigned(n - 1);
  vram::stats st = pool.stats();
  std::printf("sorted %d keys with thrust and CUB: %s; %zu temporary allocations from the pool, %zu MiB reserved\n",
              n, ok ? "correct" : "WRONG", st.total_allocations, st.reserved_bytes >> 20);
  vram::detail::check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return ok && st.live_bytes == 0 ? 0 : 1;
}

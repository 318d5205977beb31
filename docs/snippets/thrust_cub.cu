// docs/integration.md: thrust and CUB temporary storage from a pool.
#include <thrust/device_vector.h>
#include <thrust/sort.h>
#include <cub/device/device_radix_sort.cuh>
// [snippet]
#include <vram/interop/thrust.hpp>
// [/snippet]
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/cuda_device_source.hpp>

void use(vram::stream_pool<vram::cuda_device_source>& pool, cudaStream_t stream, thrust::device_vector<int>& v,
         const int* in, int* out, int n) {
  // [snippet]
  vram::thrust_allocator alloc(pool, stream);
  thrust::sort(thrust::cuda::par(alloc).on(stream), v.begin(), v.end());

  vram::cub_temp_storage(pool, stream, [&](void* temp, std::size_t& bytes) {
    return cub::DeviceRadixSort::SortKeys(temp, bytes, in, out, n, 0, 32, stream);
  });
  // [/snippet]
}

// docs/integration.md: CUDA code with a stream-ordered pool.
// [snippet]
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/cuda_device_source.hpp>

// [/snippet]
__global__ void kernel(void* p) { static_cast<char*>(p)[threadIdx.x] = 1; }

void use(cudaStream_t stream, std::size_t bytes, dim3 g, dim3 b) {
  // [snippet]
  vram::stream_pool<vram::cuda_device_source> pool(vram::cuda_device_source{},
      vram::stream_pool_options{.initial_size = 1ull << 30});
  void* p = pool.allocate(stream, bytes);   // cudaStream_t converts to vram::stream_ref
  kernel<<<g, b, 0, stream>>>(p);
  pool.deallocate(stream, p, bytes);        // reused on `stream` at once, no sync
  // [/snippet]
}

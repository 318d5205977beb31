// README: the stream-ordered pool over cudaMalloc.
// [snippet]
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/cuda_device_source.hpp>

// [/snippet]
void use(vram::stream_ref stream, std::size_t bytes) {
  // [snippet]
  vram::stream_pool<vram::cuda_device_source> pool{vram::cuda_device_source{}};
  void* p = pool.allocate(stream, bytes);   // stream-ordered, like cudaMallocAsync
  pool.deallocate(stream, p, bytes);
  // [/snippet]
}

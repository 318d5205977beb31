// docs/integration.md: one pool per GPU behind a registry.
// [snippet]
#include <vram/interop/device_registry.hpp>
// [/snippet]
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/cuda_device_source.hpp>

void use(vram::stream_pool<vram::cuda_device_source>& pool0, vram::stream_pool<vram::cuda_device_source>& pool1,
         vram::stream_ref stream, std::size_t bytes) {
  // [snippet]
  vram::device_registry registry;                  // devices 0..cudaGetDeviceCount()-1
  registry.set(0, pool0);                          // non-owning: pool0 must outlive it
  registry.set(1, pool1);
  void* p = registry.get_current().allocate(stream, bytes);   // cudaGetDevice() picks
  // [/snippet]
  registry.get_current().deallocate(stream, p, bytes);
}

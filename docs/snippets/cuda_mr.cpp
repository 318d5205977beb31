// docs/integration.md: a pool as a cuda::mr resource (CCCL 3.0 naming, as in CUDA 13.0).
// [snippet]
#include <vram/interop/cuda_mr.hpp>   // FIRST: before any CCCL / thrust / CUB header
// [/snippet]
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/cuda_device_source.hpp>

void use(vram::stream_pool<vram::cuda_device_source>& pool, cudaStream_t stream, std::size_t bytes) {
  // [snippet]
  auto mr = vram::make_cuda_mr(pool);   // cuda_mr_adaptor<vram::ref_t<stream_pool<...>>>
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{mr};   // CCCL 3.0 (CUDA 13.0)
  void* p = ref.allocate_async(bytes, 256, cuda::stream_ref{stream});
  // [/snippet]
  ref.deallocate_async(p, bytes, 256, cuda::stream_ref{stream});
}

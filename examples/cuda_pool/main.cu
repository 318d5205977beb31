// Kernels on several CUDA streams sharing one vram::stream_pool: blocks freed on a stream are
// reused on it at once; another stream takes them only after an event, never a device sync.
// Needs a GPU: without one it says so loudly and exits 77 (skipped).
#include <cstdio>
#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/throw.hpp>
#include <vram/source/cuda_device_source.hpp>

__global__ void scale(float* x, std::size_t n, float by) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = x[i] * by + 1;
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "*** SKIPPED: cuda_pool needs a CUDA GPU and found none. ***\n");
    return 77;
  }
  using vram::detail::check_cuda;
  vram::stream_pool<vram::cuda_device_source> pool(vram::cuda_device_source{},
                                                   vram::stream_pool_options{.initial_size = std::size_t{256} << 20});
  constexpr int streams = 4;
  constexpr std::size_t n = std::size_t{1} << 22;
  std::vector<cudaStream_t> s(streams);
  for (auto& h : s) check_cuda(cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking), "cudaStreamCreate");

  for (int step = 0; step < 20; ++step) {
    for (int i = 0; i < streams; ++i) {
      auto* x = static_cast<float*>(pool.allocate(s[i], n * sizeof(float)));
      check_cuda(cudaMemsetAsync(x, 0, n * sizeof(float), s[i]), "cudaMemsetAsync");
      scale<<<256, 256, 0, s[i]>>>(x, n, 2.0f);
      check_cuda(cudaGetLastError(), "scale<<<>>>");
      pool.deallocate(s[i], x, n * sizeof(float));  // stream-ordered: no wait here
    }
  }
  // Hand a buffer from stream 0 to stream 1 with an event.
  auto* x = static_cast<float*>(pool.allocate(s[0], n * sizeof(float)));
  check_cuda(cudaMemsetAsync(x, 0, n * sizeof(float), s[0]), "cudaMemsetAsync");
  vram::event written;
  written.record(s[0]);
  vram::wait(s[1], written);
  scale<<<256, 256, 0, s[1]>>>(x, n, 3.0f);
  float first = 0;
  check_cuda(cudaMemcpyAsync(&first, x, sizeof first, cudaMemcpyDeviceToHost, s[1]), "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(s[1]), "cudaStreamSynchronize");
  pool.deallocate(s[1], x, n * sizeof(float));
  for (auto h : s) check_cuda(cudaStreamSynchronize(h), "cudaStreamSynchronize");

  vram::stats st = pool.stats();
  std::printf("x[0] = %.1f (expected 1.0); %zu allocations, %zu MiB reserved, %zu upstream calls\n", first,
              st.total_allocations, st.reserved_bytes >> 20, st.upstream_allocations);
  for (auto h : s) check_cuda(cudaStreamDestroy(h), "cudaStreamDestroy");
  return first == 1.0f && st.live_bytes == 0 ? 0 : 1;
}

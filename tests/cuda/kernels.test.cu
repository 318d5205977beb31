// Kernels on real CUDA streams using memory from every CUDA source, with events between
// streams: the GPU counterpart of the host-stream tests. Skipped (exit 77) without a GPU.
#include <catch2/catch.hpp>

#include <vector>

#include <vram/core/event.hpp>
#include <vram/core/throw.hpp>
#include <vram/source/cuda_async_source.hpp>
#include <vram/source/cuda_device_source.hpp>
#include <vram/source/cuda_pinned_source.hpp>

namespace {

__global__ void fill(unsigned* p, std::size_t n, unsigned value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

__global__ void add_one(const unsigned* in, unsigned* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] + 1;
}

struct cuda_stream {
  cudaStream_t handle = nullptr;
  cuda_stream() { vram::detail::check_cuda(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~cuda_stream() { (void)cudaStreamDestroy(handle); }
};

template <class Source>
void producer_consumer(Source& source) {
  constexpr std::size_t n = 1 << 20;
  cuda_stream a, b;
  auto* in = static_cast<unsigned*>(source.allocate(vram::stream_ref{a.handle}, n * sizeof(unsigned)));
  auto* out = static_cast<unsigned*>(source.allocate(vram::stream_ref{b.handle}, n * sizeof(unsigned)));
  fill<<<256, 256, 0, a.handle>>>(in, n, 41u);
  vram::detail::check_cuda(cudaGetLastError(), "fill<<<>>>");
  vram::event written;
  written.record(a.handle);
  vram::wait(b.handle, written);  // b must not read `in` before a wrote it
  add_one<<<256, 256, 0, b.handle>>>(in, out, n);
  vram::detail::check_cuda(cudaGetLastError(), "add_one<<<>>>");
  std::vector<unsigned> host(n);
  vram::detail::check_cuda(cudaMemcpyAsync(host.data(), out, n * sizeof(unsigned), cudaMemcpyDeviceToHost, b.handle),
                           "cudaMemcpyAsync");
  vram::synchronize(b.handle);
  for (std::size_t i = 0; i < n; i += 4093) REQUIRE(host[i] == 42u);
  source.deallocate(vram::stream_ref{a.handle}, in, n * sizeof(unsigned));
  source.deallocate(vram::stream_ref{b.handle}, out, n * sizeof(unsigned));
}

}  // namespace

TEST_CASE("kernels on two streams ordered by an event: cuda_device_source", "[cuda]") {
  vram::cuda_device_source s;
  producer_consumer(s);
}

TEST_CASE("kernels on two streams ordered by an event: cuda_async_source", "[cuda]") {
  vram::cuda_async_source s;
  producer_consumer(s);
}

TEST_CASE("a kernel writes mapped pinned memory the host then reads", "[cuda]") {
  vram::cuda_pinned_source s;
  constexpr std::size_t n = 4096;
  auto* p = static_cast<unsigned*>(s.allocate_sync(n * sizeof(unsigned)));
  fill<<<4, 256>>>(p, n, 7u);
  vram::detail::check_cuda(cudaGetLastError(), "fill<<<>>>");
  vram::detail::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (std::size_t i = 0; i < n; ++i) REQUIRE(p[i] == 7u);
  s.deallocate_sync(p, n * sizeof(unsigned));
}

TEST_CASE("a host stream can wait on a CUDA event", "[cuda]") {
  cuda_stream a;
  vram::host_stream h;
  vram::cuda_pinned_source s;
  auto* p = static_cast<unsigned*>(s.allocate_sync(sizeof(unsigned) * 1024));
  fill<<<1, 256, 0, a.handle>>>(p, 1024, 9u);
  vram::detail::check_cuda(cudaGetLastError(), "fill<<<>>>");
  vram::event e;
  e.record(a.handle);
  vram::wait(h, e);
  unsigned seen = 0;
  h.enqueue([&] { seen = p[1023]; });
  h.synchronize();
  CHECK(seen == 9u);
  s.deallocate_sync(p, sizeof(unsigned) * 1024);
}

// What spilling costs a kernel: budget_slab<cuda_device_source, cuda_pinned_source> with a
// budget that holds one buffer, so the next one of the same size spills to mapped pinned host
// memory. A kernel reads (and sums) each buffer through its pointer; cudaMemcpy host-to-device
// from the same pinned buffer is the reference for the bus.
//
//   bench.spill_bandwidth --benchmark_min_time=0.1      (scripts/gpu-check runs it)
//
// kernel_read/spilled/<bytes>   the kernel reads the spilled (host-resident) block over the bus
// kernel_read/device/<bytes>    the kernel reads the slab's device-resident block (HBM)
// memcpy_h2d/pinned/<bytes>     cudaMemcpyAsync of the spilled block into the device block
// bytes_per_second is the figure (GPU time from CUDA events); each kernel's sum is checked
// against the bytes written, so a kernel that read nothing cannot pass.
// Without a GPU every benchmark reports "no CUDA device" and skips.

#include <benchmark/benchmark.h>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <vram/alloc/budget_slab.hpp>
#include <vram/source/cuda_device_source.hpp>
#include <vram/source/cuda_pinned_source.hpp>

namespace {

using slab_t = vram::budget_slab<vram::cuda_device_source, vram::cuda_pinned_source>;

bool have_gpu() {
  static const bool yes = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return yes;
}

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(status) + " " + cudaGetErrorString(status));
}

/// Sums `words` 16-byte words (as 32-bit lanes) into *out; grid-stride, one atomic per warp.
__global__ void sum_kernel(const uint4* __restrict__ p, std::size_t words, unsigned long long* out) {
  unsigned long long s = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    uint4 v = p[i];
    s += static_cast<unsigned long long>(v.x) + v.y + v.z + v.w;
  }
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
  if ((threadIdx.x & 31u) == 0) atomicAdd(out, s);
}

/// The setup every benchmark shares: a slab whose budget holds one buffer of `bytes`, the
/// device-resident buffer, the spilled one (filled on the host), a stream, events, a result.
struct spill_setup {
  explicit spill_setup(std::size_t bytes)
      // One page over the buffer: the slab's pages start at a 64 KiB boundary of the reservation.
      : bytes(bytes), slab(vram::cuda_device_source{}, vram::cuda_pinned_source{}, {.device_budget = bytes + (64 << 10)}) {
    device = slab.allocate_sync(bytes);
    spilled = slab.allocate_sync(bytes);  // the budget is full: served by cuda_pinned_source
    if (slab.residency(device) != vram::residency::device || slab.residency(spilled) != vram::residency::host ||
        slab.stats().spills != 1)
      throw std::runtime_error("the setup did not spill as intended");
    std::memset(spilled, 1, bytes);  // host memory: written by the CPU
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(cudaMemsetAsync(device, 1, bytes, stream), "cudaMemsetAsync");
    check(cudaMalloc(&result, sizeof(unsigned long long)), "cudaMalloc");
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    int device_id = 0, sms = 0;
    check(cudaGetDevice(&device_id), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_id), "cudaDeviceGetAttribute");
    blocks = 4 * sms;
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  spill_setup(const spill_setup&) = delete;
  spill_setup& operator=(const spill_setup&) = delete;
  ~spill_setup() {
    // Teardown errors are not benchmark results; the slab frees its blocks itself.
    if (stop != nullptr) (void)cudaEventDestroy(stop);
    if (start != nullptr) (void)cudaEventDestroy(start);
    if (result != nullptr) (void)cudaFree(result);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    slab.deallocate_sync(spilled, bytes);
    slab.deallocate_sync(device, bytes);
  }

  /// GPU seconds of one kernel pass over `p`; checks the sum (every byte is 1).
  double read_pass(const void* p) {
    check(cudaMemsetAsync(result, 0, sizeof(unsigned long long), stream), "cudaMemsetAsync");
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    sum_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(p), bytes / sizeof(uint4), result);
    check(cudaGetLastError(), "sum_kernel launch");
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    unsigned long long sum = 0;
    check(cudaMemcpyAsync(&sum, result, sizeof sum, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (sum != static_cast<unsigned long long>(bytes / 4) * 0x01010101ull) throw std::runtime_error("wrong sum: the kernel did not read the buffer");
    return elapsed();
  }

  /// GPU seconds of one cudaMemcpyAsync of the spilled buffer into the device one.
  double copy_pass() {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    check(cudaMemcpyAsync(device, spilled, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return elapsed();
  }

  double elapsed() {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms / 1e3;
  }

  std::size_t bytes;
  slab_t slab;
  void* device = nullptr;
  void* spilled = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  unsigned long long* result = nullptr;
  int blocks = 0;
};

enum class what { spilled_read, device_read, h2d_copy };

void run(benchmark::State& state, what w) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  try {
    spill_setup s(static_cast<std::size_t>(state.range(0)));
    auto pass = [&] {
      switch (w) {
        case what::spilled_read: return s.read_pass(s.spilled);
        case what::device_read: return s.read_pass(s.device);
        default: return s.copy_pass();
      }
    };
    pass();  // warm-up: first touch of the mapping, kernel load
    for (auto _ : state) state.SetIterationTime(pass());
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
    state.counters["spills"] = static_cast<double>(s.slab.stats().spills);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

[[maybe_unused]] const bool registered = [] {
  for (auto [name, w] : {std::pair{"kernel_read/spilled", what::spilled_read}, std::pair{"kernel_read/device", what::device_read},
                         std::pair{"memcpy_h2d/pinned", what::h2d_copy}})
    benchmark::RegisterBenchmark(name, run, w)->Arg(16 << 20)->Arg(256 << 20)->UseManualTime()->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();

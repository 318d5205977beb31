// A CUDA stream's lifetime against the pools': a stream that freed blocks into a pool may be
// synchronized and destroyed before the pool, and the pool's destructor must not name it (the
// driver's behaviour on a destroyed handle is undefined: a crash on a GPU, and the stand-in
// stops the program). Runs on a GPU and on the stand-in.
#include <catch2/catch.hpp>

#include <cstddef>

#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/throw.hpp>
#include <vram/source/cuda_device_source.hpp>
#include <vram/source/cuda_vmm_source.hpp>

#include "support/misuse_capture.hpp"

namespace {

cudaStream_t make_stream() {
  cudaStream_t s = nullptr;
  vram::detail::check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

/// Uses one block on `s` and frees it there, as a kernel's output would be.
template <class Pool>
void use_and_free(Pool& pool, cudaStream_t s, std::size_t bytes) {
  void* p = pool.allocate(vram::stream_ref{s}, bytes);
  vram::detail::check_cuda(cudaMemsetAsync(p, 0x5a, bytes, s), "cudaMemsetAsync");
  pool.deallocate(vram::stream_ref{s}, p, bytes);
}

}  // namespace

TEMPLATE_TEST_CASE("a pool outlives the CUDA streams that freed into it", "[cuda][stream_pool]",
                   vram::cuda_device_source, vram::cuda_vmm_source) {
  vram::test::misuse_capture capture;
  {
    vram::stream_pool<TestType> pool{TestType{}};
    cudaStream_t a = make_stream(), b = make_stream();
    use_and_free(pool, a, std::size_t{3} << 20);
    use_and_free(pool, b, 4096);
    pool.check_invariants();
    vram::detail::check_cuda(cudaStreamSynchronize(a), "cudaStreamSynchronize");
    vram::detail::check_cuda(cudaStreamSynchronize(b), "cudaStreamSynchronize");
    vram::detail::check_cuda(cudaStreamDestroy(a), "cudaStreamDestroy");
    vram::detail::check_cuda(cudaStreamDestroy(b), "cudaStreamDestroy");
  }  // the pool's destructor: the blocks freed on a and b go back without naming a or b
  CHECK(capture.count() == 0);
}

TEST_CASE("a planned_pool outlives the CUDA stream its plan was served on", "[cuda][planned_pool]") {
  vram::test::misuse_capture capture;
  {
    vram::planned_pool<vram::cuda_device_source> pool{vram::cuda_device_source{}};
    cudaStream_t s = make_stream();
    (void)pool.mark_step();
    for (int step = 0; step < 3; ++step) {  // recorded, then served from the plan
      use_and_free(pool, s, std::size_t{1} << 20);
      use_and_free(pool, s, 8192);
      (void)pool.mark_step();
    }
    CHECK(pool.summary().steps_served >= 1);
    pool.check_invariants();
    vram::detail::check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    vram::detail::check_cuda(cudaStreamDestroy(s), "cudaStreamDestroy");
  }
  CHECK(capture.count() == 0);
}

// vram::cuda_mr_adaptor compiled by the host compiler against the toolkit's CCCL (the nvcc
// and GPU version is tests/cuda/interop_cuda.test.cu). The synchronous path runs on host
// memory; the concept proofs are compile-time. Built without CUDA and CCCL, the header
// compiles to nothing and this executable reports itself skipped (exit 77).
#include <vram/interop/cuda_mr.hpp>  // first: it enables CCCL's experimental memory resources

#include <catch2/catch.hpp>

#include "support/prerequisite.hpp"

// The build against a current CCCL (interop.cuda_mr.cccl_current.standin) must take the
// CCCL 3.1+ branch, or it proves nothing the toolkit's build does not.
#if defined(VRAM_EXPECT_CCCL_NEW_MR_NAMING) && !(VRAM_HAS_CUDA_MR && VRAM_CCCL_NEW_MR_NAMING)
#  error "built against a current CCCL, yet cuda_mr.hpp's CCCL 3.1+ branch is not the one compiled"
#endif

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

#if VRAM_HAS_CUDA_MR
using namespace vram;

static_assert(::cuda::mr::resource_with<cuda_mr_adaptor<host_source>, ::cuda::mr::host_accessible>);
static_assert(!::cuda::has_property<cuda_mr_adaptor<host_source>, ::cuda::mr::device_accessible>);
static_assert(::cuda::has_property<cuda_mr_adaptor<simulated_device_source>, ::cuda::mr::device_accessible>);
#  if !VRAM_CCCL_NEW_MR_NAMING
static_assert(::cuda::mr::async_resource_with<cuda_mr_adaptor<simulated_device_source>, ::cuda::mr::device_accessible>);
#  endif

TEST_CASE("cuda_mr_adaptor: a vram pool behind cuda::mr::resource_ref", "[interop][cuda_mr]") {
  stream_pool<host_source> pool(host_source{}, stream_pool_options{.growth_step = std::size_t{1} << 20});
  auto mr = make_cuda_mr(pool);
  static_assert(std::is_same_v<decltype(mr), cuda_mr_adaptor<ref_t<stream_pool<host_source>>>>);
#  if VRAM_CCCL_NEW_MR_NAMING
  ::cuda::mr::synchronous_resource_ref<::cuda::mr::host_accessible> ref{mr};
  void* p = ref.allocate_sync(4096, 256);
#  else
  ::cuda::mr::resource_ref<::cuda::mr::host_accessible> ref{mr};
  void* p = ref.allocate(4096, 256);
#  endif
  REQUIRE(p != nullptr);
  CHECK(pool.owns(p));
  static_cast<char*>(p)[4095] = 1;
  CHECK(pool.stats().live_bytes == 4096);
#  if VRAM_CCCL_NEW_MR_NAMING
  ref.deallocate_sync(p, 4096, 256);
#  else
  ref.deallocate(p, 4096, 256);
#  endif
  CHECK(pool.stats().live_bytes == 0);
  pool.check_invariants();

  CHECK(make_cuda_mr(pool) == mr);
  stream_pool<host_source> other;
  CHECK(make_cuda_mr(other) != mr);
  CHECK_THROWS_AS(mr.allocate_sync(16, 3), vram::invalid_argument);
}

TEST_CASE("cuda_mr_adaptor over a simulated device: both namings reach the resource", "[interop][cuda_mr]") {
  simulated_device_source dev(std::size_t{1} << 30);
  cuda_mr_adaptor<simulated_device_source> mr(dev);
  void* a = mr.allocate(1 << 20, 256);       // CCCL 3.0 naming
  void* b = mr.allocate_sync(1 << 20, 256);  // CCCL 3.1+ naming
  CHECK(dev.owns(a));
  CHECK(dev.owns(b));
  mr.deallocate(a, 1 << 20, 256);
  mr.deallocate_sync(b, 1 << 20, 256);
  CHECK(dev.stats().live_bytes == 0);
}
#else
static const vram::test::prerequisite cuda_mr_needed{
    "a build with CUDA and CCCL's cuda::mr (VRAM_HAS_CUDA_MR is 0: vram/interop/cuda_mr.hpp compiles to nothing)",
    [] { return false; }};
#endif

// budget_slab over real CUDA sources: device memory inside the budget, spill to mapped pinned
// memory, cudaMemcpy round trips through both, residency. Skips (exit 77) without a GPU.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <vram/alloc/budget_slab.hpp>
#include <vram/source/cuda_device_source.hpp>
#include <vram/source/cuda_pinned_source.hpp>

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

void round_trip(void* p, std::size_t bytes, unsigned char pattern) {
  std::vector<unsigned char> in(bytes, pattern), out(bytes, 0);
  REQUIRE(cudaMemcpy(p, in.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(out == in);
}

}  // namespace

TEST_CASE("cuda budget_slab: device budget, spill to mapped pinned memory, round trips", "[cuda][budget_slab]") {
  vram::budget_slab<vram::cuda_device_source, vram::cuda_pinned_source> slab(
      vram::cuda_device_source{}, vram::cuda_pinned_source{}, {.device_budget = 2 * MiB});
  std::vector<void*> device_blocks;
  for (int i = 0; i < 8; ++i) device_blocks.push_back(slab.allocate_sync(256 * KiB));  // the whole budget
  for (void* p : device_blocks) {
    CHECK(slab.residency(p) == vram::residency::device);
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
    CHECK(attr.type == cudaMemoryTypeDevice);
  }
  round_trip(device_blocks.front(), 256 * KiB, 0x11);

  void* spilled = slab.allocate_sync(300 * KiB);
  CHECK(slab.residency(spilled) == vram::residency::host);
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, spilled) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeHost);
  CHECK(attr.devicePointer == spilled);  // mapped: a kernel may use the same pointer
  std::memset(spilled, 0x22, 300 * KiB);  // host-accessible
  round_trip(spilled, 300 * KiB, 0x33);
  CHECK(slab.stats().spills == 1);
  CHECK(slab.stats().spilled_bytes == 300 * KiB);

  slab.deallocate_sync(device_blocks.back(), 256 * KiB);
  device_blocks.pop_back();
  void* again = slab.allocate_sync(200 * KiB);
  CHECK(slab.residency(again) == vram::residency::device);
  round_trip(again, 200 * KiB, 0x44);

  slab.deallocate_sync(again, 200 * KiB);
  slab.deallocate_sync(spilled, 300 * KiB);
  for (void* p : device_blocks) slab.deallocate_sync(p, 256 * KiB);
  slab.check_invariants();
  CHECK(slab.stats().live_bytes == 0);
}

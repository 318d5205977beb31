// cuda_vmm_source on a real GPU: mapping, in-place growth, partial unmapping, errors, and
// stream_pool growing in place over it. Skipped (exit 77) where no GPU exists.

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/cuda_vmm_source.hpp>

#include "support/misuse_capture.hpp"

namespace {

/// Writes `value` over [p, p+bytes) on the device and reads it back.
bool fill_and_check(void* p, std::size_t bytes, unsigned char value) {
  REQUIRE(cudaMemset(p, value, bytes) == cudaSuccess);
  std::vector<unsigned char> host(bytes);
  REQUIRE(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (unsigned char c : host)
    if (c != value) return false;
  return true;
}

}  // namespace

TEST_CASE("cuda_vmm_source: maps adjacent, usable memory and unmaps any aligned piece", "[cuda][vmm]") {
  vram::cuda_vmm_source vmm({.capacity = std::size_t{1} << 30});
  const std::size_t g = vmm.granularity();
  REQUIRE(vram::is_power_of_two(g));
  CHECK(vmm.capacity() == std::size_t{1} << 30);
  CHECK(vmm.contiguous());

  void* a = vmm.allocate_sync(1);
  CHECK(vmm.mapped_bytes() == g);
  void* b = vmm.allocate_sync(3 * g);
  CHECK(static_cast<char*>(a) + g == static_cast<char*>(b));  // growth is adjacent
  CHECK(vmm.mapped_bytes() == 4 * g);
  CHECK(fill_and_check(a, g, 0x5a));
  CHECK(fill_and_check(b, 3 * g, 0xa5));

  // Unmap the middle granule of b only; the rest stays usable.
  vmm.deallocate_sync(static_cast<char*>(b) + g, g);
  CHECK(vmm.mapped_bytes() == 3 * g);
  CHECK(fill_and_check(b, g, 0x11));
  CHECK(fill_and_check(static_cast<char*>(b) + 2 * g, g, 0x22));
  // The hole is the lowest free range of the right size: the next granule lands there.
  void* c = vmm.allocate_sync(g);
  CHECK(c == static_cast<char*>(b) + g);

  vmm.deallocate_sync(c, g);
  vmm.deallocate_sync(b, g);
  vmm.deallocate_sync(static_cast<char*>(b) + 2 * g, g);
  vmm.deallocate_sync(a, 1);
  CHECK(vmm.mapped_bytes() == 0);
}

TEST_CASE("cuda_vmm_source: errors", "[cuda][vmm]") {
  vram::test::misuse_capture capture;
  vram::cuda_vmm_source vmm({.capacity = std::size_t{64} << 20});
  const std::size_t g = vmm.granularity();
  CHECK(vmm.allocate_sync(0) == nullptr);
  CHECK_THROWS_AS(vmm.allocate_sync(vmm.capacity() + 1), vram::out_of_memory);
  CHECK_THROWS_AS(vmm.allocate_sync(g, 2 * g), vram::invalid_argument);
  CHECK(vmm.mapped_bytes() == 0);
  void* p = vmm.allocate_sync(g);
  vmm.deallocate_sync(static_cast<char*>(p) + g, g);  // not mapped
  CHECK(capture.count(vram::misuse::foreign_pointer) == 1);
  vmm.deallocate_sync(p, g);
  vmm.deallocate_sync(p, g);  // already unmapped
  CHECK(capture.count(vram::misuse::foreign_pointer) == 2);
  CHECK(vmm.mapped_bytes() == 0);
}

TEST_CASE("cuda_vmm_source: stream_pool grows in place and trims", "[cuda][vmm][stream_pool]") {
  vram::stream_pool<vram::cuda_vmm_source> pool(vram::cuda_vmm_source({.capacity = std::size_t{4} << 30}));
  const std::size_t g = pool.upstream().granularity();
  cudaStream_t raw = nullptr;
  REQUIRE(cudaStreamCreate(&raw) == cudaSuccess);
  vram::stream_ref s{raw};
  void* a = pool.allocate(s, 10 * g);
  void* b = pool.allocate(s, 10 * g);
  CHECK(static_cast<char*>(a) + 10 * g == static_cast<char*>(b));
  REQUIRE(cudaMemsetAsync(a, 1, 20 * g, raw) == cudaSuccess);  // one range: one memset spans both
  pool.deallocate(s, a, 10 * g);
  pool.deallocate(s, b, 10 * g);
  REQUIRE(cudaStreamSynchronize(raw) == cudaSuccess);
  void* c = pool.allocate(s, 20 * g);  // coalesced across the two growths
  CHECK(c == a);
  CHECK(pool.stats().reserved_bytes == 20 * g);
  pool.deallocate(s, c, 20 * g);
  REQUIRE(cudaStreamSynchronize(raw) == cudaSuccess);
  pool.check_invariants();
  CHECK(pool.release() == 20 * g);
  CHECK(pool.upstream().mapped_bytes() == 0);
  REQUIRE(cudaStreamDestroy(raw) == cudaSuccess);
}

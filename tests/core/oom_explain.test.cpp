// vram::out_of_memory explains itself: each cause built on purpose (exhaustion,
// fragmentation, a pool's cap, a tenant's quota), and the explanation names it and what would
// have served the request.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/error.hpp>
#include <vram/source/host_source.hpp>
#include <vram/source/simulated_device_source.hpp>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

using pool_t = vram::stream_pool<vram::simulated_device_source>;

/// A 64 MiB device, taken by the pool in one chunk.
pool_t small_pool(std::size_t maximum = 0) {
  return pool_t(vram::simulated_device_source(vram::simulated_device_options{.capacity = 64 * MiB}),
                vram::stream_pool_options{.maximum_size = maximum, .growth_step = 64 * MiB});
}

/// The out_of_memory `f` throws.
template <class F>
std::string explained(F&& f, vram::out_of_memory::reason expected) {
  try {
    f();
  } catch (const vram::out_of_memory& e) {
    CHECK(e.cause() == expected);
    std::string text = e.explain();
    INFO(text);
    CHECK(text.find("cause: ") != std::string::npos);
    CHECK(text.find("would serve it: ") != std::string::npos);
    return text;
  }
  FAIL("no out_of_memory");
  return {};
}

}  // namespace

TEST_CASE("exhaustion: nothing free holds it and the device has no more") {
  pool_t pool = small_pool();
  void* a = pool.allocate_sync(48 * MiB);
  std::string text = explained([&] { (void)pool.allocate_sync(32 * MiB); }, vram::out_of_memory::reason::exhausted);
  CHECK(text.find("32.00 MiB requested") != std::string::npos);
  CHECK(text.find("exhaustion") != std::string::npos);
  pool.deallocate_sync(a, 48 * MiB);
  pool.check_invariants();
}

TEST_CASE("fragmentation: enough free bytes, no block large enough") {
  pool_t pool = small_pool();
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(pool.allocate_sync(4 * MiB));  // the whole device
  for (int i = 0; i < 16; i += 2) pool.deallocate_sync(blocks[i], 4 * MiB);   // 32 MiB free, in 4 MiB holes
  std::string text = explained([&] { (void)pool.allocate_sync(8 * MiB); }, vram::out_of_memory::reason::fragmented);
  CHECK(text.find("fragmentation") != std::string::npos);
  CHECK(text.find("the largest 4.00 MiB") != std::string::npos);
  CHECK(text.find("cuda_vmm_source") != std::string::npos);
  for (int i = 1; i < 16; i += 2) pool.deallocate_sync(blocks[i], 4 * MiB);
  pool.check_invariants();
}

TEST_CASE("a cap: the pool's maximum_size leaves less room than the request") {
  pool_t pool = small_pool(16 * MiB);
  std::string text = explained([&] { (void)pool.allocate_sync(32 * MiB); }, vram::out_of_memory::reason::capped);
  CHECK(text.find("maximum_size (16.00 MiB)") != std::string::npos);
  pool.check_invariants();
}

TEST_CASE("a quota: the tenant, its usage and limit, and the limit that would serve it") {
  auto reg = std::make_shared<vram::tenant_registry>();
  vram::tenant t = reg->create("trainer");
  vram::quota_adaptor<vram::host_source> q(vram::host_source{}, reg);
  q.set_hard_limit(t, 3 * MiB);
  vram::tenant_scope scope(t);
  void* a = q.allocate_sync(2 * MiB);
  std::string text = explained([&] { (void)q.allocate_sync(2 * MiB); }, vram::out_of_memory::reason::quota);
  CHECK(text.find("tenant 'trainer'") != std::string::npos);
  CHECK(text.find("uses 2.00 MiB of its 3.00 MiB hard limit") != std::string::npos);
  CHECK(text.find("at least 4.00 MiB") != std::string::npos);
  q.deallocate_sync(a, 2 * MiB);
  q.check_invariants();
}

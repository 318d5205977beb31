// vram::thrust_allocator and vram::cub_temp_storage on host streams (the GPU versions are in
// tests/cuda/interop_thrust.test.cu).
#include <catch2/catch.hpp>

#include <cstring>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/interop/thrust.hpp>
#include <vram/source/host_source.hpp>

using namespace vram;

TEST_CASE("thrust_allocator serves temporary storage on its stream", "[interop][thrust]") {
  stream_pool<host_source> pool(host_source{}, stream_pool_options{.growth_step = std::size_t{1} << 20});
  host_stream s;
  thrust_allocator alloc(pool, s);
  static_assert(std::is_same_v<decltype(alloc), thrust_allocator<ref_t<stream_pool<host_source>>>>);
  static_assert(std::is_same_v<decltype(alloc)::value_type, char>);
  CHECK(alloc.stream() == stream_ref(s));

  char* a = alloc.allocate(10000);
  REQUIRE(a != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 256 == 0);
  s.enqueue([a] { std::memset(a, 7, 10000); });  // the "kernel" that uses it
  alloc.deallocate(a, 10000);
  char* b = alloc.allocate(10000);  // same stream: reused at once, no wait
  CHECK(b == a);
  alloc.deallocate(b, 10000);
  synchronize(s);
  CHECK(pool.stats().live_bytes == 0);
  pool.check_invariants();

  thrust_allocator copy = alloc;
  CHECK(copy == alloc);
  host_stream other;
  CHECK(thrust_allocator(pool, other) != alloc);
  CHECK(alloc.allocate(0) == nullptr);
}

TEST_CASE("cub_temp_storage: query, allocate, run, free", "[interop][thrust]") {
  stream_pool<host_source> pool(host_source{}, stream_pool_options{.growth_step = std::size_t{1} << 20});
  host_stream s;
  int calls = 0;
  void* seen = nullptr;
  cub_temp_storage(pool, s, [&](void* temp, std::size_t& bytes) {
    ++calls;
    if (temp == nullptr) {
      bytes = 5000;
      return 0;
    }
    CHECK(bytes == 5000);
    CHECK(pool.owns(temp));
    seen = temp;
    s.enqueue([temp] { std::memset(temp, 1, 5000); });
    return 0;
  });
  CHECK(calls == 2);
  CHECK(seen != nullptr);
  synchronize(s);
  CHECK(pool.stats().live_bytes == 0);

  // A zero-byte query still runs the algorithm with a non-null pointer.
  calls = 0;
  cub_temp_storage(pool, s, [&](void* temp, std::size_t& bytes) {
    ++calls;
    if (temp == nullptr) bytes = 0;
    else CHECK(temp != nullptr);
    return 0;
  });
  CHECK(calls == 2);

  // A failing algorithm throws cuda_error and still frees its storage.
  CHECK_THROWS_AS(cub_temp_storage(pool, s,
                                   [&](void* temp, std::size_t& bytes) {
                                     if (temp == nullptr) {
                                       bytes = 1000;
                                       return 0;
                                     }
                                     return 2;  // cudaErrorMemoryAllocation, say
                                   }),
                  cuda_error);
  synchronize(s);
  CHECK(pool.stats().live_bytes == 0);
  pool.check_invariants();
}

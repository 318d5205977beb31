// vram::pmr_resource: std::pmr containers over vram resources.
#include <catch2/catch.hpp>

#include <map>
#include <memory_resource>
#include <string>
#include <vector>

#include <vram/alloc/stream_pool.hpp>
#include <vram/interop/pmr.hpp>
#include <vram/source/host_source.hpp>

using namespace vram;

TEST_CASE("pmr vector and string over a stream_pool on host_source", "[interop][pmr]") {
  stream_pool<host_source> pool(host_source{}, stream_pool_options{.growth_step = std::size_t{1} << 20});
  pmr_resource mr{pool};
  static_assert(std::is_same_v<decltype(mr), pmr_resource<ref_t<stream_pool<host_source>>>>);
  {
    std::pmr::vector<int> v(&mr);
    for (int i = 0; i < 10000; ++i) v.push_back(i);
    long long sum = 0;
    for (int x : v) sum += x;
    CHECK(sum == 10000LL * 9999 / 2);
    CHECK(pool.owns(v.data()));
    CHECK(pool.stats().live_bytes >= v.capacity() * sizeof(int));

    std::pmr::string s("a string long enough to leave the small-string buffer behind", &mr);
    s += s;
    CHECK(pool.owns(s.data()));
    CHECK(s.size() == 2 * 60);

    std::pmr::map<int, std::pmr::string> m(&mr);
    for (int i = 0; i < 100; ++i) m.emplace(i, std::pmr::string(80, static_cast<char>('a' + i % 26)));
    CHECK(std::string_view(m.at(27)) == std::string(80, 'b'));
    CHECK(pool.stats().live_allocations > 100);
    pool.check_invariants();
  }
  CHECK(pool.stats().live_bytes == 0);  // everything came back through the adapter
  pool.check_invariants();
}

TEST_CASE("pmr_resource over a copyable source holds a copy", "[interop][pmr]") {
  host_source src;
  pmr_resource mr{src};
  static_assert(std::is_same_v<decltype(mr), pmr_resource<host_source>>);
  void* p = mr.allocate(100, 64);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
  CHECK(src.owns(p));  // copies share one allocation table
  mr.deallocate(p, 100, 64);
  CHECK(src.live_allocations() == 0);
}

TEST_CASE("pmr_resource: zero bytes, alignment, equality and out of memory", "[interop][pmr]") {
  host_source src;
  pmr_resource a{src};
  pmr_resource b{src};
  pmr_resource c{host_source{}};

  void* z = a.allocate(0, 8);
  CHECK(z != nullptr);  // pmr needs a usable pointer
  a.deallocate(z, 0, 8);
  CHECK(src.live_allocations() == 0);

  CHECK(a.is_equal(b));   // same table: interchangeable
  CHECK(!a.is_equal(c));  // another table
  CHECK(!a.is_equal(*std::pmr::new_delete_resource()));

  void* p = a.allocate(1000, 4096);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
  b.deallocate(p, 1000, 4096);  // freed through an equal resource
  CHECK(src.live_allocations() == 0);

  CHECK_THROWS_AS(a.allocate(16, 3), std::invalid_argument);
  stream_pool<host_source> capped(host_source{}, stream_pool_options{.maximum_size = std::size_t{1} << 20});
  pmr_resource small{capped};
  CHECK_THROWS_AS(small.allocate(std::size_t{2} << 20, 256), std::bad_alloc);
  CHECK(capped.stats().live_bytes == 0);
}

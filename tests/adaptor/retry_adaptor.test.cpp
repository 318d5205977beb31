#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/retry_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/source/host_source.hpp>

#include "support/recording_resource.hpp"

using recording_t = vram::test::recording_resource<vram::host_source>;

namespace {
struct cache {
  std::vector<std::pair<void*, std::size_t>> blocks;
};
}  // namespace

TEST_CASE("retry_adaptor: reclaims and retries until the request fits", "[adaptor][retry]") {
  auto reg = std::make_shared<vram::tenant_registry>();
  recording_t up;
  vram::quota_adaptor<recording_t> capped(up, reg);
  capped.set_hard_limit(vram::tenant::none(), 10000);
  vram::retry_adaptor<vram::quota_adaptor<recording_t>> r(capped, {.max_retries = 3});

  // A "cache" holding 8000 bytes in 4 blocks; each reclaim round frees one block.
  cache c;
  for (int i = 0; i < 4; ++i) c.blocks.emplace_back(r.allocate_sync(2000), 2000);
  int rounds = 0;
  r.add_reclaim([&](std::size_t, vram::stream_ref) -> std::size_t {
    ++rounds;
    if (c.blocks.empty()) return 0;
    auto [p, n] = c.blocks.back();
    c.blocks.pop_back();
    r.deallocate_sync(p, n);
    return n;
  });

  void* p = r.allocate_sync(5000);  // 8000 + 5000 > 10000: needs two blocks back (4000 + 5000)
  CHECK(p != nullptr);
  CHECK(rounds == 2);
  CHECK(r.retries() == 2);
  CHECK(r.reclaimed_bytes() == 4000);
  CHECK(r.failures() == 0);
  r.deallocate_sync(p, 5000);

  // Bounded: a request that can never fit gives up after max_retries rounds (or when a round
  // reclaims nothing) and rethrows the upstream's error unchanged.
  rounds = 0;
  CHECK_THROWS_AS(r.allocate_sync(20000), vram::quota_exceeded);
  CHECK(rounds == 3);  // two blocks left: round 3 reclaimed nothing, so it stopped there
  CHECK(r.failures() == 1);
  CHECK(c.blocks.empty());
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("retry_adaptor: max_retries bounds the rounds", "[adaptor][retry]") {
  recording_t up;
  vram::retry_adaptor<recording_t> r(up, {.max_retries = 4});
  int rounds = 0;
  r.add_reclaim([&](std::size_t bytes, vram::stream_ref) -> std::size_t {
    ++rounds;
    return bytes;  // claims success every time, but the request can never fit
  });
  CHECK_THROWS_AS(r.allocate_sync(std::size_t{1} << 52), vram::out_of_memory);
  CHECK(rounds == 4);
  CHECK(r.retries() == 4);
  CHECK(r.failures() == 1);
}

TEST_CASE("retry_adaptor: final failure dumps who holds memory, naming the biggest holders", "[adaptor][retry]") {
  auto reg = std::make_shared<vram::tenant_registry>();
  auto trainer = reg->create("trainer");
  auto kv_cache = reg->create("kv_cache");
  recording_t up;
  vram::quota_adaptor<recording_t> capped(up, reg);
  capped.set_hard_limit(vram::tenant::none(), 1 << 20);
  capped.set_hard_limit(trainer, 250000);
  capped.set_hard_limit(kv_cache, 1 << 20);
  using tracker_t = vram::tracker_adaptor<vram::quota_adaptor<recording_t>>;
  tracker_t tracker(capped, {.registry = reg});
  auto path = std::filesystem::temp_directory_path() / ("vram_retry_" + std::to_string(::getpid()) + ".txt");
  vram::retry_adaptor<tracker_t> r(tracker, {.max_retries = 2, .dump_path = path.string(),
                                             .dump_writer = [tracker](std::ostream& out) { tracker.write_report(out); }});
  r.add_reclaim([](std::size_t, vram::stream_ref) -> std::size_t { return 0; });

  void *a, *b;
  {
    vram::tenant_scope ts(kv_cache);
    vram::tag_scope tag("kv.layer0");
    a = r.allocate_sync(900000);
  }
  {
    vram::tenant_scope ts(trainer);
    b = r.allocate_sync(100000);
    try {
      (void)r.allocate_sync(200000);
      FAIL("expected quota_exceeded");
    } catch (const vram::quota_exceeded& e) {
      CHECK(e.bytes() == 200000);
      CHECK(e.usage() == 100000);
    }
  }
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string dump = ss.str();
  INFO(dump);
  CHECK(dump.find("quota exceeded") != std::string::npos);
  CHECK(dump.find("200000 bytes requested") != std::string::npos);
  auto kv = dump.find("900000 bytes in 1 allocations: kv_cache");
  auto tr = dump.find("100000 bytes in 1 allocations: trainer");
  REQUIRE(kv != std::string::npos);
  REQUIRE(tr != std::string::npos);
  CHECK(kv < tr);
  CHECK(dump.find("kv.layer0") != std::string::npos);
  std::filesystem::remove(path);
  r.deallocate_sync(a, 900000);
  r.deallocate_sync(b, 100000);
  CHECK(up.counters().live_allocations() == 0);
}

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/core/event.hpp>
#include <vram/source/host_source.hpp>

#include "support/misuse_capture.hpp"
#include "support/recording_resource.hpp"
#include "support/tracked_pool.hpp"

using upstream_t = vram::test::recording_resource<vram::host_source>;
using vram::test::tenants;

namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("vram_tracker_" + std::to_string(::getpid()) + "_" + name);
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("tracker_adaptor: snapshot groups by tenant and tag, largest first", "[adaptor][tracker]") {
  tenants t;
  upstream_t up;
  {
    vram::tracker_adaptor<upstream_t> tr(up, {.registry = t.reg});
    void *a, *b, *c, *d;
    {
      vram::tenant_scope ts(t.model_a);
      vram::tag_scope tag("layer1.attn");
      a = tr.allocate_sync(1000);
      b = tr.allocate_sync(3000);
      {
        vram::tag_scope inner("layer1.mlp");
        c = tr.allocate_sync(500);
      }
    }
    d = tr.allocate(vram::stream_ref{}, 8000, 256, t.model_b);  // explicit tenant, no tag
    tr.check_invariants();

    auto s = tr.snapshot(2);
    CHECK(s.live_bytes == 12500);
    CHECK(s.live_allocations == 4);
    REQUIRE(s.by_tenant.size() == 2);
    CHECK(s.by_tenant[0].name == "job/model_b");
    CHECK(s.by_tenant[0].bytes == 8000);
    CHECK(s.by_tenant[1].name == "job/model_a");
    CHECK(s.by_tenant[1].bytes == 4500);
    CHECK(s.by_tenant[1].allocations == 3);
    REQUIRE(s.by_tag.size() == 3);
    CHECK(s.by_tag[0].name.empty());
    CHECK(s.by_tag[1].name == "layer1.attn");
    CHECK(s.by_tag[1].bytes == 4000);
    CHECK(s.by_tag[2].name == "layer1.mlp");
    REQUIRE(s.largest.size() == 2);
    CHECK(s.largest[0].address == d);
    CHECK(s.largest[1].address == b);

    tr.deallocate_sync(a, 1000);
    tr.deallocate_sync(b, 3000);
    tr.deallocate_sync(c, 500);
    tr.deallocate_sync(d, 8000);
    CHECK(tr.snapshot().live_bytes == 0);
    // Every allocation: segment_alloc + alloc; every free: free_requested, free_completed, segment_free.
    CHECK(tr.events().size() == 4 * 5);
    tr.check_invariants();
  }
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("tracker_adaptor: misuse is reported and changes nothing", "[adaptor][tracker]") {
  vram::test::misuse_capture capture;
  upstream_t up;
  vram::tracker_adaptor<upstream_t> tr(up);
  void* a = tr.allocate_sync(1000);
  auto events = tr.events().size();
  tr.deallocate_sync(a, 10);
  CHECK(capture.count(vram::misuse::wrong_size) == 1);
  alignas(256) static char foreign[256];
  tr.deallocate_sync(foreign, 256);
  CHECK(capture.count(vram::misuse::foreign_pointer) == 1);
  CHECK(tr.events().size() == events);
  CHECK(tr.snapshot().live_bytes == 1000);
  CHECK(up.counters().deallocations == 0);
  tr.deallocate_sync(a, 1000);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("tracker_adaptor: stream-ordered frees complete when the stream gets there", "[adaptor][tracker]") {
  upstream_t up;
  vram::tracker_adaptor<upstream_t> tr(up);
  vram::host_stream stream;
  void* p = tr.allocate(stream, 4096);
  std::atomic<bool> go{false};
  stream.enqueue([&] {
    while (!go) std::this_thread::yield();
  });
  tr.deallocate(stream, p, 4096);
  auto ev = tr.events();
  CHECK(ev.back().action == vram::tracker_action::free_requested);
  CHECK(ev.back().stream == vram::stream_ref(stream).key());
  go = true;
  stream.synchronize();
  ev = tr.events();
  REQUIRE(ev.size() == 5);
  CHECK(ev[3].action == vram::tracker_action::free_completed);
  CHECK(ev[4].action == vram::tracker_action::segment_free);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("tracker_adaptor: the event ring is bounded", "[adaptor][tracker]") {
  upstream_t up;
  vram::tracker_adaptor<upstream_t> tr(up, {.event_capacity = 7});
  for (int i = 0; i < 10; ++i) tr.deallocate_sync(tr.allocate_sync(256), 256);
  auto ev = tr.events();
  CHECK(ev.size() == 7);
  CHECK(tr.dropped_events() == 50 - 7);
  CHECK(ev.back().action == vram::tracker_action::segment_free);
  CHECK(ev.front().action == vram::tracker_action::free_completed);  // 50 - 7 = 43: the 4th of a group of 5
}

TEST_CASE("tracker_adaptor: OOM is recorded and dumps who holds memory", "[adaptor][tracker]") {
  tenants t;
  upstream_t up;
  auto path = temp_path("oom.txt");
  vram::tracker_adaptor<upstream_t> tr(up, {.oom_dump_path = path.string(), .registry = t.reg});
  void* big = tr.allocate(vram::stream_ref{}, 1 << 20, 256, t.model_b);
  void* small = tr.allocate(vram::stream_ref{}, 4096, 256, t.model_a);
  CHECK_THROWS_AS(tr.allocate(vram::stream_ref{}, std::size_t{1} << 52, 256, t.model_a), vram::out_of_memory);
  CHECK(tr.events().back().action == vram::tracker_action::oom);
  CHECK(tr.events().back().bytes == std::size_t{1} << 52);
  CHECK(tr.stats().ooms == 1);
  std::string report = slurp(path);
  INFO(report);
  auto first = report.find("job/model_b");
  REQUIRE(first != std::string::npos);
  CHECK(first < report.find("job/model_a"));  // the biggest holder is named first
  CHECK(report.find("1052672 bytes in 2 allocations") != std::string::npos);
  std::filesystem::remove(path);
  tr.deallocate_sync(big, 1 << 20);
  tr.deallocate_sync(small, 4096);
}

TEST_CASE("tracker_adaptor: call stacks are captured when asked", "[adaptor][tracker]") {
  upstream_t up;
  vram::tracker_adaptor<upstream_t> tr(up, {.capture_stacks = true});
  void* p = tr.allocate_sync(512);
  auto live = tr.live_allocations();
  REQUIRE(live.size() == 1);
#if VRAM_TRACKER_HAS_BACKTRACE
  CHECK(!live[0].frames.empty());
  std::ostringstream report;
  tr.write_report(report);
  CHECK(report.str().find("0x") != std::string::npos);
#endif
  tr.deallocate_sync(p, 512);
}

#include <vram/trace/read_trace.hpp>

TEST_CASE("tracker_adaptor: our snapshot and CSV are read back by vram's trace readers", "[adaptor][tracker][export]") {
  upstream_t up;
  vram::tracker_adaptor<upstream_t> tr(up);
  vram::host_stream stream;
  std::vector<std::pair<void*, std::size_t>> live;
  for (std::size_t i = 1; i <= 20; ++i) live.emplace_back(tr.allocate(i % 2 ? vram::stream_ref{} : vram::stream_ref(stream), i * 4096), i * 4096);
  for (std::size_t i = 0; i < 20; i += 3) tr.deallocate_sync(live[i].first, live[i].second);
  stream.synchronize();

  std::ostringstream pickle, csv;
  tr.write_memory_snapshot(pickle);
  tr.write_csv(csv);
  auto from_pickle = vram::trace::read_pytorch_snapshot(pickle.str(), "tracker.pickle");
  auto from_csv = vram::trace::read_rmm_csv(csv.str(), "tracker.csv");
  for (const auto* t : {&from_pickle, &from_csv}) {
    INFO(t->format);
    for (auto& w : t->warning_examples) WARN(w);
    CHECK(t->allocs() == 20);
    CHECK(t->frees() == 7);
    CHECK(t->warnings == 0);
    CHECK(t->streams == 2);
  }
  for (std::size_t i = 0; i < 20; ++i)
    if (i % 3 != 0) tr.deallocate_sync(live[i].first, live[i].second);
  CHECK(up.counters().live_allocations() == 0);
}

TEST_CASE("tracker_observer: a pool's segments with its blocks in the PyTorch snapshot", "[adaptor][tracker]") {
  vram::test::half_freed_pool p;  // its Python reading: tracker_python.test.cpp
  auto s = p.tracker.snapshot();
  CHECK(s.live_bytes == 6u << 20);
  REQUIRE(s.by_tenant.size() == 1);
  CHECK(s.by_tenant[0].name == "job/model_a");
  std::size_t grows = 0;
  for (auto& e : p.tracker.events()) grows += e.action == vram::tracker_action::segment_alloc;
  CHECK(grows == p.up.counters().allocations);
  p.release();
  std::size_t releases = 0;
  for (auto& e : p.tracker.events()) releases += e.action == vram::tracker_action::segment_free;
  CHECK(releases == p.up.counters().deallocations);
  CHECK(p.tracker.snapshot().live_bytes == 0);
  CHECK(p.up.counters().live_allocations() == 0);
}

// tracker_adaptor::mark_step: step summaries, and a slow leak found among normal churn while
// a steady workload of 1,000 steps raises no alarm.
#include <catch2/catch.hpp>

#include <memory>
#include <random>
#include <utility>
#include <vector>

#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/core/tenant.hpp>
#include <vram/source/host_source.hpp>

namespace {

using tracker = vram::tracker_adaptor<vram::host_source>;

/// Two tenants' normal work: per step, transient blocks freed before the step ends, and a
/// set of 20 long-lived blocks per tenant of which a few are replaced by new random sizes
/// each step (so live bytes at step end rise and fall within a range).
struct churn {
  tracker& t;
  vram::tenant serving, training;
  std::mt19937_64 rng{42};
  std::vector<std::pair<void*, std::size_t>> kept[2];

  std::size_t size() { return std::size_t{4096} << (rng() % 10); }  // 4 KiB .. 2 MiB

  void step() {
    const char* tags[] = {"attn", "mlp"};
    for (int k = 0; k < 2; ++k) {
      vram::tenant_scope scope(k == 0 ? serving : training);
      vram::tag_scope tag(tags[rng() % 2]);
      std::vector<std::pair<void*, std::size_t>> transient;
      for (int i = 0; i < 30; ++i) {
        std::size_t n = size();
        transient.emplace_back(t.allocate_sync(n), n);
      }
      if (kept[k].empty())
        for (int i = 0; i < 20; ++i) {
          std::size_t n = size();
          kept[k].emplace_back(t.allocate_sync(n), n);
        }
      for (int r = 0; r < 5; ++r) {  // replace a few long-lived blocks
        auto& slot = kept[k][rng() % kept[k].size()];
        t.deallocate_sync(slot.first, slot.second);
        slot.second = size();
        slot.first = t.allocate_sync(slot.second);
      }
      for (auto [p, n] : transient) t.deallocate_sync(p, n);
    }
  }
  void finish() {
    for (auto& set : kept)
      for (auto [p, n] : set) t.deallocate_sync(p, n);
  }
};

std::shared_ptr<vram::tenant_registry> registry() { return std::make_shared<vram::tenant_registry>(); }

}  // namespace

TEST_CASE("mark_step: a summary per step") {
  auto reg = registry();
  tracker t(vram::host_source{}, vram::tracker_options{.registry = reg});
  vram::tenant job = reg->create("job");
  vram::tenant_scope scope(job);
  void* a = t.allocate_sync(1000);
  void* b = t.allocate_sync(3000);
  t.deallocate_sync(b, 3000);
  auto first = t.mark_step();
  CHECK(first.step == 1);
  CHECK(first.peak_live == 4000);
  CHECK(first.live_at_end == 1000);
  CHECK(first.allocations == 2);
  REQUIRE(first.by_tenant.size() == 1);
  CHECK(first.by_tenant[0].name == "job");
  auto second = t.mark_step();
  CHECK(second.step == 2);
  CHECK(second.allocations == 0);
  CHECK(second.peak_live == 1000);
  CHECK(t.steps().size() == 2);
  t.deallocate_sync(a, 1000);
  CHECK(t.leaks().empty());
}

TEST_CASE("mark_step finds a slow leak hidden among normal churn, and nothing else") {
  auto reg = registry();
  tracker t(vram::host_source{}, vram::tracker_options{.event_capacity = 0, .registry = reg});
  churn work{t, reg->create("serving"), reg->create("training")};
  std::vector<void*> leaked;
  bool found = false;
  for (int s = 0; s < 300 && !found; ++s) {
    work.step();
    {  // 256 KiB a step that nobody frees: a cache that grows without bound
      vram::tenant_scope scope(work.training);
      vram::tag_scope tag("cache.grow");
      leaked.push_back(t.allocate_sync(256 << 10));
    }
    t.mark_step();
    for (const vram::leak_report& l : t.leaks()) {
      INFO("step " << s + 1 << ": " << (l.what == vram::leak_report::kind::tag ? "tag " : "tenant ") << l.name);
      const bool the_leak = l.what == vram::leak_report::kind::tag ? l.name == "cache.grow" : l.name == "training";
      CHECK(the_leak);
      if (l.what == vram::leak_report::kind::tag) {
        found = true;
        CHECK(l.steps >= 8);
        CHECK(l.to_bytes - l.from_bytes >= std::size_t{1} << 20);
        REQUIRE_FALSE(l.sites.empty());
        for (const auto& site : l.sites) {
          CHECK(site.tag == "cache.grow");
          CHECK(site.bytes == std::size_t{256} << 10);
        }
      }
    }
  }
  CHECK(found);
  CHECK(t.steps().size() <= 20);  // found within the first few marks after the threshold
  for (void* p : leaked) t.deallocate_sync(p, 256 << 10);
  work.finish();
  t.check_invariants();
}

TEST_CASE("1,000 steps of a steady workload raise no leak alarm") {
  auto reg = registry();
  tracker t(vram::host_source{}, vram::tracker_options{.event_capacity = 0, .registry = reg});
  churn work{t, reg->create("serving"), reg->create("training")};
  std::size_t alarms = 0;
  for (int s = 0; s < 1000; ++s) {
    work.step();
    t.mark_step();
    alarms += t.leaks().size();
  }
  CHECK(alarms == 0);
  CHECK(t.steps().size() == 1000);
  work.finish();
  t.check_invariants();
}

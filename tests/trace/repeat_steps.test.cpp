// repeat_steps (a trace as repeated steps) and the replay of such a trace: the boundaries
// marked, each step measured apart, and planned_pool learning the first step and serving the
// later ones within 1% of their peak live.

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>

#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/simulated_device_source.hpp>
#include <vram/trace/repeat_steps.hpp>
#include <vram/trace/replay.hpp>
#include <vram/trace/workloads.hpp>

#include "support/real_traces.hpp"

namespace {

using vram::trace::event;

vram::simulated_device_source device() {
  return vram::simulated_device_source(vram::simulated_device_options{
      .capacity = std::size_t{80} << 30, .granularity = std::size_t{2} << 20, .contiguous = true});
}

/// Live bytes at each step start, replaying the events by id.
std::vector<std::uint64_t> live_at_step_starts(const vram::trace::trace& t) {
  std::vector<std::uint64_t> out;
  std::map<std::uint64_t, std::uint64_t> live;
  std::uint64_t bytes = 0;
  std::size_t next = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    if (next < t.step_starts.size() && t.step_starts[next] == i) {
      out.push_back(bytes);
      ++next;
    }
    const event& e = t.events[i];
    if (e.kind == event::op::alloc) {
      live[e.id] = e.bytes;
      bytes += e.bytes;
    } else {
      bytes -= live.at(e.id);
      live.erase(e.id);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("repeat_steps: each step is the window, starting from the same live blocks", "[trace][traces]") {
  const auto& t = vram::test::real("medium_1024_training_memory_snapshot.pickle");  // 664 blocks live at the start
  REQUIRE(t.initial_live > 0);
  auto r = vram::trace::repeat_steps(t, 3);
  vram::test::check_consistent(r);
  REQUIRE(r.step_starts.size() == 3);
  CHECK(r.step_starts[0] == t.initial_live);
  CHECK(r.initial_live == t.initial_live);
  // Every step starts from the blocks live at the start of the window.
  auto starts = live_at_step_starts(r);
  std::uint64_t initial = 0;
  for (std::size_t i = 0; i < t.initial_live; ++i) initial += t.events[i].bytes;
  for (std::uint64_t live : starts) CHECK(live == initial);
  // Each step holds the window's events, then the frees of what it left and the re-allocations.
  const std::size_t window = t.events.size() - t.initial_live;
  for (std::size_t k = 0; k < 3; ++k) {
    std::size_t end = k + 1 < 3 ? r.step_starts[k + 1] : r.events.size();
    CHECK(end - r.step_starts[k] >= window);
    for (std::size_t i = 0; i < window; i += 997) {  // same kinds and sizes, in the same order
      CHECK(r.events[r.step_starts[k] + i].kind == t.events[t.initial_live + i].kind);
      CHECK(r.events[r.step_starts[k] + i].bytes == t.events[t.initial_live + i].bytes);
    }
  }
  CHECK(r.peak_live_bytes() == t.peak_live_bytes());
  CHECK_THROWS_AS(vram::trace::repeat_steps(t, 0), vram::invalid_argument);
}

TEST_CASE("replay of steps: marks each boundary, measures each step, and times the later ones", "[trace]") {
  auto t = vram::trace::repeat_steps(vram::trace::transformer_training(), 3);
  vram::planned_pool<vram::simulated_device_source> planned(device());
  auto r = vram::trace::replay(t, planned, [&] { return planned.stats(); }, {});
  REQUIRE(r.steps.size() == 3);
  auto s = planned.summary();
  CHECK(s.now == vram::plan_summary::phase::serving);
  CHECK(s.plans_made == 1);
  CHECK(s.steps_served == 1);  // the third step's mark would close it; the replay ends first
  for (const auto& step : r.steps) CHECK(step.peak_live_bytes == t.peak_live_bytes());
  // From the second step, the plan: within 1% of peak live where the pattern repeats exactly.
  CHECK(r.later_steps_reserved_per_live() <= 1.01);
  // The online pool on the same trace (its figure is what the plan improves on).
  vram::stream_pool<vram::simulated_device_source> online(device());
  auto o = vram::trace::replay(t, online, [&] { return online.stats(); }, {});
  CHECK(r.later_steps_reserved_per_live() <= o.later_steps_reserved_per_live());
  CHECK(o.steps.size() == 3);
  CHECK(planned.stats().live_bytes == 0);
  planned.check_invariants();
}

TEST_CASE("replay of steps: the plan is never worse than the online pool on the shared traces", "[trace][traces]") {
  for (const char* name : {"memory.pickle", "medium_1024_training_memory_snapshot.pickle", "df_index_resolver.json.gz",
                           "pangu_2.6B.csv"}) {
    INFO(name);
    auto t = vram::trace::repeat_steps(vram::test::real(name), 2);
    vram::planned_pool<vram::simulated_device_source> planned(device(), {.planning_budget = std::chrono::milliseconds(20)});
    auto p = vram::trace::replay(t, planned, [&] { return planned.stats(); }, {}, {.time_operations = false});
    vram::stream_pool<vram::simulated_device_source> online(device());
    auto o = vram::trace::replay(t, online, [&] { return online.stats(); }, {}, {.time_operations = false});
    CHECK(p.ooms == 0);
    CHECK(p.later_steps_reserved_per_live() <= o.later_steps_reserved_per_live());
    CHECK(planned.summary().last_step_off_plan == 0);
    planned.check_invariants();
  }
}

// The adversarial harness (support/adversarial_steps.hpp) on planned_pool and stream_pool: a
// training-like loop on three host streams that lag at random, each mutation of the repeating
// step, single-threaded (every event in one order) and with one thread per stream. No block
// may be corrupted or overlap another, check_invariants() must hold at every boundary, and
// planned_pool may reserve at most 1% more than the online pool it is built on.

#include <catch2/catch.hpp>

#include <vector>

#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>

#include "support/adversarial_steps.hpp"

namespace {

namespace adv = vram::test::adversarial;
constexpr int steps = 9;

vram::planned_pool_options planned_options() {
  return {.planning_budget = std::chrono::milliseconds(5)};
}

}  // namespace

TEST_CASE("adversarial steps: planned_pool on three lagging streams, every mutation", "[planned_pool][adversarial]") {
  for (adv::mutation m : adv::all_mutations) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      INFO("mutation " << adv::name_of(m) << ", seed " << seed);
      auto run = adv::mutated_steps(adv::step_shape{}, m, steps, seed);
      std::vector<vram::host_stream> streams(3);
      vram::planned_pool<vram::host_source> planned(vram::host_source{}, planned_options());
      adv::findings p = adv::run(planned, run, streams, false, seed);
      CHECK(p.corrupted == 0);
      CHECK(p.unordered == 0);
      CHECK(p.overlaps == 0);
      CHECK(p.invariant_failures == 0);
      CHECK(p.first_invariant_failure == "");
      CHECK(planned.stats().live_bytes == 0);

      vram::stream_pool<vram::host_source> online(vram::host_source{}, planned_options().online);
      adv::findings o = adv::run(online, run, streams, false, seed);
      CHECK(o.corrupted == 0);
      CHECK(o.unordered == 0);
      CHECK(o.overlaps == 0);
      CHECK(o.invariant_failures == 0);
      CAPTURE(p.peak_reserved, o.peak_reserved);
      CHECK(double(p.peak_reserved) <= 1.01 * double(o.peak_reserved));
    }
  }
}

TEST_CASE("adversarial steps: one thread per stream, planned_pool and stream_pool", "[planned_pool][adversarial][threads]") {
  for (adv::mutation m : {adv::mutation::none, adv::mutation::missing, adv::mutation::swapped,
                          adv::mutation::freed_late, adv::mutation::accumulation}) {
    INFO("mutation " << adv::name_of(m));
    auto run = adv::mutated_steps(adv::step_shape{}, m, steps, 7);
    std::vector<vram::host_stream> streams(3);
    vram::planned_pool<vram::host_source> planned(vram::host_source{}, planned_options());
    adv::findings p = adv::run(planned, run, streams, true, 7);
    CHECK(p.corrupted == 0);
    CHECK(p.unordered == 0);
    CHECK(p.overlaps == 0);
    CHECK(p.first_invariant_failure == "");
    CHECK(p.invariant_failures == 0);

    vram::stream_pool<vram::host_source> online(vram::host_source{}, planned_options().online);
    adv::findings o = adv::run(online, run, streams, true, 7);
    CHECK(o.corrupted == 0);
    CHECK(o.unordered == 0);
    CHECK(o.overlaps == 0);
    CHECK(o.invariant_failures == 0);
  }
}

TEST_CASE("adversarial steps: a repeating loop with gradients across the boundary is served from one range",
          "[planned_pool][adversarial]") {
  auto run = adv::mutated_steps(adv::step_shape{}, adv::mutation::none, steps, 3);
  std::vector<vram::host_stream> streams(3);
  vram::planned_pool<vram::host_source> planned(vram::host_source{}, planned_options());
  adv::findings p = adv::run(planned, run, streams, false, 3);
  CHECK(p.corrupted == 0);
  const vram::plan_summary s = planned.summary();
  CHECK(s.now == vram::plan_summary::phase::serving);
  CHECK(s.plans_made == 2);
  CHECK(s.last_step_off_plan == 0);
  // The first step makes the weights and the optimizer state, and is no model of the next
  // ones: its plan is dropped, and the next recording plans every block, the gradients too.
  CHECK(s.planned_entries == s.entries);
}

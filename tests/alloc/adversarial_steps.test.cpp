// The adversarial harness (support/adversarial_steps.hpp) on planned_pool and stream_pool: a
// training-like loop on three host streams that lag at random, each mutation of the repeating
// step, single-threaded (every event in one order) and with one thread per stream. No block
// may be corrupted or overlap another, check_invariants() must hold at every boundary, and
// planned_pool may reserve at most 1% more than the online pool it is built on (over host
// memory in 256 KiB growths the blocks are checked, not the reserve: docs/planned_pool.md,
// Limits).

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
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

/// One run's findings: no block corrupted, handed out unordered or overlapping another, and
/// check_invariants() held at every boundary.
void check_clean(const adv::findings& f) {
  CHECK(f.corrupted == 0);
  CHECK(f.unordered == 0);
  CHECK(f.overlaps == 0);
  CHECK(f.invariant_failures == 0);
  CHECK(f.first_invariant_failure == "");
}

/// Runs `shape` under every mutation on planned_pool and on stream_pool: findings clean, no
/// block left live, planned_pool's peak reserved within 1% of the online pool's;
/// check_plan(summary) looks at the plan of the unmutated run.
template <class CheckPlan>
void every_mutation(const adv::step_shape& shape, std::uint64_t seed, CheckPlan&& check_plan) {
  for (adv::mutation m : adv::all_mutations) {
    INFO("mutation " << adv::name_of(m));
    auto run = adv::mutated_steps(shape, m, steps, seed);
    std::vector<vram::host_stream> streams(3);
    vram::planned_pool<vram::host_source> planned(vram::host_source{}, planned_options());
    adv::findings p = adv::run(planned, run, streams, false, seed);
    check_clean(p);
    CHECK(planned.stats().live_bytes == 0);
    if (m == adv::mutation::none) check_plan(planned.summary());
    vram::stream_pool<vram::host_source> online(vram::host_source{}, planned_options().online);
    adv::findings o = adv::run(online, run, streams, false, seed);
    CAPTURE(p.peak_reserved, o.peak_reserved);
    CHECK(double(p.peak_reserved) <= 1.01 * double(o.peak_reserved));
  }
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
      check_clean(p);
      CHECK(planned.stats().live_bytes == 0);

      vram::stream_pool<vram::host_source> online(vram::host_source{}, planned_options().online);
      adv::findings o = adv::run(online, run, streams, false, seed);
      check_clean(o);
      CAPTURE(p.peak_reserved, o.peak_reserved);
      CHECK(double(p.peak_reserved) <= 1.01 * double(o.peak_reserved));
    }
  }
}

TEST_CASE("adversarial steps: zero_grad after the forward, a plan in two parts, every mutation",
          "[planned_pool][adversarial]") {
  adv::step_shape shape;
  shape.zero_grad_late = true;  // the last step's gradients live beside this one's activations
  every_mutation(shape, 4, [](const vram::plan_summary& s) {
    CHECK(s.lower_part_bytes > 0);  // the forward's blocks, taken at the mark
    CHECK(s.lower_part_bytes < s.range_bytes);
    CHECK(s.planned_entries == s.entries);
    CHECK(s.last_step_off_plan == 0);
  });
}

TEST_CASE("adversarial steps: the loss freed after the next forward, every mutation", "[planned_pool][adversarial]") {
  // The gradients go at the step's start, the last step's loss at the end of the forward: the
  // upper part of the range is taken only then, the forward's blocks in the lower part.
  adv::step_shape shape;
  shape.loss_crosses = true;
  every_mutation(shape, 5, [](const vram::plan_summary& s) {
    CHECK(s.lower_part_bytes > 0);
    CHECK(s.last_step_off_plan == 0);
  });
}

TEST_CASE("adversarial steps: over host memory in 256 KiB growths, every mutation", "[planned_pool][adversarial]") {
  // Small growths over an upstream that is not contiguous: a range larger than every free
  // block would be a growth of its own beside the memory the outside blocks keep, so such
  // plans are declined (take_part). The blocks stay intact whatever is declined or taken;
  // the reserve against stream_pool's is printed with -s (docs/planned_pool.md, Limits), not
  // bounded: one growth is about 5% of these peaks, and the lagging streams move
  // stream_pool's own peak by more than that from one run to the next, so a second run of
  // stream_pool is printed beside it as the yardstick.
  vram::planned_pool_options options = planned_options();
  options.online.growth_step = 256 << 10;
  std::size_t declined = 0;
  std::vector<double> planned_ratios, online_ratios;
  for (adv::mutation m : adv::all_mutations) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      INFO("mutation " << adv::name_of(m) << ", seed " << seed);
      auto run = adv::mutated_steps(adv::step_shape{}, m, steps, seed);
      std::vector<vram::host_stream> streams(3);
      vram::planned_pool<vram::host_source> planned(vram::host_source{}, options);
      adv::findings p = adv::run(planned, run, streams, false, seed);
      check_clean(p);
      CHECK(planned.stats().live_bytes == 0);
      declined += planned.summary().plans_declined;
      vram::stream_pool<vram::host_source> online(vram::host_source{}, options.online);
      adv::findings o = adv::run(online, run, streams, false, seed);
      check_clean(o);
      vram::stream_pool<vram::host_source> again(vram::host_source{}, options.online);
      adv::findings a = adv::run(again, run, streams, false, seed);
      check_clean(a);
      REQUIRE(o.peak_reserved > 0);
      const double planned_ratio = double(p.peak_reserved) / double(o.peak_reserved);
      const double online_ratio = double(a.peak_reserved) / double(o.peak_reserved);
      INFO("reserved over stream_pool's " << planned_ratio << "; stream_pool's second run " << online_ratio);
      planned_ratios.push_back(planned_ratio);
      online_ratios.push_back(online_ratio);
      CHECK(a.peak_reserved > 0);  // shows the line above with -s
    }
  }
  auto median_and_worst = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return std::to_string(v[v.size() / 2]) + " / " + std::to_string(v.back());
  };
  WARN("reserved over stream_pool's, median / worst of " << planned_ratios.size()
       << " runs: planned_pool " << median_and_worst(planned_ratios) << ", stream_pool's second run "
       << median_and_worst(online_ratios));
  CHECK(declined > 0);
}

TEST_CASE("adversarial steps: one thread per stream, planned_pool and stream_pool", "[planned_pool][adversarial][threads]") {
  for (adv::mutation m : {adv::mutation::none, adv::mutation::missing, adv::mutation::swapped,
                          adv::mutation::freed_late, adv::mutation::accumulation}) {
    INFO("mutation " << adv::name_of(m));
    auto run = adv::mutated_steps(adv::step_shape{}, m, steps, 7);
    std::vector<vram::host_stream> streams(3);
    vram::planned_pool<vram::host_source> planned(vram::host_source{}, planned_options());
    adv::findings p = adv::run(planned, run, streams, true, 7);
    check_clean(p);

    vram::stream_pool<vram::host_source> online(vram::host_source{}, planned_options().online);
    adv::findings o = adv::run(online, run, streams, true, 7);
    check_clean(o);
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

// planned_pool on a generated training loop (trace::training_loop_step: GPT-2 small, AdamW,
// zero_grad first, so every gradient crosses the step boundary) and on every shared trace,
// replayed as steps against pool-contiguous, the online pool on the same device: from the
// first step served from a plan on, no more reserved than the online pool, and within 1% of
// peak live.

#include <catch2/catch.hpp>

#include <algorithm>

#include <vram-replay/lineup.hpp>
#include <vram/trace/repeat_steps.hpp>
#include <vram/trace/step.hpp>

#include "support/real_traces.hpp"

namespace {

double ratio(const vram::trace::step_figures& s) { return double(s.peak_reserved_bytes) / double(s.peak_live_bytes); }

const vram::trace::transformer_model& gpt2() {
  static const vram::trace::transformer_model m = *vram::trace::find_preset("gpt2");
  return m;
}

vram::trace::step_options shape(std::uint64_t batch, std::uint64_t sequence) {
  vram::trace::step_options o;
  o.batch = batch;
  o.sequence = sequence;
  return o;
}

}  // namespace

TEST_CASE("planned_pool on a generated training loop: gradients across the boundary are planned", "[planned_pool]") {
  const vram::trace::trace step = vram::trace::training_loop_step(gpt2(), shape(4, 512));
  REQUIRE(step.initial_live > 0);  // weights, optimizer state, the last step's gradients
  const vram::trace::trace loop = vram::trace::repeat_steps(step, 4);
  vram::trace::replay_options options;
  options.time_operations = false;
  const auto planned = vram_replay::pool_planned_config().run(loop, options);
  const auto online = vram_replay::pool_contiguous_config().run(loop, options);
  REQUIRE(planned.steps.size() == 4);
  REQUIRE(online.steps.size() == 4);
  CAPTURE(planned.note);
  for (std::size_t k = 1; k < 4; ++k) {
    CAPTURE(k, ratio(planned.steps[k]), ratio(online.steps[k]));
    CHECK(planned.steps[k].peak_reserved_bytes <= online.steps[k].peak_reserved_bytes);
  }
  for (std::size_t k = 1; k < 4; ++k) CHECK(ratio(planned.steps[k]) <= 1.01);
  CHECK(planned.note.find(", 0 off it") != std::string::npos);
  CHECK(planned.ooms == 0);
}

TEST_CASE("planned_pool on the shared traces as three steps, within 1% of peak live", "[planned_pool][traces]") {
  // Three of them are training steps whose gradients the next step frees (SOURCES.md): the
  // plan in two parts is what keeps their first served step off the online pool's figure.
  for (const char* name : {"CliffKai__memory_snapshot_large_bwd.pickle", "LINYUNLinYun__xl_ctx512_full_step_bf16.pickle",
                           "NiuHuangxiaozi__forward_and_backward_memory_snapshot_200.pickle",
                           "NiuHuangxiaozi__forward_and_backward_memory_snapshot_200_mixed_precision.pickle",
                           "medium_1024_training_memory_snapshot.pickle", "memory.pickle",
                           "sidsoc12__mem_snapshot_ctx128_fp32_train.pickle", "pangu_2.6B.csv", "df_index_resolver.json.gz"}) {
    INFO(name);
    const vram::trace::trace loop = vram::trace::repeat_steps(vram::test::real(name), 3);
    vram::trace::replay_options options;
    options.time_operations = false;
    const auto planned = vram_replay::pool_planned_config().run(loop, options);
    const auto online = vram_replay::pool_contiguous_config().run(loop, options);
    CAPTURE(planned.note, planned.later_steps_reserved_per_live(), online.later_steps_reserved_per_live());
    CHECK(planned.later_steps_reserved_per_live() <= 1.01);
    CHECK(planned.later_steps_reserved_per_live() <= online.later_steps_reserved_per_live());
    CHECK(planned.ooms == 0);
  }
}

TEST_CASE("trace::window keeps what is live at its start as the blocks live at the start", "[trace]") {
  vram::trace::step_options o = shape(1, 128);
  o.zero_grad_first = true;
  const vram::trace::step_trace s = vram::trace::generate_step(gpt2(), o);
  REQUIRE(s.step_starts.size() == 3);  // two steps and the teardown
  const vram::trace::trace w = vram::trace::window(s.t, s.step_starts[1], s.step_starts[2]);
  vram::test::check_consistent(w);
  // Live at the second step's start: the weights, the optimizer state and the gradients.
  std::size_t grads = 0;
  for (std::size_t i = 0; i < w.initial_live; ++i) grads += s.category_of[w.events[i].id] == vram::trace::category::gradients;
  CHECK(grads > 0);
  CHECK_THROWS_AS(vram::trace::window(s.t, 5, 2), vram::invalid_argument);
}

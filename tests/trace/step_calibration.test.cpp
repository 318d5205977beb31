// The step generator against recorded reality: the shared training trace of a GPT-2-medium-
// shaped model (SOURCES.md, file 3), whose shapes are read off its allocation sizes
// (docs/fit.md, "Calibration"). The predicted peak live must be within 5% of the recorded one;
// autocast's weight cache is what brings it there (without it the miss is 7.7%).
#include <catch2/catch.hpp>

#include <cmath>

#include <vram/trace/step.hpp>

#include "support/real_traces.hpp"

using namespace vram::trace;

TEST_CASE("the generated step of the recorded GPT-2-medium-shaped model peaks within 5% of the recording", "[traces]") {
  // 24 layers of d_model 1024 (fp32 q/k/v/o weights: 4 MiB each, 96 of them, each with two
  // AdamW moments: 288 blocks of 4 MiB live at the start), a SwiGLU of width 4096 (3 x 24 x 3
  // blocks of 16 MiB), RMSNorm (147 blocks of 4 KiB: 49 norm weights x 3), separate embedding
  // and head of vocabulary 10,000 (6 blocks of 40,960,000 bytes), rotary positions; batch 4 of
  // 1024 tokens with 16 heads (attention scores of 4 x 16 x 1024^2 x 4 bytes = 256 MiB in
  // fp32 and 128 MiB in bf16: autocast over fp32 weights).
  transformer_model m{"cs336-medium", 24, 1024, 16, 16, 4096, 10000, 0, mlp_kind::swiglu, false, false};
  step_options o;
  o.batch = 4;
  o.sequence = 1024;
  o.weights = number_format::fp32;
  o.autocast = true;
  o.optimizer = optimizer_kind::adamw;
  const std::uint64_t predicted = peak_by_category(generate_step(m, o)).peak_live;
  const std::uint64_t recorded = vram::test::real("medium_1024_training_memory_snapshot.pickle").peak_live_bytes();
  const double error = (double(predicted) - double(recorded)) / double(recorded);
  INFO("predicted " << predicted << ", recorded " << recorded << " bytes: " << error * 100 << "%");
  CHECK(std::abs(error) <= 0.05);
  const auto p = peak_by_category(generate_step(m, o));
  CHECK(p.at_peak[static_cast<std::size_t>(category::autocast_cache)] == 2 * (24 * m.layer_linear_parameters() + 10000 * 1024));
}

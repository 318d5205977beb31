// The step generator against published measurements (../shared/fit/published.md: PyTorch's
// max_memory_allocated from litgpt's resource tables and config hub, and optimum-benchmark's
// GPT-2 training run). The runs, each as its source ran it, are vram-fit's own table
// (tools/vram-fit/measured.hpp), which it quotes to users; docs/fit.md has the table with the
// commands. Every case is required within 5%, and the mechanisms that bring the cases there
// are each shown to matter.

#include <catch2/catch.hpp>

#include <cmath>

#include <vram-fit/measured.hpp>
#include <vram/trace/step.hpp>

using namespace vram::trace;
using vram_fit::check;
using vram_fit::measured_run;
using vram_fit::measured_runs;
using vram_fit::detail::gpt2_trainer;
using vram_fit::detail::litgpt_four_bit;
using vram_fit::detail::lora;
using vram_fit::detail::serving;

namespace {

double error_of(const measured_run& r) { return check(r).error(); }

}  // namespace

TEST_CASE("every measured run's peak is predicted within 5%") {
  REQUIRE(measured_runs().size() == 9);  // ../shared/fit/published.md's rows
  for (const measured_run& r : measured_runs()) {
    const double e = error_of(r);
    INFO(r.what << ": " << e * 100 << "%");
    CHECK(std::abs(e) <= 0.05);
  }
}

TEST_CASE("the foreach AdamW's temporaries are what brings GPT-2's Trainer run within 5%") {
  measured_run c{"GPT-2 single-tensor", "gpt2", gpt2_trainer(), 2506.7e6};
  c.run.foreach = false;
  CHECK(error_of(c) < -0.10);  // one temporary at a time: the 14% miss
}

TEST_CASE("the inputs bitsandbytes 0.41 keeps are what brings litgpt's QLoRA runs within 5%") {
  step_options qlora = litgpt_four_bit(lora(8, 1, 1304, number_format::nf4));
  qlora.steps = 1;
  qlora.four_bit.keeps_input = false;  // bitsandbytes 0.43.2 and later
  CHECK(error_of({"Llama-2-7B QLoRA, inputs not kept", "llama-2-7b", qlora, 14.14e9}) < -0.10);
}

TEST_CASE("bitsandbytes' double quantization saves what litgpt's nf4-dq rows measure") {
  // litgpt's tables: nf4 less nf4-dq is 0.30 GB in QLoRA and 0.31 GB in inference for Llama-2-7B.
  step_options plain = litgpt_four_bit(serving(number_format::nf4)), dq = plain;
  dq.double_quant = true;
  const transformer_model m = *find_preset("llama-2-7b");
  const double saved = double(peak_by_category(generate_step(m, plain)).peak_live) -
                       double(peak_by_category(generate_step(m, dq)).peak_live);
  INFO(saved / 1e9 << " GB");
  CHECK(std::abs(saved - 0.305e9) <= 0.02e9);
}

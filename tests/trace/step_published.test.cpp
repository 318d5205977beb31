// The step generator against published measurements (../shared/fit/published.md: PyTorch's
// max_memory_allocated from litgpt's resource tables and config hub, and optimum-benchmark's
// GPT-2 training run). Each case states the run as its source ran it; docs/fit.md has the
// table with the commands. Cases the model reaches are required within 5%; the cases it does
// not yet reach are checked against their known error band so that a change in either
// direction is seen (docs/fit.md, "What is left").

#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <vram/trace/step.hpp>

using namespace vram::trace;

namespace {

struct published_case {
  const char* what;
  const char* preset;
  step_options run;
  double published_bytes;  // GB = 10^9 bytes, as the sources print them
};

step_options lora(std::uint64_t rank, std::uint64_t micro, std::uint64_t sequence, number_format w) {
  step_options o;
  o.mode = run_mode::lora;
  o.lora_rank = rank;
  o.batch = micro;
  o.sequence = sequence;
  o.weights = w;
  o.flash_attention = true;  // litgpt calls scaled_dot_product_attention, flash on A100 and A10G
  return o;
}
step_options serving(number_format w) {
  step_options o;
  o.mode = run_mode::inference;
  o.batch = 1;
  o.sequence = 60;  // a short prompt and 50 new tokens
  o.decode_steps = 50;
  o.weights = w;
  o.flash_attention = true;
  return o;
}
step_options gpt2_trainer() {
  step_options o;  // HF Trainer, fp32, no autocast, batch 2 of 16 tokens, AdamW (foreach)
  o.batch = 2;
  o.sequence = 16;
  o.weights = number_format::fp32;
  o.autocast = false;
  return o;
}

double error_of(const published_case& c) {
  const double predicted = double(peak_by_category(generate_step(*find_preset(c.preset), c.run)).peak_live);
  return (predicted - c.published_bytes) / c.published_bytes;
}

}  // namespace

TEST_CASE("published peaks the model reaches are predicted within 5%") {
  const published_case cases[] = {
      {"Llama-2-7B LoRA r8, micro-batch 1 (litgpt, A100)", "llama-2-7b", lora(8, 1, 1304, number_format::bf16), 21.30e9},
      {"Llama-2-7B LoRA r8, micro-batch 2", "llama-2-7b", lora(8, 2, 1304, number_format::bf16), 29.07e9},
      {"Llama-2-13B LoRA r8, micro-batch 1", "llama-2-13b", lora(8, 1, 1304, number_format::bf16), 38.12e9},
      {"Llama-2-7B bf16 inference", "llama-2-7b", serving(number_format::bf16), 13.52e9},
      {"Llama-2-7B LoRA r32, 2 x 512 (litgpt config hub, A10G)", "llama-2-7b", lora(32, 2, 512, number_format::bf16),
       19.77e9},
      {"GPT-2 small, HF Trainer, fp32, 2 x 16, AdamW foreach (optimum-benchmark)", "gpt2", gpt2_trainer(), 2506.7e6},
  };
  for (const published_case& c : cases) {
    const double e = error_of(c);
    INFO(c.what << ": " << e * 100 << "%");
    CHECK(std::abs(e) <= 0.05);
  }
}

TEST_CASE("the foreach AdamW's temporaries are what brings GPT-2's Trainer run within 5%") {
  published_case c{"GPT-2 single-tensor", "gpt2", gpt2_trainer(), 2506.7e6};
  c.run.foreach = false;
  CHECK(error_of(c) < -0.10);  // one temporary at a time: the 14% miss
}

TEST_CASE("published 4-bit peaks the model does not reach stay in their known band") {
  step_options qlora = lora(8, 1, 1304, number_format::nf4);
  step_options hub = lora(32, 2, 512, number_format::nf4);
  const published_case cases[] = {
      {"Llama-2-7B QLoRA (bnb.nf4), micro-batch 1", "llama-2-7b", qlora, 14.14e9},
      {"Llama-2-7B QLoRA, 2 x 512 (A10G)", "llama-2-7b", hub, 13.68e9},
      {"Llama-2-7B nf4 inference", "llama-2-7b", serving(number_format::nf4), 4.57e9},
  };
  for (const published_case& c : cases) {
    const double e = error_of(c);
    INFO(c.what << ": " << e * 100 << "%");
    CHECK(e < 0);      // under: what is left is not modelled (docs/fit.md)
    CHECK(e > -0.25);
  }
}

TEST_CASE("bitsandbytes' double quantization saves what litgpt's nf4-dq rows measure") {
  // litgpt's tables: nf4 less nf4-dq is 0.30 GB in QLoRA and 0.31 GB in inference for Llama-2-7B.
  step_options plain = serving(number_format::nf4), dq = plain;
  dq.double_quant = true;
  const decoder_model m = *find_preset("llama-2-7b");
  const double saved = double(peak_by_category(generate_step(m, plain)).peak_live) -
                       double(peak_by_category(generate_step(m, dq)).peak_live);
  INFO(saved / 1e9 << " GB");
  CHECK(std::abs(saved - 0.305e9) <= 0.02e9);
}

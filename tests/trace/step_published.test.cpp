// The step generator against published measurements (../shared/fit/published.md: PyTorch's
// max_memory_allocated from litgpt's resource tables and config hub, and optimum-benchmark's
// GPT-2 training run). Each case states the run as its source ran it; docs/fit.md has the
// table with the commands. Every case is required within 5%.

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
/// The config hub's runs: global batch 8 in micro-batches of 2, of at most 512 tokens.
step_options config_hub(number_format w) {
  step_options o = lora(32, 8, 512, w);
  o.micro_batch = 2;
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
/// A 4-bit base as litgpt runs it: Lightning Fabric's BitsandbytesPrecision quantizes every
/// linear layer, the head too, from fp16; bitsandbytes 0.41 (the tables' version) keeps each
/// product's input; a quantized base trains with bitsandbytes' PagedAdamW.
step_options litgpt_four_bit(step_options o) {
  o.four_bit = {.keeps_input = true, .from_fp16 = true, .head = true};
  if (o.mode == run_mode::lora) o.optimizer = optimizer_kind::paged_adamw;
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
      {"Llama-2-7B LoRA r32, 2 x 512 (litgpt config hub, A10G)", "llama-2-7b", config_hub(number_format::bf16),
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

TEST_CASE("published 4-bit peaks are predicted within 5%") {
  // The resource table puts the longest sample first and only there (get_batch's
  // longest_seq_ix): one pass at 1,304 tokens, every later one shorter.
  step_options qlora = litgpt_four_bit(lora(8, 1, 1304, number_format::nf4));
  qlora.steps = 1;
  const step_options hub = litgpt_four_bit(config_hub(number_format::nf4));
  const published_case cases[] = {
      {"Llama-2-7B QLoRA (bnb.nf4), micro-batch 1", "llama-2-7b", qlora, 14.14e9},
      {"Llama-2-7B QLoRA, 2 x 512 (A10G)", "llama-2-7b", hub, 13.68e9},
      {"Llama-2-7B nf4 inference", "llama-2-7b", litgpt_four_bit(serving(number_format::nf4)), 4.57e9},
  };
  for (const published_case& c : cases) {
    const double e = error_of(c);
    INFO(c.what << ": " << e * 100 << "%");
    CHECK(std::abs(e) <= 0.05);
  }
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

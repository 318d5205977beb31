#pragma once
// The measured runs the step generator is checked against (../shared/fit/published.md;
// docs/fit.md, "Against published measurements"): each run as its source ran it, with what it
// measured. The tests require every prediction within 5% of its figure; vram-fit tells a user
// which of them are runs of the kind asked, and how far its prediction was from each.

#include <cstdint>
#include <vector>

#include <vram/trace/model.hpp>
#include <vram/trace/step.hpp>

namespace vram_fit {

using vram::trace::number_format;
using vram::trace::optimizer_kind;
using vram::trace::run_mode;
using vram::trace::step_options;
using vram::trace::transformer_model;

struct measured_run {
  const char* what;
  const char* preset;
  step_options run;
  double peak_allocated;  ///< PyTorch's max_memory_allocated, bytes (GB = 10^9, as printed)
  double reserved = 0;    ///< max_memory_reserved where the source gives it, else 0
};

namespace detail {

inline step_options lora(std::uint64_t rank, std::uint64_t micro, std::uint64_t sequence, number_format w) {
  step_options o;
  o.mode = run_mode::lora;
  o.lora_rank = rank;
  o.batch = micro;
  o.sequence = sequence;
  o.weights = w;
  o.flash_attention = true;  // litgpt calls scaled_dot_product_attention, flash on A100 and A10G
  o.blas_workspace = vram::trace::blas_workspace_before_hopper;  // A100, A10G
  return o;
}
/// litgpt's config hub runs: global batch 8 in micro-batches of 2, of at most 512 tokens.
inline step_options config_hub(number_format w) {
  step_options o = lora(32, 8, 512, w);
  o.micro_batch = 2;
  return o;
}
/// litgpt's generation: a short prompt and 50 new tokens.
inline step_options serving(number_format w) {
  step_options o;
  o.mode = run_mode::inference;
  o.batch = 1;
  o.sequence = 60;
  o.decode_steps = 50;
  o.weights = w;
  o.flash_attention = true;
  o.blas_workspace = vram::trace::blas_workspace_before_hopper;  // A100
  return o;
}
/// A 4-bit base as litgpt runs it: Lightning Fabric's BitsandbytesPrecision quantizes every
/// linear layer, the head too, from fp16; bitsandbytes 0.41 (the tables' version) keeps each
/// product's input; a quantized base trains with bitsandbytes' PagedAdamW.
inline step_options litgpt_four_bit(step_options o) {
  o.four_bit = {.keeps_input = true, .from_fp16 = true, .head = true};
  if (o.mode == run_mode::lora) o.optimizer = optimizer_kind::paged_adamw;
  return o;
}
/// optimum-benchmark's GPT-2 run: HF Trainer, fp32, no autocast, batch 2 of 16 tokens, AdamW
/// (foreach).
inline step_options gpt2_trainer() {
  step_options o;
  o.batch = 2;
  o.sequence = 16;
  o.weights = number_format::fp32;
  o.autocast = false;
  o.blas_workspace = vram::trace::blas_workspace_before_hopper;  // A10G
  return o;
}

}  // namespace detail

/// Every measured run, in docs/fit.md's order.
inline const std::vector<measured_run>& measured_runs() {
  using namespace detail;
  static const std::vector<measured_run> runs = [] {
    // The resource table puts the longest sample first and only there (get_batch's
    // longest_seq_ix): one pass at 1,304 tokens, every later one shorter.
    step_options qlora = litgpt_four_bit(lora(8, 1, 1304, number_format::nf4));
    qlora.steps = 1;
    return std::vector<measured_run>{
        {"Llama-2-7B LoRA r8, micro-batch 1 (litgpt, A100)", "llama-2-7b", lora(8, 1, 1304, number_format::bf16), 21.30e9},
        {"Llama-2-7B LoRA r8, micro-batch 2 (litgpt, A100)", "llama-2-7b", lora(8, 2, 1304, number_format::bf16), 29.07e9},
        {"Llama-2-13B LoRA r8, micro-batch 1 (litgpt, A100)", "llama-2-13b", lora(8, 1, 1304, number_format::bf16),
         38.12e9},
        {"Llama-2-7B bf16 inference (litgpt)", "llama-2-7b", serving(number_format::bf16), 13.52e9},
        {"Llama-2-7B LoRA r32, 2 x 512 (litgpt config hub, A10G)", "llama-2-7b", config_hub(number_format::bf16),
         19.77e9},
        {"GPT-2 small, HF Trainer, fp32, 2 x 16, AdamW foreach (optimum-benchmark)", "gpt2", gpt2_trainer(), 2506.7e6,
         2894.1e6},
        {"Llama-2-7B QLoRA nf4, micro-batch 1 (litgpt, bitsandbytes 0.41.1)", "llama-2-7b", qlora, 14.14e9},
        {"Llama-2-7B QLoRA nf4, 2 x 512 (litgpt config hub, A10G)", "llama-2-7b",
         litgpt_four_bit(config_hub(number_format::nf4)), 13.68e9},
        {"Llama-2-7B nf4 inference (litgpt, bitsandbytes 0.41.1)", "llama-2-7b",
         litgpt_four_bit(serving(number_format::nf4)), 4.57e9},
    };
  }();
  return runs;
}

/// How a run stores its weights, as far as the mechanisms go: 16 or 32 bits, int8, 4 bits.
inline int storage_class(number_format f) {
  switch (f) {
    case number_format::int8: return 1;
    case number_format::int4:
    case number_format::nf4:
    case number_format::fp4: return 2;
    default: return 0;
  }
}

/// Whether measured run `r` is of the kind asked: the same mode and storage class, for a dense
/// decoder on one device (no measured run is a mixture, an encoder or sharded).
inline bool same_kind(const transformer_model& m, const step_options& asked, const measured_run& r) {
  return !m.mixture() && !m.encoder && asked.parallel.single() && asked.mode == r.run.mode &&
         storage_class(asked.weights) == storage_class(r.run.weights);
}

/// A measured run and the generator's prediction of its peak allocated bytes.
struct checked_run {
  const measured_run* run;
  double predicted;
  [[nodiscard]] double error() const { return (predicted - run->peak_allocated) / run->peak_allocated; }
};

[[nodiscard]] inline checked_run check(const measured_run& r) {
  const transformer_model m = *vram::trace::find_preset(r.preset);
  return {&r, double(vram::trace::peak_by_category(vram::trace::generate_step(m, r.run)).peak_live)};
}

/// The measured runs of the kind asked, each with the generator's prediction.
[[nodiscard]] inline std::vector<checked_run> checks_of_kind(const transformer_model& m, const step_options& asked) {
  std::vector<checked_run> out;
  for (const measured_run& r : measured_runs())
    if (same_kind(m, asked, r)) out.push_back(check(r));
  return out;
}

}  // namespace vram_fit

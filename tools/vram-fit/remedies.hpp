#pragma once
// The remedies vram-fit weighs: each changes one thing in a run (vram::trace::step_options)
// and says what that costs besides memory.

#include <string>
#include <utility>
#include <vector>

#include <vram/trace/step.hpp>

namespace vram_fit {

using vram::trace::number_format;
using vram::trace::optimizer_kind;
using vram::trace::run_mode;
using vram::trace::step_options;

/// One remedy: what it changes in a run, and what that costs.
struct remedy {
  std::string name;
  std::string cost;
  step_options run;  ///< the run it was offered for, with the change applied
};

/// The remedies that apply to run `r` (each changes one thing).
inline std::vector<remedy> remedies_for(const step_options& r) {
  std::vector<remedy> out;
  auto add = [&](std::string name, std::string cost, auto change) {
    step_options o = r;
    change(o);
    out.push_back({std::move(name), std::move(cost), o});
  };
  const bool trains = r.mode == run_mode::training || r.mode == run_mode::lora;
  if (!r.flash_attention) add("flash attention", "none (a fused kernel; usually faster)", [](auto& o) { o.flash_attention = true; });
  if (trains && r.checkpoint_every != 1)
    add("checkpoint every layer", "recompute: about +33% step time (one more forward)", [](auto& o) { o.checkpoint_every = 1; });
  if (trains && r.optimizer == optimizer_kind::adamw)
    add("8-bit AdamW states", "moments kept in 8 bits (bitsandbytes-style)", [](auto& o) { o.optimizer = optimizer_kind::adamw_8bit; });
  if (trains && r.optimizer == optimizer_kind::adamw)
    add("SGD with momentum", "a different optimizer: one state instead of two", [](auto& o) { o.optimizer = optimizer_kind::sgd; });
  if (trains && r.weights == number_format::fp32)
    add("bf16 weights", "16-bit weights and gradients", [](auto& o) { o.weights = number_format::bf16; });
  if (!r.autocast && r.weights == number_format::fp32)
    add("autocast", "bf16 activations", [](auto& o) { o.autocast = true; });
  const std::uint64_t micro = r.micro_batch == 0 ? r.batch : r.micro_batch;
  if (trains && micro > 1 && micro % 2 == 0)
    add("gradient accumulation (half the micro-batch)", "twice the forward/backward passes per step, same update",
        [micro](auto& o) { o.micro_batch = micro / 2; });
  if (r.mode == run_mode::training && r.parallel.single())  // sharded runs are full training
    add("LoRA, rank 16, frozen base", "trains adapters on q, k, v, o only", [](auto& o) {
      o.mode = run_mode::lora;
      o.lora_rank = 16;
      if (o.optimizer == optimizer_kind::none) o.optimizer = optimizer_kind::adamw;
    });
  if (r.mode != run_mode::training && !vram::trace::is_quantized(r.weights))
    add("int8 base", "8-bit weights (precision of the frozen base)", [](auto& o) { o.weights = number_format::int8; });
  if (r.mode != run_mode::training && r.weights != number_format::int4 && r.weights != number_format::nf4 &&
      r.weights != number_format::fp4)
    add("nf4 base", "4-bit weights in 64-weight blocks (precision of the frozen base)", [](auto& o) {
      o.weights = number_format::nf4;
      o.double_quant = true;
    });
  if (r.mode == run_mode::inference && r.kv_cache != number_format::int8)
    add("int8 KV cache", "8-bit keys and values", [](auto& o) { o.kv_cache = number_format::int8; });
  return out;
}

}  // namespace vram_fit

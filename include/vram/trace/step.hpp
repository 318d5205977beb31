#pragma once
// vram::trace::generate_step: the allocation trace of training or serving a decoder model
// (model.hpp), each allocation marked with what it is (weights, gradients, optimizer state,
// activations, temporaries, KV cache), so that a replay's peak can be split by category.
// What the generator allocates, and why, is in docs/fit.md.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <vram/core/throw.hpp>
#include <vram/trace/detail/emitter.hpp>
#include <vram/trace/detail/step_four_bit.hpp>
#include <vram/trace/model.hpp>
#include <vram/trace/trace.hpp>
#include <vram/trace/window.hpp>

namespace vram::trace {

enum class run_mode : std::uint8_t {
  training,  ///< every weight trained (pre-training and full fine-tuning alike)
  lora,      ///< a frozen base with low-rank adapters on q, k, v and o
  inference, ///< a KV cache per sequence, prefill then decoding
  forward,   ///< one forward pass under no_grad: nothing saved, no KV cache
};
/// Storage of a tensor. int8: LLM.int8's layout (an int8 weight and one fp32 scale per output
/// row); nf4 and fp4: bitsandbytes' 4-bit layout (two weights a byte and one fp32 absmax per
/// 64-weight block; 8-bit absmax with double quantization); int4: 4 bits and no scales.
enum class number_format : std::uint8_t { fp32, bf16, int8, int4, nf4, fp4 };
enum class optimizer_kind : std::uint8_t {
  adamw,       ///< two moments per trained parameter, in the parameter's dtype
  adamw_8bit,  ///< bitsandbytes' 8-bit AdamW: two 8-bit moments with an fp32 absmax per 256
  sgd,         ///< one momentum per trained parameter, in the parameter's dtype
  none,
  /// bitsandbytes' PagedAdamW (litgpt's optimizer for a quantized base): fp32 moments, those of
  /// tensors of 100,000 elements or more in CUDA managed memory, outside PyTorch's allocator
  /// (paged to the host under pressure): not on the device's trace. A fused step per tensor.
  paged_adamw,
};

/// Bits of one element (bits, so that int4 is exact).
[[nodiscard]] constexpr std::uint64_t bits_of(number_format f) noexcept {
  switch (f) {
    case number_format::fp32: return 32;
    case number_format::bf16: return 16;
    case number_format::int8: return 8;
    case number_format::int4:
    case number_format::nf4:
    case number_format::fp4: return 4;
  }
  return 32;
}
[[nodiscard]] constexpr std::uint64_t bytes_of(number_format f, std::uint64_t elements) noexcept {
  return (elements * bits_of(f) + 7) / 8;
}
[[nodiscard]] constexpr bool is_quantized(number_format f) noexcept {
  return f == number_format::int8 || f == number_format::int4 || f == number_format::nf4 || f == number_format::fp4;
}

/// bitsandbytes' 4-bit blocks (`quantize_4bit`, blocksize 64) and, with double quantization,
/// the absmax values quantized to 8 bits in blocks of 256 with an fp32 scale per block.
inline constexpr std::uint64_t four_bit_block = 64;
inline constexpr std::uint64_t absmax_block = 256;

/// Bytes of a weight matrix of `elements` in `rows` output rows stored in format `f`.
[[nodiscard]] constexpr std::uint64_t stored_bytes(number_format f, std::uint64_t elements, std::uint64_t rows,
                                                   bool double_quant) noexcept {
  switch (f) {
    case number_format::int8: return elements + 4 * rows;  // int8 weight, fp32 scale per row (SCB)
    case number_format::nf4:
    case number_format::fp4: {
      const std::uint64_t blocks = (elements + four_bit_block - 1) / four_bit_block;
      const std::uint64_t scales =
          double_quant ? blocks + 4 * ((blocks + absmax_block - 1) / absmax_block) + 4 : 4 * blocks;
      return (elements + 1) / 2 + scales;
    }
    default: return bytes_of(f, elements);
  }
}

/// Where a sharded run keeps the state of the parameters it does not compute with.
enum class offload_kind : std::uint8_t {
  none,
  optimizer,  ///< ZeRO-Offload: optimizer state and the gradient partition in host memory
  params,     ///< ZeRO-3's offload_param, FSDP's cpu_offload: parameters too
};
/// Who shards the model state over the data-parallel ranks.
enum class shard_kind : std::uint8_t {
  none,  ///< replicated on every rank (DistributedDataParallel)
  zero,  ///< DeepSpeed ZeRO, stage 0 to 3: flat partitions, a fused Adam on them
  fsdp,  ///< PyTorch FSDP: full shard (stage 3) or shard-grad-op (stage 2), torch's AdamW
};

/// One rank of a sharded training run (docs/fit.md, "Sharded training"): the rank's share of
/// the parameters (Megatron tensor parallel by `tensor`, the layers of pipeline stage `stage`
/// of `pipeline`), and how its model state is split over the `shards` data-parallel ranks.
/// Stage s of a 1F1B pipeline holds the activations of min(pipeline - s, micro-batches)
/// micro-batches at once. The default is one device.
struct parallel_plan {
  shard_kind sharding = shard_kind::none;
  int stage_of_zero = 0;     ///< zero: 1 optimizer state, 2 and gradients, 3 and parameters; fsdp: 2 or 3
  std::uint64_t shards = 1;  ///< ranks the sharded state is split over (a node's ranks for hybrid FSDP)
  std::uint64_t tensor = 1;
  std::uint64_t pipeline = 1;
  std::uint64_t stage = 0;
  /// bf16 weights and gradients with an fp32 master copy and fp32 moments (DeepSpeed's bf16
  /// mode; FSDP's MixedPrecision, whose sharded parameters are the fp32 copy).
  bool master_weights = false;
  offload_kind offload = offload_kind::none;

  [[nodiscard]] bool single() const noexcept {
    return sharding == shard_kind::none && tensor == 1 && pipeline == 1 && !master_weights;
  }
  [[nodiscard]] bool shards_optimizer() const noexcept { return sharding != shard_kind::none && stage_of_zero >= 1; }
  [[nodiscard]] bool shards_gradients() const noexcept { return sharding != shard_kind::none && stage_of_zero >= 2; }
  /// Parameters kept sharded between uses: ZeRO-3 and both FSDP strategies (shard-grad-op
  /// gathers them for the whole forward and backward).
  [[nodiscard]] bool shards_parameters() const noexcept {
    return sharding == shard_kind::fsdp || (sharding == shard_kind::zero && stage_of_zero == 3);
  }
  [[nodiscard]] bool first_stage() const noexcept { return stage == 0; }
  [[nodiscard]] bool last_stage() const noexcept { return stage + 1 == pipeline; }
};

/// How a 4-bit base (nf4, fp4) runs, by bitsandbytes' version and the loader that quantized
/// it (docs/fit.md, "4-bit products"). The default: bitsandbytes 0.43.2 or later, loaded by
/// Hugging Face transformers.
struct four_bit_options {
  /// MatMul4Bit keeps each product's input as a ctx attribute when an input needs a gradient
  /// (bitsandbytes before 0.43.2), held while the graph lives: past the backward, until the
  /// loop's next loss replaces it.
  bool keeps_input = false;
  /// Quantized from fp16 (bitsandbytes before 0.43; Lightning Fabric at any version): each
  /// product dequantizes to fp16, then casts to the bf16 compute dtype.
  bool from_fp16 = false;
  /// The output head quantized too (Lightning Fabric converts every nn.Linear; transformers
  /// keeps the head in 16 bits).
  bool head = false;
};

/// cuBLAS's workspace per handle as PyTorch sizes it (aten/src/ATen/cuda/CublasHandlePool.cpp):
/// on compute capability 9.x, 10.x and 12.x (Hopper, Blackwell), and before them
/// (CUBLAS_WORKSPACE_CONFIG's default `:4096:2:16:8`: two 4 MiB and eight 16 KiB pieces).
inline constexpr std::uint64_t blas_workspace_hopper = std::uint64_t{32} << 20;
inline constexpr std::uint64_t blas_workspace_before_hopper = 2 * (std::uint64_t{4096} << 10) + 8 * (std::uint64_t{16} << 10);

/// What is run, and the remedies applied.
struct step_options {
  run_mode mode = run_mode::training;
  std::uint64_t batch = 1;     ///< sequences per optimizer step (training) or concurrent sequences (inference)
  std::uint64_t sequence = 1024;
  std::uint64_t micro_batch = 0;  ///< gradient accumulation: sequences per forward/backward (0: the batch)
  number_format weights = number_format::bf16;
  bool autocast = true;  ///< activations in bf16 whatever the weights are
  optimizer_kind optimizer = optimizer_kind::adamw;
  std::uint64_t checkpoint_every = 0;  ///< activation checkpointing: keep every k-th layer's input (0: none)
  bool flash_attention = false;        ///< attention scores never materialized
  std::uint64_t lora_rank = 16;
  number_format kv_cache = number_format::bf16;
  std::uint64_t decode_steps = 16;  ///< inference: tokens generated after the prefill (at most the sequence)
  bool double_quant = false;        ///< nf4/fp4: the absmax scales quantized too (bitsandbytes' `*-dq`)
  four_bit_options four_bit;        ///< nf4/fp4: bitsandbytes' version and loader
  /// The optimizer's foreach implementation (PyTorch's default on CUDA): AdamW's temporaries
  /// for every tensor of the group at once; else one tensor at a time.
  bool foreach = true;
  int steps = 2;                    ///< optimizer steps (training): the first creates the optimizer state
  /// Training: the loop calls zero_grad() first (`zero_grad(); forward; backward; step()`), so
  /// each step's gradients live on into the next one, which frees them at its start; else last.
  bool zero_grad_first = false;
  parallel_plan parallel;  ///< training: one rank of a sharded run
  /// cuBLAS's workspace per handle, which PyTorch takes from its caching allocator at a
  /// handle's first product and keeps: one handle per thread that multiplies, the forward's
  /// and in training autograd's device thread's. The default is the larger size, Hopper's and
  /// Blackwell's. 0: none.
  std::uint64_t blas_workspace = blas_workspace_hopper;

  /// Throws vram::invalid_argument naming the field when the combination cannot run.
  void validate(const transformer_model& m) const {
    auto need = [](bool ok, const std::string& what) {
      if (!ok) detail::throw_invalid_argument("step_options", what.c_str());
    };
    need(batch >= 1 && batch <= (1u << 20), "batch must be 1 to 2^20 (is " + std::to_string(batch) + ")");
    need(sequence >= 1 && sequence <= (1u << 22), "sequence must be 1 to 2^22 (is " + std::to_string(sequence) + ")");
    need(m.positions == 0 || sequence <= m.positions,
         "sequence (" + std::to_string(sequence) + ") exceeds the model's " + std::to_string(m.positions) +
             " learned positions");
    need(micro_batch == 0 || (micro_batch <= batch && batch % micro_batch == 0),
         "micro_batch (" + std::to_string(micro_batch) + ") must divide batch (" + std::to_string(batch) + ")");
    need(checkpoint_every <= m.layers, "checkpoint_every must be 0 to layers (is " + std::to_string(checkpoint_every) + ")");
    need(mode != run_mode::training || weights == number_format::fp32 || weights == number_format::bf16,
         "weights int8/int4/nf4/fp4 need a frozen base (mode lora, inference or forward): trained weights stay fp32 or "
         "bf16");
    need(mode != run_mode::lora || (lora_rank >= 1 && lora_rank <= m.hidden),
         "lora_rank must be 1 to hidden (is " + std::to_string(lora_rank) + ")");
    need(kv_cache == number_format::fp32 || kv_cache == number_format::bf16 || kv_cache == number_format::int8,
         "kv_cache must be fp32, bf16 or int8");
    need(steps >= 1 && steps <= 16, "steps must be 1 to 16");
    need(blas_workspace <= (std::uint64_t{1} << 32), "blas_workspace must be at most 4 GiB");
    need(!m.encoder || mode != run_mode::inference,
         "an encoder caches nothing between tokens: it has no inference mode (run it in forward mode)");
    const parallel_plan& p = parallel;
    if (p.single()) return;
    need(mode == run_mode::training, "parallel: sharded runs are full training (mode training)");
    need(p.tensor >= 1 && m.heads % p.tensor == 0 && m.kv_heads % p.tensor == 0 && m.ffn % p.tensor == 0,
         "tensor parallel degree (" + std::to_string(p.tensor) + ") must divide heads (" + std::to_string(m.heads) +
             "), kv_heads (" + std::to_string(m.kv_heads) + ") and ffn (" + std::to_string(m.ffn) + ")");
    need(p.pipeline >= 1 && m.layers % p.pipeline == 0 && p.stage < p.pipeline,
         "pipeline stages (" + std::to_string(p.pipeline) + ") must divide layers (" + std::to_string(m.layers) + ")");
    need(p.shards >= 1, "parallel: shards must be at least 1");
    need(!p.master_weights || weights == number_format::bf16, "parallel: master weights go with bf16 weights");
    need(p.offload == offload_kind::none || p.shards_optimizer(), "parallel: offloading needs ZeRO 1 to 3 or FSDP");
  }
};

/// The outer tensors one rank holds (model.hpp's outer_tensors, split by the tensor-parallel
/// degree): all of them on one stage; else the input tensors (model.hpp's input_tensors) on
/// the first stage, the rest (final norm, head) on the last, a tied head there as a copy of the
/// embedding (as Megatron keeps it).
[[nodiscard]] inline std::vector<transformer_model::tensor> rank_outer_tensors(const transformer_model& m,
                                                                               const parallel_plan& p) {
  std::vector<transformer_model::tensor> all = m.outer_tensors(p.tensor), out;
  if (p.pipeline == 1) return all;
  const std::size_t inputs = m.input_tensors();
  if (p.first_stage()) out.assign(all.begin(), all.begin() + std::ptrdiff_t(inputs));
  if (p.last_stage()) {
    out.insert(out.end(), all.begin() + std::ptrdiff_t(inputs), all.end());
    if (m.tied_embeddings) out.push_back(all[0]);
  }
  return out;
}
/// The parameters one rank computes with: Ψ of the ZeRO formulas for that rank.
[[nodiscard]] inline std::uint64_t rank_parameters(const transformer_model& m, const parallel_plan& p) {
  std::uint64_t n = m.layers / p.pipeline * m.layer_parameters(p.tensor);
  for (const auto& t : rank_outer_tensors(m, p)) n += t.elements;
  return n;
}

/// What an allocation is for.
/// autocast_cache: the bf16 copies of fp32 weights that torch.autocast caches (docs/fit.md);
/// workspaces: cuBLAS's, one per handle (step_options::blas_workspace).
enum class category : std::uint8_t {
  weights, gradients, optimizer, activations, temporaries, kv_cache, autocast_cache, workspaces
};
inline constexpr std::size_t category_count = 8;
inline constexpr std::array<const char*, category_count> category_names = {
    "weights", "gradients", "optimizer", "activations", "temporaries", "kv_cache", "autocast_cache", "workspaces"};

/// A generated trace and the category of each of its allocations (indexed by event id).
struct step_trace {
  trace t;
  std::vector<category> category_of;
  /// Training: the first event of each optimizer step, then of the teardown (what is freed
  /// after the last step). Empty for inference.
  std::vector<std::size_t> step_starts;
};

/// Live bytes per category at the trace's peak of total live bytes (the first such instant),
/// and each category's own peak (the gradients are whole only after the backward, when the
/// activations are gone).
struct category_peak {
  std::uint64_t peak_live = 0;
  std::array<std::uint64_t, category_count> at_peak{};
  std::array<std::uint64_t, category_count> own_peak{};
};

[[nodiscard]] inline category_peak peak_by_category(const step_trace& s) {
  category_peak out;
  std::array<std::uint64_t, category_count> live{};
  std::uint64_t total = 0;
  for (const event& e : s.t.events) {
    const auto c = static_cast<std::size_t>(s.category_of[e.id]);
    if (e.kind == event::op::alloc) {
      live[c] += e.bytes;
      total += e.bytes;
      if (live[c] > out.own_peak[c]) out.own_peak[c] = live[c];
      if (total > out.peak_live) {
        out.peak_live = total;
        out.at_peak = live;
      }
    } else {
      live[c] -= e.bytes;
      total -= e.bytes;
    }
  }
  return out;
}

}  // namespace vram::trace

namespace vram::detail::trace {

using vram::trace::category;
using vram::trace::transformer_model;
using vram::trace::mlp_kind;
using vram::trace::number_format;
using vram::trace::optimizer_kind;
using vram::trace::run_mode;
using vram::trace::step_options;
using vram::trace::step_trace;

/// Emits allocations with their categories.
class step_builder {
 public:
  explicit step_builder(std::string name) : g_(std::move(name)) {}
  std::uint64_t alloc(category c, std::uint64_t bytes) {
    std::uint64_t id = g_.alloc(bytes == 0 ? 1 : bytes);
    if (category_of_.size() <= id) category_of_.resize(id + 1);
    category_of_[id] = c;
    return id;
  }
  void free(std::uint64_t id) { g_.free(id); }
  void mark_step() { step_starts_.push_back(g_.events()); }
  step_trace finish() && { return {std::move(g_).finish(), std::move(category_of_), std::move(step_starts_)}; }

 private:
  emitter g_;
  std::vector<category> category_of_;
  std::vector<std::size_t> step_starts_;
};

/// Activations are bf16 under autocast or with 16-bit weights, else fp32: bytes per element.
inline std::uint64_t activation_bytes(const step_options& o) {
  return o.autocast || o.weights != number_format::fp32 ? 2 : 4;
}

/// What the optimizer trains, in elements: every tensor (module order: the outer tensors,
/// then layer by layer), or the adapters (A: r x in, B: out x r) of q, k, v and o per layer.
inline std::vector<std::uint64_t> trained_tensors(const transformer_model& m, const step_options& o) {
  std::vector<std::uint64_t> out;
  const vram::trace::parallel_plan& p = o.parallel;
  if (o.mode == run_mode::training) {
    for (const auto& t : rank_outer_tensors(m, p)) out.push_back(t.elements);
    for (std::uint64_t l = 0; l < m.layers / p.pipeline; ++l)
      for (const auto& t : m.layer_tensors(p.tensor)) out.push_back(t.elements);
  } else if (o.mode == run_mode::lora) {
    for (std::uint64_t l = 0; l < m.layers; ++l)
      for (std::uint64_t width : {m.hidden, m.kv_width(), m.kv_width(), m.hidden}) {
        out.push_back(o.lora_rank * m.hidden);
        out.push_back(width * o.lora_rank);
      }
  }
  return out;
}
/// Full training keeps the weights' format; adapters train in fp32 beside a frozen base.
inline number_format trained_format(const step_options& o) {
  return o.mode == run_mode::lora ? number_format::fp32 : o.weights;
}

/// A sharded run's partition of the rank's parameters: ceil(Ψ / shards) elements (DeepSpeed
/// pads its flat buffers to a multiple of the ranks).
inline std::uint64_t shard_elements(const transformer_model& m, const step_options& o) {
  const std::uint64_t n = rank_parameters(m, o.parallel), d = o.parallel.shards;
  return (n + d - 1) / d;
}
/// The format of the optimizer's side of a trained parameter: fp32 with master weights.
inline number_format state_format(const step_options& o) {
  return o.parallel.master_weights ? number_format::fp32 : trained_format(o);
}
/// The format a sharded parameter (and its gradient) is kept in between uses: FSDP's sharded
/// parameter is the fp32 copy under MixedPrecision; ZeRO-3 keeps bf16 partitions.
inline number_format sharded_format(const step_options& o) {
  return o.parallel.sharding == vram::trace::shard_kind::fsdp ? state_format(o) : o.weights;
}

inline bool is_four_bit(const step_options& o) {
  return o.weights == number_format::nf4 || o.weights == number_format::fp4;
}
/// A separate head stored in 4 bits (four_bit_options::head); a tied head is the embedding.
inline bool quantized_head(const transformer_model& m, const step_options& o) {
  return is_four_bit(o) && o.four_bit.head && !m.tied_embeddings && o.parallel.last_stage();
}

/// The model's weights (and LoRA adapters), one allocation per tensor, in module order; with
/// sharded parameters, the rank's partition (none on the device when it is offloaded).
inline std::vector<std::uint64_t> allocate_weights(step_builder& g, const transformer_model& m, const step_options& o) {
  std::vector<std::uint64_t> ids;
  const vram::trace::parallel_plan& p = o.parallel;
  if (p.shards_parameters()) {
    if (p.offload != vram::trace::offload_kind::params)
      ids.push_back(g.alloc(category::weights, bytes_of(sharded_format(o), shard_elements(m, o))));
    return ids;
  }
  auto put = [&](const transformer_model::tensor& t) {
    const bool quantized = is_quantized(o.weights);
    ids.push_back(g.alloc(category::weights, quantized && !t.matrix ? bytes_of(number_format::bf16, t.elements)
                                                                    : stored_bytes(o.weights, t.elements, t.rows, o.double_quant)));
  };
  const std::vector<transformer_model::tensor> outer = vram::trace::rank_outer_tensors(m, p);
  for (std::size_t i = 0; i < outer.size(); ++i)
    if (i + 1 == outer.size() && quantized_head(m, o)) put({outer[i].elements, true, m.vocab});
    else put(outer[i]);
  for (std::uint64_t l = 0; l < m.layers / p.pipeline; ++l)
    for (const auto& t : m.layer_tensors(p.tensor)) put(t);
  if (o.mode == run_mode::lora)
    for (std::uint64_t n : trained_tensors(m, o)) ids.push_back(g.alloc(category::weights, bytes_of(trained_format(o), n)));
  return ids;
}

/// Whether torch.autocast caches bf16 copies of the weights: fp32 weights under autocast that
/// are leaves requiring a gradient (autocast_mode.cpp caches a cast only for those). A frozen
/// LoRA base does not; its fp32 adapters are too small to count.
inline bool autocast_caches(const step_options& o) {
  return o.autocast && o.weights == number_format::fp32 && o.mode != run_mode::lora;
}
/// Bytes of the bf16 copies autocast makes of one layer's linear weights, and of the head.
inline std::uint64_t cached_layer_bytes(const transformer_model& m, std::uint64_t tp = 1) {
  return 2 * m.layer_linear_parameters(tp);
}
inline std::uint64_t cached_head_bytes(const transformer_model& m, std::uint64_t tp = 1) {
  return 2 * ((m.vocab + tp - 1) / tp) * m.hidden;
}
/// A 4-bit base is dequantized before each product (bitsandbytes' MatMul4Bit): one weight at
/// a time, the largest of a layer being the MLP's (four_bit::dequantized_bytes).
inline std::uint64_t dequantized_bytes(const transformer_model& m, const step_options& o) {
  return is_four_bit(o) ? four_bit::dequantized_bytes(m.hidden * std::max(m.ffn, m.hidden), o.four_bit.from_fp16) : 0;
}
/// ... and the head, when it is quantized too.
inline std::uint64_t dequantized_head_bytes(const transformer_model& m, const step_options& o) {
  return quantized_head(m, o) ? four_bit::dequantized_bytes(m.vocab * m.hidden, o.four_bit.from_fp16) : 0;
}

/// Inference: a KV cache per layer for every sequence at full length; a prefill of the prompt
/// (the sequence less the tokens to generate), then one token per sequence per decoding step.
/// Decoding is capped at the sequence (a sequence of 1 is one decoding step and no prompt).
/// Forward: one pass of the whole sequence under no_grad, no cache, logits for every token.
/// Autocast's cached copies of fp32 weights live from their first use to the region's end.
/// A mixture of experts runs its experts one after another, each one's temporaries dying
/// before the next's; they are sized for every token, the most one expert can be sent. An
/// encoder's masked-LM head transforms each token before the logits.
inline void serve(step_builder& g, const transformer_model& m, const step_options& o) {
  using c = category;
  const std::uint64_t h = m.hidden, kv = m.kv_width(), ab = activation_bytes(o);
  const bool forward_only = o.mode == run_mode::forward;
  std::vector<std::uint64_t> caches, cast;
  if (!forward_only)
    for (std::uint64_t l = 0; l < m.layers; ++l)
      caches.push_back(g.alloc(c::kv_cache, bytes_of(o.kv_cache, 2 * o.batch * o.sequence * kv)));
  constexpr std::uint64_t none = UINT64_MAX;
  std::uint64_t workspace = none;  // the handle's, made at the first product and kept
  auto pass = [&](std::uint64_t new_tokens, std::uint64_t context) {
    const std::uint64_t t = o.batch * new_tokens, a = t * h * ab;
    std::uint64_t x = g.alloc(c::activations, a);
    if (workspace == none && o.blas_workspace != 0) workspace = g.alloc(c::workspaces, o.blas_workspace);
    for (std::uint64_t l = 0; l < m.layers; ++l) {  // nothing is saved: each layer's temporaries die in it
      if (autocast_caches(o) && cast.size() == l) cast.push_back(g.alloc(c::autocast_cache, cached_layer_bytes(m)));
      if (dequantized_bytes(m, o) != 0 && new_tokens > 1) g.free(g.alloc(c::temporaries, dequantized_bytes(m, o)));
      std::uint64_t norm = g.alloc(c::temporaries, a);
      std::uint64_t qkv = g.alloc(c::temporaries, t * (h + 2 * kv) * ab);
      if (!o.flash_attention) g.free(g.alloc(c::temporaries, o.batch * m.heads * new_tokens * context * ab));
      std::uint64_t attn = g.alloc(c::temporaries, a);
      g.free(qkv);
      g.free(norm);
      const std::uint64_t inner_bytes = t * m.ffn * ab * (m.mlp == mlp_kind::swiglu ? 2 : 1);
      std::uint64_t out;
      if (!m.mixture()) {
        std::uint64_t inner = g.alloc(c::temporaries, inner_bytes);
        out = g.alloc(c::activations, a);
        g.free(inner);
      } else {
        out = g.alloc(c::activations, a);  // zeros; each expert adds its tokens' outputs into it
        std::uint64_t router = g.alloc(c::temporaries, t * m.experts * 4);  // fp32 probabilities
        std::uint64_t chosen = g.alloc(c::temporaries, t * m.experts_per_token * (8 + 4));  // top-k indices, weights
        std::uint64_t routed = g.alloc(c::temporaries, a);  // one expert's tokens
        std::uint64_t inner = g.alloc(c::temporaries, inner_bytes);
        std::uint64_t result = g.alloc(c::temporaries, a);
        g.free(inner);
        g.free(routed);
        g.free(result);
        g.free(chosen);
        g.free(router);
      }
      g.free(attn);
      g.free(x);
      x = out;
    }
    if (autocast_caches(o) && cast.size() == m.layers) cast.push_back(g.alloc(c::autocast_cache, cached_head_bytes(m)));
    // A 4-bit head is dequantized for a product of more than one token (one token: gemv_4bit).
    const std::uint64_t head = new_tokens > 1 ? dequantized_head_bytes(m, o) : 0;
    const std::uint64_t dequantized = head != 0 ? g.alloc(c::temporaries, head) : 0;
    if (m.encoder) {  // the masked-LM head's transform: dense, GELU, LayerNorm
      std::uint64_t dense = g.alloc(c::temporaries, a);
      std::uint64_t transformed = g.alloc(c::temporaries, a);
      g.free(dense);
      g.free(x);
      x = transformed;
    }
    g.free(g.alloc(c::temporaries, (forward_only ? t : o.batch) * m.vocab * 4));  // fp32 logits (decoding: the last token's)
    if (head != 0) g.free(dequantized);
    g.free(x);
  };
  if (forward_only) {
    pass(o.sequence, o.sequence);
    for (std::uint64_t id : cast) g.free(id);
    if (workspace != none) g.free(workspace);
    return;
  }
  const std::uint64_t decode = o.decode_steps < o.sequence ? o.decode_steps : o.sequence;
  const std::uint64_t prompt = o.sequence - decode;
  if (prompt > 0) pass(prompt, prompt);
  for (std::uint64_t s = 0; s < decode; ++s) pass(1, prompt + s + 1);
  for (std::uint64_t id : cast) g.free(id);
  for (std::uint64_t id : caches) g.free(id);
  if (workspace != none) g.free(workspace);
}

/// Training: per optimizer step, forward and backward per micro-batch (gradients created by
/// the first backward and accumulated by the rest), then the optimizer step, whose state
/// appears at the first step as in PyTorch. With checkpointing every k layers, a forward keeps
/// only each segment's input; the backward recomputes a segment before going through it.
/// One rank of a sharded run (o.parallel) computes its stage's layers with its tensor-parallel
/// share, runs the micro-batches 1F1B (the forwards of as many as the stage holds in flight,
/// then a backward and a forward in turn), gathers sharded parameters around their use and
/// reduces each layer's gradient into its partition (docs/fit.md, "Sharded training").
inline void train(step_builder& g, const transformer_model& m, const step_options& o) {
  using c = category;
  using vram::trace::offload_kind;
  using vram::trace::shard_kind;
  const vram::trace::parallel_plan& p = o.parallel;
  const std::uint64_t tp = p.tensor, layers = m.layers / p.pipeline;
  // Megatron's split: q, k, v, the attention and the MLP's inner width by tp; the norms, the
  // residual stream and the inputs of the column-parallel products whole.
  const std::uint64_t h = m.hidden, hq = h / tp, kv = m.kv_width() / tp, heads = m.heads / tp;
  const std::uint64_t vocab = (m.vocab + tp - 1) / tp, ab = activation_bytes(o);
  const std::uint64_t micro = o.micro_batch == 0 ? o.batch : o.micro_batch, micro_batches = o.batch / micro;
  const std::uint64_t t = micro * o.sequence, a = t * h * ab;
  const std::uint64_t score_bytes = micro * heads * o.sequence * o.sequence * ab;
  const std::uint64_t mlp_bytes = t * (m.ffn / tp) * ab;
  const std::uint64_t k = o.checkpoint_every;
  const std::vector<std::uint64_t> trained = trained_tensors(m, o);
  const number_format grad_format = trained_format(o);
  const std::size_t outer = o.mode == run_mode::training ? vram::trace::rank_outer_tensors(m, p).size() : 0;
  const std::size_t per_layer = o.mode == run_mode::training ? m.layer_tensors().size() : 8;
  const std::uint64_t dequant = dequantized_bytes(m, o), dequant_head = dequantized_head_bytes(m, o);
  // The inputs a 4-bit base's products keep beyond autograd's saved tensors (four_bit_options::
  // keeps_input). Not modelled with checkpointing, whose recomputation would make them again.
  const bool keeps_inputs = is_four_bit(o) && o.four_bit.keeps_input && k == 0;
  const std::uint64_t in_flight = std::min<std::uint64_t>(p.pipeline - p.stage, micro_batches);
  // Sharded state: the gradient partition, the parameters gathered (bf16 for compute) around
  // their use, each layer's whole gradient until it is reduced into the partition.
  const bool sharded_grads = p.shards_gradients(), gathers = p.shards_parameters();
  const bool whole_pass = gathers && p.sharding == shard_kind::fsdp && p.stage_of_zero == 2;  // shard-grad-op
  const std::uint64_t layer_bytes = bytes_of(o.weights, m.layer_parameters(tp));
  std::uint64_t outer_elements = 0;
  for (std::size_t i = 0; i < outer; ++i) outer_elements += trained[i];

  // Mixed precision (fp32 weights under autocast) follows autocast's rules: the residual
  // stream stays fp32, norms and the softmax run in fp32, and each matrix product saves the
  // bf16 copy of its input that autocast made.
  const bool mixed = o.autocast && o.weights == number_format::fp32;
  const std::uint64_t r = mixed ? t * h * 4 : a;  // one residual-stream tensor
  const std::uint64_t probability_bytes = mixed ? score_bytes * 2 : score_bytes;
  // RMSNorm (the family without biases) as Hugging Face's LlamaRMSNorm computes it, op by op:
  // x * rsqrt(mean(x^2)) is kept for the product with the weight. LayerNorm is one fused op.
  const bool rms_norm = !m.biases;
  // The tensors autograd saves in one layer's forward; the last is the layer's output.
  auto layer_forward = [&](std::vector<std::uint64_t>& saved) {
    auto save = [&](std::uint64_t bytes) { saved.push_back(g.alloc(c::activations, bytes)); };
    auto norm = [&] {
      if (rms_norm) save(r);  // normalized, before the weight
      if (mixed) save(r);     // the norm's output, fp32
      save(a);                // ... as the next product's input
    };
    const std::uint64_t gathered = gathers && !whole_pass ? g.alloc(c::weights, layer_bytes) : 0;
    norm();
    save(t * (hq + 2 * kv) * ab);       // q, k, v
    if (m.positions == 0) save(t * (hq + kv) * ab);  // q and k after the rotary embedding
    if (o.flash_attention) {
      save(micro * heads * o.sequence * 4);  // log-sum-exp
    } else {
      std::uint64_t raw = g.alloc(c::temporaries, score_bytes);  // scores before the softmax
      save(probability_bytes);                                   // probabilities
      if (mixed) save(score_bytes);                              // their bf16 copy for the product with v
      g.free(raw);
    }
    save(t * hq * ab);                 // attention output (the output projection's input)
    save(r);                           // residual
    norm();
    // GELU: fc1 output, its activation. SwiGLU: gate, up, SiLU(gate), their product.
    const int mlp_saves = m.mlp == mlp_kind::swiglu ? 4 : 2;
    if (!m.mixture()) {
      for (int i = 0; i < mlp_saves; ++i) save(mlp_bytes);
    } else {
      // The router's fp32 probabilities (the softmax's output), the top-k indices (int64) and
      // weights (fp32 and the compute dtype); then per expert its tokens (gathered: its first
      // products' input), its MLP's intermediates and its output (kept for the product with
      // the routing weight). The tokens are taken as spread evenly: the experts' sum is exact.
      const std::uint64_t e = m.experts, routed = (t * m.experts_per_token + e - 1) / e;
      save(t * e * 4);
      save(t * m.experts_per_token * (8 + 4 + ab));
      const std::uint64_t mask = g.alloc(c::temporaries, t * m.experts_per_token * e * 8);  // one_hot of the choices
      for (std::uint64_t x = 0; x < e; ++x) {
        save(routed * h * ab);
        for (int i = 0; i < mlp_saves; ++i) save(routed * (m.ffn / tp) * ab);
        save(routed * h * ab);
      }
      g.free(mask);
    }
    save(r);                           // output: the next layer's input
    if (gathers && !whole_pass) g.free(gathered);  // resharded after the forward
  };
  auto free_all = [&](std::vector<std::uint64_t>& ids) {
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) g.free(*it);
    ids.clear();
  };
  const auto segment_end = [&](std::uint64_t l) { return (l + 1) % k == 0 || l + 1 == layers; };

  constexpr std::uint64_t no_grad = UINT64_MAX;  // a gradient not allocated (or freed)
  std::vector<std::uint64_t> grads(sharded_grads ? 1 : trained.size(), no_grad), state;
  const bool caches = autocast_caches(o);
  // What one micro-batch keeps from its forward to its backward.
  struct in_flight_batch {
    std::uint64_t tokens = no_grad, x = no_grad, root = no_grad;
    std::uint64_t embedding_sum = no_grad;  // an encoder's: the embedding norm's input
    std::vector<std::vector<std::uint64_t>> saved;
    std::vector<std::uint64_t> checkpoint, cast, gathered;
    std::vector<std::uint64_t> kept;  // the inputs 4-bit products keep: freed with the graph
  };
  // The graph of the micro-batch before, with what its 4-bit products keep: the loop frees it
  // when the next loss replaces it (litgpt: `loss = chunked_cross_entropy(...)`).
  std::vector<std::uint64_t> previous_graph;
  // cuBLAS's workspaces: the forward thread's handle and autograd's, each made at its
  // thread's first product and kept to the end.
  std::uint64_t forward_workspace = no_grad, backward_workspace = no_grad;
  auto workspace = [&](std::uint64_t& id) {
    if (id == no_grad && o.blas_workspace != 0) id = g.alloc(c::workspaces, o.blas_workspace);
  };
  auto forward = [&](in_flight_batch& b) {
    if (p.first_stage()) b.tokens = g.alloc(c::activations, t * 8);
    if (gathers) b.root = g.alloc(c::weights, bytes_of(o.weights, outer_elements));  // the root unit, whole
    if (m.encoder && p.first_stage()) b.embedding_sum = g.alloc(c::activations, r);
    b.x = g.alloc(c::activations, r);  // the embedding output (a stage's input): layer 0's input
    workspace(forward_workspace);
    b.saved.assign(layers, {});
    b.checkpoint.assign(layers, 0);  // a segment's output, kept as the next one's input
    // Autocast's bf16 copies of the layer's weights: cached at first use, held after the
    // region's end by autograd (each product saves its bf16 weight) until the layer's backward.
    b.cast.assign(layers, no_grad);
    b.gathered.assign(layers, no_grad);
    for (std::uint64_t l = 0; l < layers; ++l) {
      if (whole_pass) b.gathered[l] = g.alloc(c::weights, layer_bytes);  // kept until the layer's backward
      if (caches) b.cast[l] = g.alloc(c::autocast_cache, cached_layer_bytes(m, tp));
      if (dequant != 0) g.free(g.alloc(c::temporaries, dequant));
      layer_forward(b.saved[l]);
      if (keeps_inputs) {
        // Layer 0's first input needs no gradient (a frozen embedding and norm): not kept.
        const auto widths = four_bit::kept_input_widths(m);
        for (std::size_t i = l == 0 && p.first_stage() ? 1 : 0; i < widths.size(); ++i)
          b.kept.push_back(g.alloc(c::activations, t * widths[i] * ab));
      }
      if (k == 0) continue;
      std::uint64_t out = b.saved[l].back();
      b.saved[l].pop_back();
      free_all(b.saved[l]);
      if (segment_end(l)) b.checkpoint[l] = out;
      else g.free(out);
    }
  };
  auto backward = [&](in_flight_batch& b, bool first) {
    auto grad = [&](std::size_t i) {
      if (first && !sharded_grads) grads[i] = g.alloc(c::gradients, bytes_of(grad_format, trained[i]));
    };
    // The whole gradient of what was just differentiated, reduced into the partition at once.
    auto reduced = [&](std::uint64_t bytes) {
      if (sharded_grads) g.free(g.alloc(c::gradients, bytes));
    };
    if (first && sharded_grads && p.offload == offload_kind::none)
      grads[0] = g.alloc(c::gradients, bytes_of(sharded_format(o), shard_elements(m, o)));
    std::uint64_t grad_x;
    if (p.last_stage()) {
      const std::uint64_t head_cast = caches ? g.alloc(c::autocast_cache, cached_head_bytes(m, tp)) : no_grad;
      if (k != 0)  // a checkpointed forward saves nothing: the cache goes when the region ends
        for (std::uint64_t& id : b.cast)
          if (id != no_grad) g.free(std::exchange(id, no_grad));
      // A 4-bit head: dequantized for its product (and again for the backward's), its input kept.
      const std::uint64_t head_weight = dequant_head != 0 ? g.alloc(c::temporaries, dequant_head) : no_grad;
      if (keeps_inputs && dequant_head != 0) b.kept.push_back(g.alloc(c::activations, a));
      // An encoder's masked-LM transform saves its dense output (GELU's input), GELU's output
      // (the norm's input) and the norm's output (the decoder's input).
      std::vector<std::uint64_t> transform;
      if (m.encoder)
        for (int i = 0; i < 3; ++i) transform.push_back(g.alloc(c::activations, a));
      std::uint64_t logits = g.alloc(c::activations, t * vocab * 4);  // fp32 for the loss
      if (head_weight != no_grad) g.free(head_weight);
      for (std::uint64_t id : previous_graph) g.free(id);  // the loss replaced: the graph before goes
      previous_graph = std::move(b.kept);
      b.kept.clear();
      std::uint64_t grad_logits = g.alloc(c::temporaries, t * vocab * 4);
      workspace(backward_workspace);
      g.free(logits);
      const std::uint64_t head_grad = dequant_head != 0 ? g.alloc(c::temporaries, dequant_head) : no_grad;
      grad_x = g.alloc(c::temporaries, a);
      if (head_grad != no_grad) g.free(head_grad);
      g.free(grad_logits);
      free_all(transform);
      if (head_cast != no_grad) g.free(head_cast);
    } else {
      if (k != 0)
        for (std::uint64_t& id : b.cast)
          if (id != no_grad) g.free(std::exchange(id, no_grad));
      grad_x = g.alloc(c::temporaries, a);  // the gradient the next stage sends back
      workspace(backward_workspace);
    }
    for (std::size_t i = outer; i-- > 0;) grad(i);  // head, final norm, positions, embedding
    reduced(bytes_of(o.weights, outer_elements));
    for (std::uint64_t l = layers; l-- > 0;) {
      if (k != 0 && segment_end(l)) {  // recompute the segment ending here from its input
        for (std::uint64_t at = l - l % k; at <= l; ++at) {
          if (caches) b.cast[at] = g.alloc(c::autocast_cache, cached_layer_bytes(m, tp));
          layer_forward(b.saved[at]);
        }
        g.free(b.checkpoint[l]);  // recomputed: the copy kept by the forward is no longer needed
      }
      const std::uint64_t gathered = gathers && !whole_pass ? g.alloc(c::weights, layer_bytes) : no_grad;
      const std::uint64_t whole_grad = sharded_grads ? g.alloc(c::gradients, layer_bytes) : no_grad;
      for (std::size_t i = per_layer; i-- > 0;) grad(outer + l * per_layer + i);
      std::uint64_t g_mlp = g.alloc(c::temporaries, mlp_bytes);
      if (!o.flash_attention) g.free(g.alloc(c::temporaries, score_bytes));
      g.free(g_mlp);
      if (dequant != 0) g.free(g.alloc(c::temporaries, dequant));
      free_all(b.saved[l]);
      if (b.cast[l] != no_grad) g.free(std::exchange(b.cast[l], no_grad));
      std::uint64_t below = g.alloc(c::temporaries, a);  // the gradient for the layer below
      g.free(grad_x);
      grad_x = below;
      if (whole_grad != no_grad) g.free(whole_grad);  // reduce-scattered into the partition
      if (gathered != no_grad) g.free(gathered);
      if (b.gathered[l] != no_grad) g.free(b.gathered[l]);
    }
    g.free(grad_x);
    g.free(b.x);
    if (b.embedding_sum != no_grad) g.free(b.embedding_sum);
    if (b.root != no_grad) g.free(b.root);
    if (b.tokens != no_grad) g.free(b.tokens);
  };

  for (int step = 0; step < o.steps; ++step) {
    g.mark_step();
    if (o.zero_grad_first)  // zero_grad(set_to_none=True) first: the last step's gradients go
      for (std::uint64_t& id : grads)
        if (id != no_grad) g.free(std::exchange(id, no_grad));
    // 1F1B: the forwards of the micro-batches in flight, then a backward and a forward in turn
    // (one device, or a pipeline's last stage: forward, backward, forward, ...).
    std::vector<in_flight_batch> batches(micro_batches);
    for (std::uint64_t mb = 0; mb < in_flight; ++mb) forward(batches[mb]);
    for (std::uint64_t mb = 0; mb < micro_batches; ++mb) {
      backward(batches[mb], mb == 0);
      if (mb + in_flight < micro_batches) forward(batches[mb + in_flight]);
    }
    if (o.optimizer != optimizer_kind::none) {
      // State: zeros_like(param) (AdamW's moments, SGD's momentum: the parameter's dtype);
      // bitsandbytes' 8-bit AdamW: uint8 moments with an fp32 absmax per 256 elements, fp32
      // moments for tensors under its min_8bit_size of 4096 elements. With master weights, an
      // fp32 copy (DeepSpeed's; FSDP's sharded parameter is that copy) and fp32 moments; sharded,
      // the partition's (none on the device when offloaded).
      const number_format sf = state_format(o);
      const bool sharded_state = p.shards_optimizer();
      const std::vector<std::uint64_t> partition = {shard_elements(m, o)};
      const std::vector<std::uint64_t>& held = sharded_state ? partition : trained;
      const bool on_device = !sharded_state || p.offload == offload_kind::none;
      if (state.empty() && on_device)
        for (std::uint64_t n : held) {
          const int moments = o.optimizer == optimizer_kind::sgd ? 1 : 2;
          if (o.optimizer == optimizer_kind::paged_adamw && n >= 100'000) continue;  // managed memory
          const std::uint64_t bytes = o.optimizer == optimizer_kind::paged_adamw ? 4 * n
                                      : o.optimizer != optimizer_kind::adamw_8bit ? bytes_of(sf, n)
                                      : n >= 4096                               ? n + 4 * ((n + 255) / 256)
                                                                                : 4 * n;
          if (p.master_weights && p.sharding == shard_kind::zero) state.push_back(g.alloc(c::optimizer, 4 * n));
          for (int i = 0; i < moments; ++i) state.push_back(g.alloc(c::optimizer, bytes));
        }
      // AdamW's update divides by sqrt(v) + eps, a new tensor per parameter: the foreach
      // implementation makes them for the whole group at once (_foreach_sqrt), the single-tensor
      // one a tensor at a time. SGD (no weight decay) and bitsandbytes' optimizers update in
      // place, and so does DeepSpeed's fused Adam.
      if (o.optimizer == optimizer_kind::adamw && p.sharding != shard_kind::zero && on_device) {
        std::vector<std::uint64_t> denominators;
        for (std::uint64_t n : held) {
          denominators.push_back(g.alloc(c::temporaries, bytes_of(sf, n)));
          if (!o.foreach) g.free(denominators.back());
        }
        if (o.foreach)
          for (std::uint64_t id : denominators) g.free(id);
      }
    }
    if (!o.zero_grad_first)
      for (std::uint64_t& id : grads)
        if (id != no_grad) g.free(std::exchange(id, no_grad));  // zero_grad(set_to_none=True)
  }
  g.mark_step();  // the teardown
  for (std::uint64_t id : {forward_workspace, backward_workspace})
    if (id != no_grad) g.free(id);
  for (std::uint64_t id : previous_graph) g.free(id);
  for (std::uint64_t id : grads)
    if (id != no_grad) g.free(id);
  for (std::uint64_t id : state) g.free(id);
}

}  // namespace vram::detail::trace

namespace vram::trace {

/// The trace of `o.steps` optimizer steps (training, lora) or of one prefill and
/// `o.decode_steps` decoding steps (inference) of model `m`. Validates both first.
[[nodiscard]] inline step_trace generate_step(const transformer_model& m, const step_options& o) {
  m.validate();
  o.validate(m);
  detail::trace::step_builder g(m.name);
  std::vector<std::uint64_t> weights = detail::trace::allocate_weights(g, m, o);
  if (o.mode == run_mode::inference || o.mode == run_mode::forward) detail::trace::serve(g, m, o);
  else detail::trace::train(g, m, o);
  for (std::uint64_t id : weights) g.free(id);
  return std::move(g).finish();
}

/// One optimizer step of a running training loop, as a snapshot recorded over it sees it: the
/// second step of `o` (zero_grad first, so the first step's gradients and the optimizer state
/// are live at its start, with the weights), and its own gradients live at its end.
/// trace::repeat_steps makes it a loop whose gradients cross every step boundary.
[[nodiscard]] inline trace training_loop_step(const transformer_model& m, step_options o) {
  o.mode = run_mode::training;
  o.steps = 2;
  o.zero_grad_first = true;
  step_trace s = generate_step(m, o);
  trace out = window(s.t, s.step_starts[1], s.step_starts[2]);
  out.name = m.name + " training loop step (b=" + std::to_string(o.batch) + ", s=" + std::to_string(o.sequence) + ")";
  return out;
}

}  // namespace vram::trace

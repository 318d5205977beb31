#pragma once
// vram::trace::generate_step: the allocation trace of training or serving a decoder model
// (model.hpp), each allocation marked with what it is (weights, gradients, optimizer state,
// activations, temporaries, KV cache), so that a replay's peak can be split by category.
// What the generator allocates, and why, is in docs/fit.md.

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <vram/core/throw.hpp>
#include <vram/trace/detail/emitter.hpp>
#include <vram/trace/model.hpp>
#include <vram/trace/trace.hpp>
#include <vram/trace/window.hpp>

namespace vram::trace {

enum class run_mode : std::uint8_t {
  training,  ///< every weight trained (pre-training and full fine-tuning alike)
  lora,      ///< a frozen base with low-rank adapters on q, k, v and o
  inference, ///< a KV cache per sequence, prefill then decoding
};
enum class number_format : std::uint8_t { fp32, bf16, int8, int4 };
enum class optimizer_kind : std::uint8_t {
  adamw,       ///< two fp32 moments per trained parameter
  adamw_8bit,  ///< two 8-bit moments (bitsandbytes-style), per trained parameter
  sgd,         ///< one fp32 momentum per trained parameter
  none,
};

/// Bits of one element (bits, so that int4 is exact).
[[nodiscard]] constexpr std::uint64_t bits_of(number_format f) noexcept {
  switch (f) {
    case number_format::fp32: return 32;
    case number_format::bf16: return 16;
    case number_format::int8: return 8;
    case number_format::int4: return 4;
  }
  return 32;
}
[[nodiscard]] constexpr std::uint64_t bytes_of(number_format f, std::uint64_t elements) noexcept {
  return (elements * bits_of(f) + 7) / 8;
}

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
  int steps = 2;                    ///< optimizer steps (training): the first creates the optimizer state
  /// Training: the loop calls zero_grad() first (`zero_grad(); forward; backward; step()`), so
  /// each step's gradients live on into the next one, which frees them at its start; else last.
  bool zero_grad_first = false;

  /// Throws vram::invalid_argument naming the field when the combination cannot run.
  void validate(const decoder_model& m) const {
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
         "weights int8/int4 need a frozen base (mode lora or inference): trained weights stay fp32 or bf16");
    need(mode != run_mode::lora || (lora_rank >= 1 && lora_rank <= m.hidden),
         "lora_rank must be 1 to hidden (is " + std::to_string(lora_rank) + ")");
    need(kv_cache == number_format::fp32 || kv_cache == number_format::bf16 || kv_cache == number_format::int8,
         "kv_cache must be fp32, bf16 or int8");
    need(steps >= 1 && steps <= 16, "steps must be 1 to 16");
  }
};

/// What an allocation is for.
enum class category : std::uint8_t { weights, gradients, optimizer, activations, temporaries, kv_cache };
inline constexpr std::size_t category_count = 6;
inline constexpr std::array<const char*, category_count> category_names = {
    "weights", "gradients", "optimizer", "activations", "temporaries", "kv_cache"};

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
using vram::trace::decoder_model;
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
inline std::vector<std::uint64_t> trained_tensors(const decoder_model& m, const step_options& o) {
  std::vector<std::uint64_t> out;
  if (o.mode == run_mode::training) {
    for (const auto& t : m.outer_tensors()) out.push_back(t.elements);
    for (std::uint64_t l = 0; l < m.layers; ++l)
      for (const auto& t : m.layer_tensors()) out.push_back(t.elements);
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

/// The model's weights (and LoRA adapters), one allocation per tensor, in module order.
inline std::vector<std::uint64_t> allocate_weights(step_builder& g, const decoder_model& m, const step_options& o) {
  std::vector<std::uint64_t> ids;
  auto put = [&](const decoder_model::tensor& t) {
    const bool quantized = o.weights == number_format::int8 || o.weights == number_format::int4;
    ids.push_back(g.alloc(category::weights, bytes_of(quantized && !t.matrix ? number_format::bf16 : o.weights, t.elements)));
  };
  for (const auto& t : m.outer_tensors()) put(t);
  for (std::uint64_t l = 0; l < m.layers; ++l)
    for (const auto& t : m.layer_tensors()) put(t);
  if (o.mode == run_mode::lora)
    for (std::uint64_t n : trained_tensors(m, o)) ids.push_back(g.alloc(category::weights, bytes_of(trained_format(o), n)));
  return ids;
}

/// Inference: a KV cache per layer for every sequence at full length; a prefill of the prompt
/// (the sequence less the tokens to generate), then one token per sequence per decoding step.
/// Decoding is capped at the sequence (a sequence of 1 is one decoding step and no prompt).
inline void serve(step_builder& g, const decoder_model& m, const step_options& o) {
  using c = category;
  const std::uint64_t h = m.hidden, kv = m.kv_width(), ab = activation_bytes(o);
  std::vector<std::uint64_t> caches;
  for (std::uint64_t l = 0; l < m.layers; ++l)
    caches.push_back(g.alloc(c::kv_cache, bytes_of(o.kv_cache, 2 * o.batch * o.sequence * kv)));
  auto pass = [&](std::uint64_t new_tokens, std::uint64_t context) {
    const std::uint64_t t = o.batch * new_tokens, a = t * h * ab;
    std::uint64_t x = g.alloc(c::activations, a);
    for (std::uint64_t l = 0; l < m.layers; ++l) {  // nothing is saved: each layer's temporaries die in it
      std::uint64_t norm = g.alloc(c::temporaries, a);
      std::uint64_t qkv = g.alloc(c::temporaries, t * (h + 2 * kv) * ab);
      if (!o.flash_attention) g.free(g.alloc(c::temporaries, o.batch * m.heads * new_tokens * context * ab));
      std::uint64_t attn = g.alloc(c::temporaries, a);
      g.free(qkv);
      g.free(norm);
      std::uint64_t inner = g.alloc(c::temporaries, t * m.ffn * ab * (m.mlp == mlp_kind::swiglu ? 2 : 1));
      std::uint64_t out = g.alloc(c::activations, a);
      g.free(inner);
      g.free(attn);
      g.free(x);
      x = out;
    }
    g.free(g.alloc(c::temporaries, o.batch * m.vocab * 4));  // fp32 logits of the last token
    g.free(x);
  };
  const std::uint64_t decode = o.decode_steps < o.sequence ? o.decode_steps : o.sequence;
  const std::uint64_t prompt = o.sequence - decode;
  if (prompt > 0) pass(prompt, prompt);
  for (std::uint64_t s = 0; s < decode; ++s) pass(1, prompt + s + 1);
  for (std::uint64_t id : caches) g.free(id);
}

/// Training: per optimizer step, forward and backward per micro-batch (gradients created by
/// the first backward and accumulated by the rest), then the optimizer step, whose state
/// appears at the first step as in PyTorch. With checkpointing every k layers, a forward keeps
/// only each segment's input; the backward recomputes a segment before going through it.
inline void train(step_builder& g, const decoder_model& m, const step_options& o) {
  using c = category;
  const std::uint64_t h = m.hidden, kv = m.kv_width(), ab = activation_bytes(o);
  const std::uint64_t micro = o.micro_batch == 0 ? o.batch : o.micro_batch;
  const std::uint64_t t = micro * o.sequence, a = t * h * ab;
  const std::uint64_t score_bytes = micro * m.heads * o.sequence * o.sequence * ab;
  const std::uint64_t mlp_bytes = t * m.ffn * ab;
  const std::uint64_t k = o.checkpoint_every;
  const std::vector<std::uint64_t> trained = trained_tensors(m, o);
  const number_format grad_format = trained_format(o);
  const std::size_t outer = o.mode == run_mode::training ? m.outer_tensors().size() : 0;
  const std::size_t per_layer = o.mode == run_mode::training ? m.layer_tensors().size() : 8;

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
    norm();
    save(t * (h + 2 * kv) * ab);       // q, k, v
    if (m.positions == 0) save(t * (h + kv) * ab);  // q and k after the rotary embedding
    if (o.flash_attention) {
      save(micro * m.heads * o.sequence * 4);  // log-sum-exp
    } else {
      std::uint64_t raw = g.alloc(c::temporaries, score_bytes);  // scores before the softmax
      save(probability_bytes);                                   // probabilities
      if (mixed) save(score_bytes);                              // their bf16 copy for the product with v
      g.free(raw);
    }
    save(a);                           // attention output (the output projection's input)
    save(r);                           // residual
    norm();
    // GELU: fc1 output, its activation. SwiGLU: gate, up, SiLU(gate), their product.
    for (int i = 0; i < (m.mlp == mlp_kind::swiglu ? 4 : 2); ++i) save(mlp_bytes);
    save(r);                           // output: the next layer's input
  };
  auto free_all = [&](std::vector<std::uint64_t>& ids) {
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) g.free(*it);
    ids.clear();
  };
  const auto segment_end = [&](std::uint64_t l) { return (l + 1) % k == 0 || l + 1 == m.layers; };

  constexpr std::uint64_t no_grad = UINT64_MAX;  // a gradient not allocated (or freed)
  std::vector<std::uint64_t> grads(trained.size(), no_grad), state;
  for (int step = 0; step < o.steps; ++step) {
    g.mark_step();
    if (o.zero_grad_first)  // zero_grad(set_to_none=True) first: the last step's gradients go
      for (std::uint64_t& id : grads)
        if (id != no_grad) g.free(std::exchange(id, no_grad));
    for (std::uint64_t mb = 0; mb < o.batch / micro; ++mb) {
      auto grad = [&](std::size_t i) {
        if (mb == 0) grads[i] = g.alloc(c::gradients, bytes_of(grad_format, trained[i]));
      };
      std::uint64_t tokens = g.alloc(c::activations, t * 8);
      std::uint64_t x = g.alloc(c::activations, r);  // embedding output: layer 0's input
      std::vector<std::vector<std::uint64_t>> saved(m.layers);
      std::vector<std::uint64_t> checkpoint(m.layers, 0);  // a segment's output, kept as the next one's input
      for (std::uint64_t l = 0; l < m.layers; ++l) {
        layer_forward(saved[l]);
        if (k == 0) continue;
        std::uint64_t out = saved[l].back();
        saved[l].pop_back();
        free_all(saved[l]);
        if (segment_end(l)) checkpoint[l] = out;
        else g.free(out);
      }
      std::uint64_t logits = g.alloc(c::activations, t * m.vocab * 4);  // fp32 for the loss
      std::uint64_t grad_logits = g.alloc(c::temporaries, t * m.vocab * 4);
      g.free(logits);
      std::uint64_t grad_x = g.alloc(c::temporaries, a);
      g.free(grad_logits);
      for (std::size_t i = outer; i-- > 0;) grad(i);  // head, final norm, positions, embedding
      for (std::uint64_t l = m.layers; l-- > 0;) {
        if (k != 0 && segment_end(l)) {  // recompute the segment ending here from its input
          for (std::uint64_t at = l - l % k; at <= l; ++at) layer_forward(saved[at]);
          g.free(checkpoint[l]);  // recomputed: the copy kept by the forward is no longer needed
        }
        for (std::size_t i = per_layer; i-- > 0;) grad(outer + l * per_layer + i);
        std::uint64_t g_mlp = g.alloc(c::temporaries, mlp_bytes);
        if (!o.flash_attention) g.free(g.alloc(c::temporaries, score_bytes));
        g.free(g_mlp);
        free_all(saved[l]);
        std::uint64_t below = g.alloc(c::temporaries, a);  // the gradient for the layer below
        g.free(grad_x);
        grad_x = below;
      }
      g.free(grad_x);
      g.free(x);
      g.free(tokens);
    }
    if (o.optimizer != optimizer_kind::none) {
      if (state.empty())
        for (std::uint64_t n : trained) {
          const int moments = o.optimizer == optimizer_kind::sgd ? 1 : 2;
          const std::uint64_t bytes = o.optimizer == optimizer_kind::adamw_8bit ? n : n * 4;
          for (int i = 0; i < moments; ++i) state.push_back(g.alloc(c::optimizer, bytes));
        }
      for (std::uint64_t n : trained) g.free(g.alloc(c::temporaries, bytes_of(grad_format, n)));  // the update
    }
    if (!o.zero_grad_first)
      for (std::uint64_t& id : grads) g.free(std::exchange(id, no_grad));  // zero_grad(set_to_none=True)
  }
  g.mark_step();  // the teardown
  for (std::uint64_t id : grads)
    if (id != no_grad) g.free(id);
  for (std::uint64_t id : state) g.free(id);
}

}  // namespace vram::detail::trace

namespace vram::trace {

/// The trace of `o.steps` optimizer steps (training, lora) or of one prefill and
/// `o.decode_steps` decoding steps (inference) of model `m`. Validates both first.
[[nodiscard]] inline step_trace generate_step(const decoder_model& m, const step_options& o) {
  m.validate();
  o.validate(m);
  detail::trace::step_builder g(m.name);
  std::vector<std::uint64_t> weights = detail::trace::allocate_weights(g, m, o);
  if (o.mode == run_mode::inference) detail::trace::serve(g, m, o);
  else detail::trace::train(g, m, o);
  for (std::uint64_t id : weights) g.free(id);
  return std::move(g).finish();
}

/// One optimizer step of a running training loop, as a snapshot recorded over it sees it: the
/// second step of `o` (zero_grad first, so the first step's gradients and the optimizer state
/// are live at its start, with the weights), and its own gradients live at its end.
/// trace::repeat_steps makes it a loop whose gradients cross every step boundary.
[[nodiscard]] inline trace training_loop_step(const decoder_model& m, step_options o) {
  o.mode = run_mode::training;
  o.steps = 2;
  o.zero_grad_first = true;
  step_trace s = generate_step(m, o);
  trace out = window(s.t, s.step_starts[1], s.step_starts[2]);
  out.name = m.name + " training loop step (b=" + std::to_string(o.batch) + ", s=" + std::to_string(o.sequence) + ")";
  return out;
}

}  // namespace vram::trace

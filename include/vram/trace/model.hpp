#pragma once
// vram::trace::transformer_model: the shape of a transformer (a decoder in GPT-2's, Llama's or
// Mixtral's style, or a BERT-style encoder), its exact parameter count, and published
// configurations by name. What vram-fit and the step generator (vram/trace/step.hpp) build a
// model's memory from.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <vram/core/throw.hpp>

namespace vram::trace {

enum class mlp_kind : std::uint8_t {
  gelu,    ///< fc1 (hidden -> ffn), GELU, fc2 (ffn -> hidden): GPT-2
  swiglu,  ///< gate and up (hidden -> ffn), SiLU(gate) * up, down (ffn -> hidden): Llama
};

/// A transformer. The families differ in a few switches: learned position embeddings (GPT-2,
/// BERT) or rotary ones (Llama, none stored); biases on every linear layer and norm (LayerNorm)
/// or none (RMSNorm); the MLP; tied or separate embeddings; one MLP per layer or a mixture of
/// experts (Mixtral: `experts` MLPs and a router per layer, each token through
/// `experts_per_token` of them); a causal decoder or a bidirectional encoder.
struct transformer_model {
  std::string name = "custom";
  std::uint64_t layers = 0;
  std::uint64_t hidden = 0;
  std::uint64_t heads = 0;
  std::uint64_t kv_heads = 0;  ///< grouped-query attention: fewer key/value heads than heads
  std::uint64_t ffn = 0;       ///< the MLP's inner width
  std::uint64_t vocab = 0;
  std::uint64_t positions = 0;  ///< learned position embeddings (GPT-2: 1024); 0: rotary
  mlp_kind mlp = mlp_kind::gelu;
  bool biases = true;           ///< biases on linear layers and norms
  bool tied_embeddings = true;  ///< the output head reuses the token embedding
  std::uint64_t experts = 1;            ///< MLPs per layer (1: a dense MLP; more: a router picks)
  std::uint64_t experts_per_token = 1;  ///< the experts each token goes through (top-k)
  /// A BERT-style encoder: bidirectional attention and nothing cached between tokens (so no
  /// inference mode, only forward passes); token-type embeddings and a LayerNorm on the
  /// embeddings (where a decoder has its final norm); a masked-LM head (a dense transform,
  /// GELU and LayerNorm before the tied decoder, which has a bias per vocabulary entry).
  bool encoder = false;
  std::uint64_t token_types = 2;  ///< an encoder's token-type embeddings (type_vocab_size)

  [[nodiscard]] bool mixture() const noexcept { return experts > 1; }

  [[nodiscard]] std::uint64_t head_dim() const noexcept { return hidden / heads; }
  /// Width of the key (and of the value) projection.
  [[nodiscard]] std::uint64_t kv_width() const noexcept { return kv_heads * head_dim(); }

  /// One parameter tensor: its elements, and whether it is a weight matrix of a linear layer
  /// (what a quantized base stores in int8 or int4; norms, biases and embeddings stay bf16).
  struct tensor {
    std::uint64_t elements;
    bool matrix;
    std::uint64_t rows = 0;  ///< a matrix's output rows (per-row scales of an int8 base)
  };

  /// The parameter tensors of one layer, in module order: norm, q, k, v, o, norm, the MLP's
  /// matrices, then the biases (q, k, v, o, the MLP's) where the family has them. A mixture
  /// of experts has the router (hidden -> experts, no bias) after the second norm, then each
  /// expert's matrices and biases in place of the MLP's; experts are split like the MLP. With
  /// `tp` > 1, one tensor-parallel rank's share as Megatron splits a layer: q, k, v and the
  /// MLP's first matrices by output column (with their biases), o and the MLP's last matrix by
  /// input row (their biases whole), the norms whole. `tp` divides heads, kv_heads and ffn.
  [[nodiscard]] std::vector<tensor> layer_tensors(std::uint64_t tp = 1) const {
    const std::uint64_t h = hidden, q = hidden / tp, kv = kv_width() / tp, f = ffn / tp;
    const std::uint64_t norm = biases ? 2 * h : h;  // LayerNorm: weight and bias; RMSNorm: weight
    std::vector<tensor> t = {{norm, false},    {h * q, true, q}, {h * kv, true, kv},
                             {h * kv, true, kv}, {q * h, true, h}, {norm, false}};
    if (mixture()) t.push_back({h * experts, true, experts});
    for (std::uint64_t e = 0; e < experts; ++e) {
      if (mlp == mlp_kind::gelu) t.insert(t.end(), {{h * f, true, f}, {f * h, true, h}});
      else t.insert(t.end(), {{h * f, true, f}, {h * f, true, f}, {f * h, true, h}});
    }
    if (biases) {
      t.insert(t.end(), {{q, false}, {kv, false}, {kv, false}, {h, false}});
      for (std::uint64_t e = 0; e < experts; ++e) t.insert(t.end(), {{f, false}, {h, false}});
    }
    return t;
  }
  /// The tensors outside the layers, in module order: the input tensors (token embedding,
  /// learned positions; an encoder's token types and embedding norm), a decoder's final norm,
  /// an encoder's masked-LM head (the transform's matrix and bias, its norm, the decoder's
  /// bias), the output head (when not tied). With `tp` > 1, one tensor-parallel rank's share:
  /// the embedding, the head and the decoder's bias split by vocabulary rows (Megatron's
  /// vocab-parallel embedding, ceil(vocab / tp) rows), the rest whole.
  [[nodiscard]] std::vector<tensor> outer_tensors(std::uint64_t tp = 1) const {
    const std::uint64_t rows = (vocab + tp - 1) / tp, norm = biases ? 2 * hidden : hidden;
    std::vector<tensor> t = {{rows * hidden, false}};
    if (positions != 0) t.push_back({positions * hidden, false});
    if (encoder) t.insert(t.end(), {{token_types * hidden, false}, {norm, false}});
    if (encoder) t.insert(t.end(), {{hidden * hidden, true, hidden}, {hidden, false}, {norm, false}, {rows, false}});
    else t.push_back({norm, false});
    if (!tied_embeddings) t.push_back({rows * hidden, false});
    return t;
  }
  /// How many of outer_tensors() lead into the first layer (a pipeline's first stage holds
  /// them; the last stage the rest).
  [[nodiscard]] std::size_t input_tensors() const noexcept { return 1 + (positions != 0) + (encoder ? 2 : 0); }
  /// The elements of one layer that linear layers use (their matrices and biases): what
  /// autocast casts to bf16 and caches.
  [[nodiscard]] std::uint64_t layer_linear_parameters(std::uint64_t tp = 1) const {
    std::uint64_t n = 0;
    for (const tensor& x : layer_tensors(tp)) n += x.matrix ? x.elements : 0;
    if (biases) n += hidden / tp + 2 * kv_width() / tp + hidden + experts * (ffn / tp + hidden);
    return n;
  }
  [[nodiscard]] std::uint64_t layer_parameters(std::uint64_t tp = 1) const {
    std::uint64_t n = 0;
    for (const tensor& x : layer_tensors(tp)) n += x.elements;
    return n;
  }
  /// Every parameter (GPT-2 small: 124,439,808; Llama-2-7B: 6,738,415,616).
  [[nodiscard]] std::uint64_t parameters() const {
    std::uint64_t n = layers * layer_parameters();
    for (const tensor& x : outer_tensors()) n += x.elements;
    return n;
  }

  /// Throws vram::invalid_argument naming the field when the shape is impossible or absurd.
  void validate() const {
    auto need = [](bool ok, const std::string& what) {
      if (!ok) detail::throw_invalid_argument("transformer_model", what.c_str());
    };
    constexpr std::uint64_t big = std::uint64_t{1} << 20;  // no published model has a dimension near it
    need(layers >= 1 && layers <= 4096, "layers must be 1 to 4096 (is " + std::to_string(layers) + ")");
    need(hidden >= 1 && hidden <= big, "hidden must be 1 to 2^20 (is " + std::to_string(hidden) + ")");
    need(heads >= 1 && heads <= hidden, "heads must be 1 to hidden (is " + std::to_string(heads) + ")");
    need(hidden % heads == 0,
         "heads (" + std::to_string(heads) + ") must divide hidden (" + std::to_string(hidden) + ")");
    need(kv_heads >= 1 && kv_heads <= heads && heads % kv_heads == 0,
         "kv_heads (" + std::to_string(kv_heads) + ") must divide heads (" + std::to_string(heads) + ")");
    need(ffn >= 1 && ffn <= 16 * big, "ffn must be 1 to 2^24 (is " + std::to_string(ffn) + ")");
    need(vocab >= 1 && vocab <= 16 * big, "vocab must be 1 to 2^24 (is " + std::to_string(vocab) + ")");
    need(positions <= big, "positions must be at most 2^20 (is " + std::to_string(positions) + ")");
    need(token_types <= big, "token_types must be at most 2^20 (is " + std::to_string(token_types) + ")");
    need(experts >= 1 && experts <= 1024, "experts must be 1 to 1024 (is " + std::to_string(experts) + ")");
    need(experts_per_token >= 1 && experts_per_token <= experts,
         "experts_per_token (" + std::to_string(experts_per_token) + ") must be 1 to experts (" +
             std::to_string(experts) + ")");
  }
};

/// A published configuration, with where its numbers come from.
struct model_preset {
  transformer_model model;
  const char* source;
};

/// GPT-2 small, medium, large and XL (learned positions, biases, GELU, tied embeddings),
/// Llama 2 7B, 13B, 70B and Llama 3 8B (rotary, no biases, SwiGLU, separate head; 70B and
/// 8B with grouped-query attention), Mixtral 8x7B (Llama's layers with eight SwiGLU experts,
/// two per token) and BERT base and large (encoders with their masked-LM head, as
/// BertForMaskedLM builds them), as their published config.json files give them.
inline const std::vector<model_preset>& model_presets() {
  auto gpt2 = [](const char* name, std::uint64_t layers, std::uint64_t hidden, std::uint64_t heads) {
    return transformer_model{name, layers, hidden, heads, heads, 4 * hidden, 50257, 1024, mlp_kind::gelu, true, true};
  };
  auto llama = [](const char* name, std::uint64_t layers, std::uint64_t hidden, std::uint64_t heads,
                  std::uint64_t kv_heads, std::uint64_t ffn, std::uint64_t vocab) {
    return transformer_model{name, layers, hidden, heads, kv_heads, ffn, vocab, 0, mlp_kind::swiglu, false, false};
  };
  auto mixtral = [&](const char* name, std::uint64_t layers, std::uint64_t hidden, std::uint64_t heads,
                     std::uint64_t kv_heads, std::uint64_t ffn, std::uint64_t vocab, std::uint64_t experts) {
    transformer_model m = llama(name, layers, hidden, heads, kv_heads, ffn, vocab);
    m.experts = experts;
    m.experts_per_token = 2;
    return m;
  };
  auto bert = [](const char* name, std::uint64_t layers, std::uint64_t hidden, std::uint64_t heads) {
    transformer_model m{name, layers, hidden, heads, heads, 4 * hidden, 30522, 512, mlp_kind::gelu, true, true};
    m.encoder = true;
    return m;
  };
  static const std::vector<model_preset> presets = {
      {gpt2("gpt2", 12, 768, 12), "openai-community/gpt2, config.json (n_layer 12, n_embd 768, n_head 12)"},
      {gpt2("gpt2-medium", 24, 1024, 16), "openai-community/gpt2-medium, config.json (24, 1024, 16)"},
      {gpt2("gpt2-large", 36, 1280, 20), "openai-community/gpt2-large, config.json (36, 1280, 20)"},
      {gpt2("gpt2-xl", 48, 1600, 25), "openai-community/gpt2-xl, config.json (48, 1600, 25)"},
      {llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000), "meta-llama/Llama-2-7b-hf, config.json"},
      {llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000), "meta-llama/Llama-2-13b-hf, config.json"},
      {llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000), "meta-llama/Llama-2-70b-hf, config.json"},
      {llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256), "meta-llama/Meta-Llama-3-8B, config.json"},
      {mixtral("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 8),
       "mistralai/Mixtral-8x7B-v0.1, config.json (num_local_experts 8, num_experts_per_tok 2)"},
      {bert("bert-base-uncased", 12, 768, 12), "google-bert/bert-base-uncased, config.json (12, 768, 12)"},
      {bert("bert-large-uncased", 24, 1024, 16), "google-bert/bert-large-uncased, config.json (24, 1024, 16)"},
  };
  return presets;
}

/// The preset named `name`, if there is one.
[[nodiscard]] inline std::optional<transformer_model> find_preset(std::string_view name) {
  for (const model_preset& p : model_presets())
    if (p.model.name == name) return p.model;
  return std::nullopt;
}

}  // namespace vram::trace

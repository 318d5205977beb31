// Mixtures of experts and encoders in the model and the step generator (vram/trace/model.hpp,
// step.hpp): parameter counts from the modules Hugging Face builds, and each category's bytes
// from first principles, the saved activations summed over the experts included.
#include <catch2/catch.hpp>

#include "support/generated_steps.hpp"

#include <cstdint>
#include <stdexcept>

#include <vram/trace/model.hpp>
#include <vram/trace/step.hpp>

using namespace vram::trace;

namespace {

using vram::test::check_balanced;
using vram::test::preset;

std::uint64_t own_peak(const step_trace& s, category c) {
  return peak_by_category(s).own_peak[static_cast<std::size_t>(c)];
}

}  // namespace

TEST_CASE("a mixture of experts: every expert's weights, one router, Mixtral's published count") {
  const transformer_model m = preset("mixtral-8x7b");
  // 46,702,792,704: Mixtral 8x7B's "46.7B total parameters" (Mistral AI's announcement), as the
  // modules of Hugging Face's MixtralForCausalLM add up: per layer q, o 4096 x 4096, k, v
  // 4096 x 1024, a router 4096 x 8, eight experts of three 4096 x 14336 matrices, two norms.
  CHECK(m.parameters() == 46'702'792'704);
  const std::uint64_t h = 4096, f = 14336;
  CHECK(m.layer_parameters() == 2 * h * h + 2 * h * 1024 + h * 8 + 8 * 3 * h * f + 2 * h);
  // Active per token: two of eight experts (12.9B in the announcement).
  const std::uint64_t active = m.parameters() - m.layers * 6 * 3 * h * f;
  CHECK(active == 12'879'925'248);

  // Tensor parallel: every expert split like the MLP, the router whole.
  std::uint64_t matrices = 0;
  for (const auto& t : m.layer_tensors(4)) matrices += t.matrix ? t.elements : 0;
  CHECK(matrices == 2 * h * h / 4 + 2 * h * 1024 / 4 + h * 8 + 8 * 3 * h * f / 4);

  // A dense model is a mixture of one expert: the same tensors.
  transformer_model dense = preset("llama-2-7b");
  CHECK(dense.layer_tensors().size() == 9);
  dense.experts = 4;
  dense.experts_per_token = 1;
  CHECK(dense.layer_tensors().size() == 9 + 1 + 3 * 3);
  dense.experts_per_token = 5;
  CHECK_THROWS_AS(dense.validate(), std::invalid_argument);
  dense.experts = 0;
  dense.experts_per_token = 1;
  CHECK_THROWS_AS(dense.validate(), std::invalid_argument);
}

TEST_CASE("a mixture of experts in training: model state for every expert, activations for top-k per token") {
  // A small Mixtral-shaped model, so that each case runs fast.
  transformer_model m = preset("mixtral-8x7b");
  m.layers = 2;
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 2;
  m.ffn = 1792;
  m.vocab = 4000;
  const std::uint64_t p = m.parameters(), h = m.hidden, f = m.ffn;
  step_options o;
  o.batch = 2;
  o.sequence = 128;
  o.flash_attention = true;
  const std::uint64_t t = o.batch * o.sequence;

  auto s = generate_step(m, o);
  check_balanced(s);
  CHECK(own_peak(s, category::weights) == 2 * p);
  CHECK(own_peak(s, category::gradients) == 2 * p);
  CHECK(own_peak(s, category::optimizer) == 4 * p);

  // What the experts save, against the dense model with the same MLP: per layer the router's
  // probabilities (fp32), the top-k choices, and over the experts top-k copies of each token's
  // input, MLP intermediates and output, in place of one copy of the intermediates.
  auto activations = [&](std::uint64_t experts, std::uint64_t k) {
    transformer_model x = m;
    x.experts = experts;
    x.experts_per_token = k;
    return own_peak(generate_step(x, o), category::activations);
  };
  const std::uint64_t dense = activations(1, 1);
  for (std::uint64_t k : {1, 2}) {
    const std::uint64_t per_layer = t * 8 * 4 + t * k * (8 + 4 + 2) + t * k * (2 * h + 4 * f) * 2 - t * 4 * f * 2;
    CHECK(activations(8, k) == dense + m.layers * per_layer);
  }
  // Twice the experts, the same top-k: the tokens spread over more experts, so only the
  // router's probabilities grow.
  CHECK(activations(16, 2) - activations(8, 2) == m.layers * t * 8 * 4);

  SECTION("inference: the experts' weights and the same KV cache as the dense model") {
    o.mode = run_mode::inference;
    auto served = generate_step(m, o);
    check_balanced(served);
    transformer_model one = m;
    one.experts = 1;
    one.experts_per_token = 1;
    CHECK(own_peak(served, category::kv_cache) == own_peak(generate_step(one, o), category::kv_cache));
    CHECK(own_peak(served, category::weights) == 2 * p);
  }
  SECTION("LoRA adapters on the attention only; a 4-bit base keeps the experts' inputs") {
    o.mode = run_mode::lora;
    o.weights = number_format::nf4;
    auto lora = generate_step(m, o);
    check_balanced(lora);
    const std::uint64_t r = o.lora_rank, adapters = m.layers * (4 * r * h + r * (2 * h + 2 * m.kv_width()));
    CHECK(own_peak(lora, category::gradients) == 4 * adapters);
    // Before bitsandbytes 0.43.2 each 4-bit product keeps its input: the router's and, over
    // the experts, top-k copies of each token's input to the first products and to the last.
    o.four_bit.keeps_input = true;
    auto kept = generate_step(m, o);
    check_balanced(kept);
    // Layer 0's first input needs no gradient. The previous step's graph, with its inputs,
    // lives until this step's loss replaces it: two sets at the peak.
    const std::uint64_t per_layer = t * (3 * h + 2 * h + 2 * f) * 2;
    CHECK(own_peak(kept, category::activations) - own_peak(lora, category::activations) ==
          2 * (m.layers * per_layer - t * h * 2));
  }
  SECTION("sharded over 4 ranks by ZeRO-3 and tensor parallel 2: a quarter of every expert's state per rank") {
    o.parallel.sharding = shard_kind::zero;
    o.parallel.stage_of_zero = 3;
    o.parallel.shards = 4;
    auto rank = generate_step(m, o);
    check_balanced(rank);
    CHECK(own_peak(rank, category::optimizer) == 4 * ((p + 3) / 4));
    o.parallel = {};
    o.parallel.tensor = 2;
    auto tp = generate_step(m, o);
    check_balanced(tp);
    CHECK(m.layer_parameters(2) == (m.layer_parameters() - h * 8 - 2 * h) / 2 + h * 8 + 2 * h);
    CHECK(own_peak(tp, category::weights) == 2 * rank_parameters(m, o.parallel));
  }
}

TEST_CASE("an encoder: BERT's published counts, no inference mode, its masked-LM head") {
  // BertForMaskedLM as Hugging Face builds it: BertModel without its pooler (109,482,240 and
  // 335,141,888 with it, the counts usually quoted for bert-base and bert-large) and the
  // masked-LM head: a 768 x 768 transform with its bias, a LayerNorm and the decoder's bias
  // (the decoder's matrix is the word embedding).
  const transformer_model base = preset("bert-base-uncased"), large = preset("bert-large-uncased");
  const auto pooler = [](std::uint64_t h) { return h * h + h; };
  const auto head = [](std::uint64_t h) { return h * h + h + 2 * h + 30522; };
  CHECK(base.parameters() - head(768) + pooler(768) == 109'482'240);
  CHECK(large.parameters() - head(1024) + pooler(1024) == 335'141'888);
  CHECK(base.input_tensors() == 4);  // word, positions, token types, embedding norm

  step_options o;
  o.batch = 4;
  o.sequence = 512;
  o.mode = run_mode::inference;
  CHECK_THROWS_AS(generate_step(base, o), std::invalid_argument);

  o.mode = run_mode::forward;
  auto forward = generate_step(base, o);
  check_balanced(forward);
  CHECK(own_peak(forward, category::kv_cache) == 0);
  CHECK(own_peak(forward, category::activations) == 2 * o.batch * o.sequence * 768 * 2);

  // Training: against the same layers as a decoder (GPT-2's switches, BERT's shape), the
  // encoder saves the embedding norm's input and three tensors of the head's transform.
  o.mode = run_mode::training;
  o.flash_attention = true;
  transformer_model decoder = base;
  decoder.encoder = false;
  auto encoder_step = generate_step(base, o);
  check_balanced(encoder_step);
  const std::uint64_t t = o.batch * o.sequence, a = t * 768 * 2;
  CHECK(own_peak(encoder_step, category::activations) ==
        own_peak(generate_step(decoder, o), category::activations) + 4 * a);
  CHECK(own_peak(encoder_step, category::optimizer) == 4 * base.parameters());

  // A pipeline's first stage holds the four input tensors, its last the head.
  o.parallel.pipeline = 2;
  o.parallel.stage = 0;
  std::uint64_t first = 0;
  for (const auto& x : rank_outer_tensors(base, o.parallel)) first += x.elements;
  CHECK(first == 30522 * 768 + 512 * 768 + 2 * 768 + 2 * 768);
}

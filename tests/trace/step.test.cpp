// The model presets and the step generator (vram/trace/model.hpp, step.hpp): exact parameter
// counts, each category's bytes from first principles, and every remedy vram-fit offers
// never raising peak live.
#include <catch2/catch.hpp>

#include "support/generated_steps.hpp"

#include <cstdint>
#include <string>

#include <vram-fit/remedies.hpp>
#include <vram/trace/model.hpp>
#include <vram/trace/step.hpp>

using namespace vram::trace;

using vram::test::check_balanced;
using vram::test::preset;

TEST_CASE("presets have their published parameter counts") {
  // The counts Hugging Face reports for these checkpoints (model.num_parameters()).
  CHECK(preset("gpt2").parameters() == 124'439'808);
  CHECK(preset("gpt2-medium").parameters() == 354'823'168);
  CHECK(preset("gpt2-large").parameters() == 774'030'080);
  CHECK(preset("gpt2-xl").parameters() == 1'557'611'200);
  CHECK(preset("llama-2-7b").parameters() == 6'738'415'616);
  CHECK(preset("llama-2-13b").parameters() == 13'015'864'320);
  CHECK(preset("llama-2-70b").parameters() == 68'976'648'192);
  CHECK(preset("llama-3-8b").parameters() == 8'030'261'248);
  CHECK_FALSE(find_preset("gpt5").has_value());
}

TEST_CASE("each category holds the bytes the model and the run imply") {
  const transformer_model m = preset("gpt2");
  const std::uint64_t p = m.parameters();
  step_options o;
  o.batch = 2;
  o.sequence = 256;

  SECTION("full training, bf16: weights, gradients and each AdamW moment 2 bytes per parameter") {
    auto s = generate_step(m, o);
    check_balanced(s);
    auto k = peak_by_category(s);
    CHECK(k.own_peak[0] == 2 * p);
    CHECK(k.own_peak[1] == 2 * p);
    CHECK(k.own_peak[2] == 4 * p);  // zeros_like(param): the moments take the parameter's dtype
    CHECK(k.own_peak[5] == 0);
    CHECK(k.own_peak[6] == 0);  // no autocast cache over 16-bit weights
  }
  SECTION("fp32 weights: 4 bytes each; 8-bit AdamW: 2 bytes and an fp32 absmax per 256; SGD: 4 bytes") {
    o.weights = number_format::fp32;
    auto k = peak_by_category(generate_step(m, o));
    CHECK(k.own_peak[0] == 4 * p);
    CHECK(k.own_peak[1] == 4 * p);
    o.optimizer = optimizer_kind::adamw_8bit;
    std::uint64_t eight_bit = 0;  // bitsandbytes keeps 32-bit moments under 4096 elements
    for (const auto& t : m.outer_tensors()) eight_bit += t.elements >= 4096 ? 2 * (t.elements + 4 * ((t.elements + 255) / 256)) : 8 * t.elements;
    for (const auto& t : m.layer_tensors())
      eight_bit += m.layers * (t.elements >= 4096 ? 2 * (t.elements + 4 * ((t.elements + 255) / 256)) : 8 * t.elements);
    CHECK(peak_by_category(generate_step(m, o)).own_peak[2] == eight_bit);
    o.optimizer = optimizer_kind::sgd;
    CHECK(peak_by_category(generate_step(m, o)).own_peak[2] == 4 * p);
  }
  SECTION("LoRA: the frozen base, then fp32 adapters with their gradients and AdamW state") {
    o.mode = run_mode::lora;
    o.lora_rank = 8;
    const std::uint64_t h = m.hidden, adapters = m.layers * 4 * (8 * h + h * 8);
    auto s = generate_step(m, o);
    check_balanced(s);
    auto k = peak_by_category(s);
    CHECK(k.own_peak[0] == 2 * p + 4 * adapters);
    CHECK(k.own_peak[1] == 4 * adapters);
    CHECK(k.own_peak[2] == 8 * adapters);
  }
  SECTION("an int8 base: its linear matrices 1 byte per weight and an fp32 scale per row, the rest bf16") {
    o.mode = run_mode::inference;
    o.weights = number_format::int8;
    std::uint64_t matrices = 0, rows = 0;
    for (const auto& t : m.layer_tensors()) matrices += t.matrix ? t.elements : 0, rows += t.rows;
    matrices *= m.layers;
    rows *= m.layers;
    auto k = peak_by_category(generate_step(m, o));
    CHECK(k.own_peak[0] == matrices + 4 * rows + 2 * (p - matrices));
    o.weights = number_format::int4;
    CHECK(peak_by_category(generate_step(m, o)).own_peak[0] == matrices / 2 + 2 * (p - matrices));
  }
  SECTION("inference: a KV cache of 2 x layers x sequences x length x kv width") {
    const transformer_model llama = preset("llama-3-8b");  // grouped-query: 8 of 32 heads
    o.mode = run_mode::inference;
    o.batch = 3;
    o.sequence = 4096;
    o.kv_cache = number_format::bf16;
    auto s = generate_step(llama, o);
    check_balanced(s);
    auto k = peak_by_category(s);
    CHECK(k.own_peak[5] == 2 * llama.layers * 3 * 4096 * (8 * 128) * 2);
    CHECK(k.own_peak[1] == 0);
    CHECK(k.own_peak[2] == 0);
    o.kv_cache = number_format::int8;
    CHECK(peak_by_category(generate_step(llama, o)).own_peak[5] == k.own_peak[5] / 2);
  }
  SECTION("gradient accumulation keeps one set of gradients and shrinks activations") {
    o.batch = 4;
    auto whole = peak_by_category(generate_step(m, o));
    o.micro_batch = 1;
    auto s = generate_step(m, o);
    check_balanced(s);
    auto accumulated = peak_by_category(s);
    CHECK(accumulated.own_peak[1] == 2 * p);
    CHECK(accumulated.own_peak[3] < whole.own_peak[3]);
  }
  SECTION("checkpointing keeps fewer activations, and every k layers keeps more than every layer") {
    o.checkpoint_every = 0;
    auto none = peak_by_category(generate_step(m, o)).own_peak[3];
    o.checkpoint_every = 1;
    auto s = generate_step(m, o);
    check_balanced(s);
    auto every = peak_by_category(s).own_peak[3];
    o.checkpoint_every = 4;
    auto s4 = generate_step(m, o);
    check_balanced(s4);
    CHECK(every < none);
    CHECK(peak_by_category(s4).own_peak[3] < none);
  }
}

TEST_CASE("no remedy vram-fit offers raises peak live") {
  struct config {
    const char* preset;
    step_options run;
  };
  step_options training;
  training.batch = 4;
  training.sequence = 512;
  step_options fp32 = training;
  fp32.weights = number_format::fp32;
  fp32.autocast = false;
  step_options lora = training;
  lora.mode = run_mode::lora;
  step_options serving;
  serving.mode = run_mode::inference;
  serving.batch = 6;
  for (const config& c : {config{"gpt2-medium", training}, config{"gpt2", fp32}, config{"llama-2-7b", lora},
                          config{"llama-3-8b", serving}, config{"mixtral-8x7b", lora}, config{"mixtral-8x7b", serving},
                          config{"bert-base-uncased", training}}) {
    const transformer_model m = preset(c.preset);
    const std::uint64_t base = peak_by_category(generate_step(m, c.run)).peak_live;
    auto remedies = vram_fit::remedies_for(c.run);
    CHECK(remedies.size() >= 3);
    for (const auto& r : remedies) {
      INFO(c.preset << ": " << r.name);
      // Autocast over fp32 weights caches a bf16 copy of every linear weight (2 bytes per
      // parameter): at GPT-2's small activations that costs more than bf16 activations save,
      // so this check leaves it out; vram-fit ranks it by what the run then needs.
      if (r.name == "autocast") continue;
      CHECK(peak_by_category(generate_step(m, r.run)).peak_live <= base);
    }
  }
}

TEST_CASE("impossible shapes and runs are refused naming the field") {
  auto refused_with = [](const transformer_model& m, const step_options& o, const char* field) {
    try {
      (void)generate_step(m, o);
      FAIL("accepted");
    } catch (const vram::invalid_argument& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(field) != std::string::npos);
    }
  };
  transformer_model m = preset("gpt2");
  step_options o;
  m.heads = 7;
  refused_with(m, o, "heads");
  m = preset("gpt2");
  m.layers = 0;
  refused_with(m, o, "layers");
  m = preset("llama-2-70b");
  m.kv_heads = 3;
  refused_with(m, o, "kv_heads");
  m = preset("gpt2");
  m.hidden = std::uint64_t{1} << 40;
  refused_with(m, o, "hidden");
  o.sequence = 2048;  // GPT-2 learned 1024 positions
  refused_with(preset("gpt2"), o, "sequence");
  o = {};
  o.weights = number_format::int4;
  refused_with(preset("gpt2"), o, "weights");
  o = {};
  o.batch = 6;
  o.micro_batch = 4;
  refused_with(preset("gpt2"), o, "micro_batch");
}

TEST_CASE("forward mode: one pass, nothing kept but the weights and, under autocast, their cached bf16 copies") {
  const transformer_model m = preset("llama-2-7b");
  step_options o;
  o.mode = run_mode::forward;
  o.batch = 1;
  o.sequence = 512;
  o.weights = number_format::fp32;
  auto s = generate_step(m, o);
  check_balanced(s);
  auto k = peak_by_category(s);
  CHECK(k.own_peak[5] == 0);  // no KV cache
  CHECK(k.own_peak[6] == 2 * (m.layers * m.layer_linear_parameters() + m.vocab * m.hidden));
  o.autocast = false;
  CHECK(peak_by_category(generate_step(m, o)).own_peak[6] == 0);
}

TEST_CASE("nf4 and fp4: half a byte a weight, an fp32 absmax per 64; double quantization: 8-bit absmax") {
  constexpr std::uint64_t n = 4096 * 11008, blocks = n / 64;
  STATIC_REQUIRE(stored_bytes(number_format::nf4, n, 11008, false) == n / 2 + 4 * blocks);
  STATIC_REQUIRE(stored_bytes(number_format::fp4, n, 11008, true) == n / 2 + blocks + 4 * (blocks / 256) + 4);
  STATIC_REQUIRE(stored_bytes(number_format::int8, n, 11008, false) == n + 4 * 11008);
}

namespace {
/// A run over an nf4 base of `sequence` tokens.
step_options nf4_run(run_mode mode, std::uint64_t sequence) {
  step_options o;
  o.mode = mode;
  o.weights = number_format::nf4;
  o.sequence = sequence;
  return o;
}
}  // namespace

TEST_CASE("a 4-bit base under bitsandbytes before 0.43.2: each product's input kept until the next loss") {
  const transformer_model m = *find_preset("llama-2-7b");
  step_options o = nf4_run(run_mode::lora, 256);
  o.flash_attention = true;
  o.steps = 1;
  const std::uint64_t t = o.sequence, a = 2 * t * m.hidden;
  const std::uint64_t per_layer = 3 * a + 2 * t * m.ffn;  // q/k/v's, o's, the MLP's first and last inputs
  const auto activations = [&](const step_options& run) {
    const step_trace s = generate_step(m, run);
    check_balanced(s);
    return peak_by_category(s).own_peak[3];
  };
  const std::uint64_t plain = activations(o);
  o.four_bit.keeps_input = true;
  // Layer 0's first input needs no gradient (the embedding and its norm are frozen).
  CHECK(activations(o) == plain + m.layers * per_layer - a);
  o.four_bit.head = true;  // the head's input too
  CHECK(activations(o) == plain + m.layers * per_layer);
  // Two steps: the first step's kept inputs live through the second's forward.
  o.steps = 2;
  CHECK(activations(o) == plain + 2 * m.layers * per_layer);
  // Checkpointing is not modelled with kept inputs.
  o.checkpoint_every = 1;
  step_options none = o;
  none.four_bit.keeps_input = false;
  CHECK(activations(o) == activations(none));
}

TEST_CASE("a 4-bit head, and dequantization from fp16: the head's packed bytes, two copies at a cast") {
  const transformer_model m = *find_preset("llama-2-7b");
  step_options o = nf4_run(run_mode::inference, 60);
  o.decode_steps = 50;
  const auto peak = [&](const step_options& run) { return peak_by_category(generate_step(m, run)); };
  const category_peak bf16_head = peak(o);
  o.four_bit.head = true;
  const category_peak packed = peak(o);
  const std::uint64_t head = m.vocab * m.hidden;
  CHECK(bf16_head.own_peak[0] - packed.own_peak[0] == 2 * head - stored_bytes(number_format::nf4, head, m.vocab, false));
  CHECK(packed.own_peak[4] >= 2 * head);  // the prefill's product with the head: its bf16 copy
  o.four_bit.from_fp16 = true;
  CHECK(peak(o).own_peak[4] >= 4 * head);  // an fp16 copy and its bf16 cast
  o.sequence = o.decode_steps = 1;  // one token: gemv_4bit, no copy of the head
  CHECK(peak(o).own_peak[4] < 2 * head);
}

TEST_CASE("bitsandbytes' PagedAdamW keeps the states of large tensors off the device") {
  const transformer_model m = *find_preset("llama-2-7b");
  step_options o;
  o.mode = run_mode::lora;
  o.lora_rank = 32;  // A: 32 x 4096 = 131,072 elements (paged); B: 4096 x 32 too
  o.sequence = 64;
  o.optimizer = optimizer_kind::paged_adamw;
  CHECK(peak_by_category(generate_step(m, o)).own_peak[2] == 0);
  o.lora_rank = 8;  // 32,768 elements: under 100,000, fp32 moments on the device
  CHECK(peak_by_category(generate_step(m, o)).own_peak[2] == 2 * 4 * m.layers * 4 * (2 * 8 * m.hidden));
}

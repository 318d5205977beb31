// The vram-fit executable, run as a user would: the 7B-on-24-GB case, GPT-2 on common cards,
// its bisection checked against itself one batch further and against the generator and the
// allocators replayed here at the capacity the answer leaves them, JSON output, bad input, and
// sharded training across GPUs.

#include <catch2/catch.hpp>

#include "support/run_tool.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <vram-replay/lineup.hpp>
#include <vram/trace/detail/json.hpp>
#include <vram/trace/model.hpp>
#include <vram/trace/step.hpp>

#ifndef VRAM_FIT_EXE
#error "VRAM_FIT_EXE: tools/CMakeLists.txt defines it wherever vram-fit is built"
#endif

namespace {

using vram::test::run_result;

/// Runs vram-fit with `args`, capturing stdout and stderr.
run_result run(const std::string& args) { return vram::test::run_tool(VRAM_FIT_EXE, args); }

std::string scratch(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("vram_fit_" + std::to_string(::getpid()) + "_" + name)).string();
}

/// Runs vram-fit with `args` and --json, and returns the parsed answer.
vram::detail::trace::json_value answer(const std::string& args) {
  const std::string path = scratch("answer.json");
  run_result r = run(args + " --json '" + path + "'");
  INFO(r.out);
  REQUIRE(r.status == 0);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  const std::string json = text.str();  // the reader views it
  vram::detail::trace::json_reader reader(json, path);
  return reader.parse_value();
}

const vram::detail::trace::json_value& field(const vram::detail::trace::json_value& v, const char* key) {
  const auto* f = v.find(key);
  INFO("no field " << key);
  REQUIRE(f != nullptr);
  return *f;
}

}  // namespace

TEST_CASE("vram-fit: full fine-tuning of a 7B model in bf16 cannot fit 24 GB, and it says what can") {
  auto a = answer("--preset llama-2-7b --batch 1 --sequence 2048 --gpu 24 --no-search");
  CHECK(field(a, "parameters").as_int() == 6'738'415'616);
  const auto& card = field(a, "cards").array.at(0);
  const std::string verdict = field(card, "verdict").string;
  INFO(verdict);
  CHECK(verdict.find("full training cannot fit") != std::string::npos);
  CHECK(verdict.find("25.10") != std::string::npos);  // weights 12.55 + gradients 12.55 GiB
  for (const auto& alloc : field(card, "allocators").array) CHECK_FALSE(field(alloc, "fits").boolean);
  const auto& combination = field(card, "combination");
  CHECK(field(combination, "fits").boolean);
  bool frozen = false;
  for (const auto& name : field(combination, "applied").array) frozen |= name.string.find("LoRA") != std::string::npos;
  CHECK(frozen);  // the only kind of fix that can work
}

TEST_CASE("vram-fit: GPT-2 fits common cards, with the largest batch the bisection finds") {
  for (const char* preset : {"gpt2", "gpt2-medium"}) {
    auto a = answer(std::string("--preset ") + preset + " --batch 4 --sequence 1024 --gpu 24,80");
    const auto& cards = field(a, "cards").array;
    REQUIRE(cards.size() == 2);
    for (const auto& card : cards) {
      const std::string capacity = std::to_string(double(field(card, "capacity").as_int()) / double(1 << 30));
      const auto& pool = field(card, "allocators").array.at(0);
      CHECK(field(pool, "allocator").string == "pool-contiguous");
      CHECK(field(pool, "fits").boolean);
      const std::int64_t largest = field(pool, "largest_batch").as_int();
      REQUIRE(largest >= 4);
      // The bisection's answer, checked by running vram-fit at it and one beyond it.
      auto at = answer(std::string("--preset ") + preset + " --sequence 1024 --no-search --gpu " + capacity +
                       " --batch " + std::to_string(largest));
      CHECK(field(field(field(at, "cards").array.at(0), "allocators").array.at(0), "fits").boolean);
      auto beyond = answer(std::string("--preset ") + preset + " --sequence 1024 --no-search --gpu " + capacity +
                           " --batch " + std::to_string(largest + 1));
      CHECK_FALSE(field(field(field(beyond, "cards").array.at(0), "allocators").array.at(0), "fits").boolean);
    }
  }
}

TEST_CASE("vram-fit: what each card keeps outside the allocator is stated, and the allocator has the rest") {
  const auto a = answer("--preset gpt2 --gpu 24 --no-search");
  const auto& kept = field(a, "outside_allocator");
  CHECK(field(kept, "bytes").as_int() == std::int64_t{512} << 20);  // the CUDA context and cuBLAS
  CHECK(field(kept, "communicators").as_int() == 0);
  CHECK(field(kept, "source").string == "default");
  const auto& card = field(a, "cards").array.at(0);
  CHECK(field(card, "usable").as_int() == field(card, "capacity").as_int() - field(kept, "bytes").as_int());
  CHECK(field(field(a, "margin"), "outside_allocator").as_int() == field(kept, "bytes").as_int());
  CHECK(field(field(a, "margin"), "fragmentation_replayed").boolean);
  CHECK_FALSE(field(field(a, "margin"), "not_modelled").array.empty());
  // --context-gib gives the whole of it; 0 keeps nothing off the card.
  const auto asked = answer("--preset gpt2 --gpu 24 --no-search --context-gib 2.25");
  CHECK(field(field(asked, "outside_allocator"), "bytes").as_int() == std::int64_t{9} << 28);
  CHECK(field(field(asked, "outside_allocator"), "source").string == "--context-gib");
  const auto none = answer("--preset gpt2 --gpu 24 --no-search --context-gib 0");
  CHECK(field(field(none, "cards").array.at(0), "usable").as_int() == std::int64_t{24} << 30);
  // Sharded: one NCCL communicator more per process group of degree above 1.
  const auto sharded = answer("--preset gpt2 --gpu 24 --no-search --gpus 8 --tp 2 --zero 1");
  CHECK(field(field(sharded, "outside_allocator"), "communicators").as_int() == 2);  // data parallel 4, tensor 2
  CHECK(field(field(sharded, "outside_allocator"), "bytes").as_int() == (std::int64_t{512} + 2 * 768) << 20);
  // The text states it in the header and on each card.
  const run_result r = run("--preset gpt2 --gpu 24 --no-search");
  INFO(r.out);
  CHECK(r.out.find("outside the allocator, on each card: 0.50 GiB") != std::string::npos);
  CHECK(r.out.find("24 GiB card\n  for the allocator 23.50 GiB, outside it 0.50 GiB\n") != std::string::npos);
  // A card the constant fills is refused, naming the flag.
  const run_result full = run("--preset gpt2 --gpu 2 --context-gib 2 --no-search");
  INFO(full.out);
  CHECK(full.status == 2);
  CHECK(full.out.starts_with("vram-fit: bad --context-gib '2': "));
}

TEST_CASE("vram-fit: the largest batch and sequence replay without a refusal at the capacity the answer leaves the "
          "allocator, and one more does not") {
  using namespace vram::trace;
  struct fit_case {
    const char* args;
    const char* preset;
    run_mode mode;
    std::uint64_t batch, sequence;
  };
  const auto allocators = vram_replay::all_allocators();  // vram-fit's lineup is among them
  for (const fit_case& c : {fit_case{"--preset gpt2-medium --batch 8 --gpu 24,80", "gpt2-medium", run_mode::training, 8, 1024},
                            fit_case{"--preset llama-2-7b --mode lora --gpu 24,48,80", "llama-2-7b", run_mode::lora, 1, 1024},
                            fit_case{"--preset llama-2-7b --mode lora --gpu 24 --context-gib 3", "llama-2-7b",
                                     run_mode::lora, 1, 1024},
                            fit_case{"--preset bert-base-uncased --batch 64 --sequence 512 --gpu 24", "bert-base-uncased",
                                     run_mode::training, 64, 512}}) {
    INFO(c.args);
    const auto a = answer(c.args);
    const transformer_model model = *find_preset(c.preset);
    step_options asked;  // the run the flags ask for
    asked.mode = c.mode;
    asked.batch = c.batch;
    asked.sequence = c.sequence;
    // Whether `o` replays on `allocator` without a refusal at `capacity`, as generated here.
    auto replays = [&](const step_options& o, const std::string& allocator, std::size_t capacity) {
      vram::trace::replay_options ro;
      ro.capacity = capacity;
      ro.time_operations = false;
      ro.series_points = 2;
      const step_trace t = generate_step(model, o);
      for (const auto& config : allocators)
        if (config.name == allocator) {
          const replay_result r = config.run(t.t, ro);
          return r.ooms == 0 && r.error.empty();
        }
      FAIL("no allocator " << allocator);
      return false;
    };
    int checked = 0;
    for (const auto& card : field(a, "cards").array) {
      const auto usable = std::size_t(field(card, "usable").as_int());
      CHECK(usable == std::size_t(field(card, "capacity").as_int() - field(field(a, "outside_allocator"), "bytes").as_int()));
      for (const auto& alloc : field(card, "allocators").array) {
        const std::string name = field(alloc, "allocator").string;
        INFO(usable << " bytes for " << name);
        for (auto [key, member] : {std::pair{"largest_batch", &step_options::batch},
                                   std::pair{"largest_sequence", &step_options::sequence}}) {
          const std::uint64_t largest = std::uint64_t(field(alloc, key).as_int());
          INFO(key << " " << largest);
          step_options at = asked, beyond = asked;
          at.*member = largest;
          beyond.*member = largest + 1;
          if (largest != 0) CHECK(replays(at, name, usable));
          if (key == std::string("largest_sequence") && model.positions != 0 && largest == model.positions) continue;
          CHECK_FALSE(replays(beyond, name, usable));
          ++checked;
        }
      }
    }
    CHECK(checked > 0);
  }
}

TEST_CASE("vram-fit: a Hugging Face config.json is a model") {
  const std::string path = scratch("config.json");
  std::ofstream config(path);
  config << R"({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
    "vocab_size": 32000, "tie_word_embeddings": false, "max_position_embeddings": 4096})";
  config.close();
  auto a = answer("--model '" + path + "' --mode inference --batch 2 --gpu 24 --no-search");
  CHECK(field(a, "parameters").as_int() == 6'738'415'616);  // Llama-2-7B's shape
  CHECK(field(a, "experts").as_int() == 1);

  config.open(path);  // Mixtral's: experts
  config << R"({"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 32000, "tie_word_embeddings": false, "max_position_embeddings": 32768,
    "num_local_experts": 8, "num_experts_per_tok": 2})";
  config.close();
  a = answer("--model '" + path + "' --mode inference --batch 2 --sequence 512 --gpu 141 --no-search");
  CHECK(field(a, "parameters").as_int() == 46'702'792'704);
  CHECK(field(a, "experts").as_int() == 8);
  CHECK(field(a, "experts_per_token").as_int() == 2);

  config.open(path);  // BERT's: an encoder, with learned positions and token types
  config << R"({"model_type": "bert", "num_hidden_layers": 12, "hidden_size": 768,
    "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
    "max_position_embeddings": 512, "type_vocab_size": 2})";
  config.close();
  a = answer("--model '" + path + "' --mode forward --sequence 512 --gpu 24 --no-search");
  CHECK(field(a, "parameters").as_int() == vram::trace::find_preset("bert-base-uncased")->parameters());
  CHECK(field(a, "encoder").boolean);

  config.open(path);  // Qwen-MoE's narrower and shared experts: a shape not modelled, refused
  config << R"({"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048,
    "num_attention_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "vocab_size": 151936, "num_experts": 60, "num_experts_per_tok": 4})";
  config.close();
  run_result r = run("--model '" + path + "' --gpu 24");
  std::filesystem::remove(path);
  CHECK(r.status == 1);
  CHECK(r.out.find("moe_intermediate_size") != std::string::npos);
}

TEST_CASE("vram-fit: the answer quotes the measured runs of the kind asked, each predicted again, or says there are none") {
  auto a = answer("--preset llama-2-7b --mode lora --gpu 24 --no-search");
  const auto& lora = field(a, "measured_runs").array;
  CHECK(lora.size() == 4);  // litgpt's LoRA rows over a 16-bit base
  for (const auto& r : lora) {
    const auto& peak = field(r, "peak_allocated");
    INFO(field(r, "run").string);
    const double predicted = double(field(peak, "predicted").as_int()), measured = double(field(peak, "measured").as_int());
    CHECK(std::abs(field(peak, "error").number - (predicted - measured) / measured) < 1e-5);  // six digits
    CHECK(std::abs(field(peak, "error").number) <= 0.05);
    CHECK(r.find("reserved") == nullptr);  // litgpt publishes allocated bytes only
  }
  // optimum-benchmark's GPT-2 run gives what PyTorch reserved too: replayed on its allocator.
  a = answer("--preset gpt2 --weights fp32 --no-autocast --batch 2 --sequence 16 --gpu 24 --no-search");
  const auto& gpt2 = field(a, "measured_runs").array;
  REQUIRE(gpt2.size() == 1);
  CHECK(field(field(gpt2[0], "reserved"), "allocator").string == "torch-caching-model");
  CHECK(field(field(gpt2[0], "reserved"), "measured").as_int() == 2'894'100'000);

  for (const char* none : {"--preset mixtral-8x7b --mode forward --sequence 64", "--preset llama-2-7b --mode forward"}) {
    INFO(none);
    CHECK(field(answer(std::string(none) + " --gpu 141 --no-search"), "measured_runs").array.empty());
    CHECK(run(std::string(none) + " --gpu 141 --no-search").out.find("measured runs of this kind: none") != std::string::npos);
  }
}

TEST_CASE("vram-fit: bad input is refused with exit 2, naming the field") {
  struct bad {
    const char* args;
    const char* named;
  };
  for (const bad& b : {bad{"--preset gpt2 --heads 7", "heads"}, bad{"--preset nope", "nope"},
                       bad{"--layers 0 --hidden 64 --heads 4 --ffn 256 --vocab 100", "layers"},
                       bad{"--preset gpt2 --hidden 99999999999", "hidden"}, bad{"--preset gpt2 --batch -3", "--batch"},
                       bad{"--preset gpt2 --weights int4", "weights"}, bad{"--preset gpt2 --sequence 4096", "sequence"},
                       bad{"--preset gpt2 --frobnicate", "frobnicate"}, bad{"--preset gpt2 --gpu 0", "--gpu"},
                       bad{"--preset gpt2 --mode serving", "--mode"}, bad{"", "no model"},
                       bad{"--preset gpt2 --experts 4 --experts-per-token 5", "--experts-per-token (5) must be 1 to --experts (4)"},
                       bad{"--preset gpt2 --experts 0", "--experts must"},
                       bad{"--preset bert-base-uncased --mode inference --sequence 128", "no inference mode"}}) {
    run_result r = run(b.args);
    INFO(b.args << "\n" << r.out);
    CHECK(r.status == 2);
    CHECK(r.out.find(b.named) != std::string::npos);
  }
}

TEST_CASE("vram-fit: the page's bars and the text agree, per card and allocator") {
  // 24 GiB: each allocator fits, rmm-pool-model by 0.06 GiB while it needs 31.25 unbounded;
  // 16 GiB: some do not. The text says fits / OOM and the headroom; the page draws each
  // allocator's bar from x=170 at a scale the card line gives.
  const std::string html = scratch("agree.html");
  run_result r = run("--preset llama-2-7b --mode lora --gpu 16,24 --no-search --html '" + html + "'");
  INFO(r.out);
  REQUIRE(r.status == 0);
  std::ifstream in(html);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(html);
  const std::string page = text.str();
  auto number_after = [](const std::string& s, std::size_t at, const std::string& key) {
    at = s.find(key, at);
    REQUIRE(at != std::string::npos);
    return std::stod(s.substr(at + key.size()));
  };
  int fitting = 0, refused = 0;
  for (double card : {16.0, 24.0}) {
    std::ostringstream title;
    title << card << " GiB card";
    const std::size_t t0 = r.out.find("\n" + title.str() + "\n"), h0 = page.find("<h2>" + title.str() + "</h2>");
    REQUIRE(t0 != std::string::npos);
    REQUIRE(h0 != std::string::npos);
    const std::size_t t1 = r.out.find("remedies, each alone", t0), h1 = page.find("</svg>", h0);
    const double card_x = number_after(page, h0, "<line x1=\"");
    for (const char* allocator : {"pool-contiguous", "pool-segments", "upstream", "rmm-pool-model"}) {
      INFO(card << " GiB, " << allocator);
      // The text's row: "  NAME  yes  HEADROOM" or "  NAME  OOM  -".
      const std::size_t row = r.out.find(std::string("  ") + allocator + " ", t0);
      REQUIRE(row < t1);
      std::istringstream cells(r.out.substr(row, r.out.find('\n', row) - row));
      std::string name, fits, headroom;
      cells >> name >> fits >> headroom;
      // The page's bar: its label, then rects until the next label or the card line.
      const std::size_t label = page.find(std::string(">") + allocator, h0);
      REQUIRE(label < h1);
      const bool page_oom = page.compare(label + 1 + std::string(allocator).size(), 6, " (OOM)") == 0;
      std::size_t next = std::min(page.find("<text x=\"0\"", label + 1), page.find("<line", label));
      double end = 170;
      for (std::size_t at = page.find("<rect x=\"", label); at < next; at = page.find("<rect x=\"", at + 1))
        end = std::max(end, number_after(page, at, "<rect x=\"") + number_after(page, at, "width=\""));
      const double drawn_gib = (end - 170) / (card_x - 170) * card;
      CHECK((fits == "yes") != page_oom);
      if (fits == "yes") {
        ++fitting;
        CHECK(end <= card_x + 1e-3);  // inside the card line
        CHECK(std::abs(card - drawn_gib - std::stod(headroom)) < 0.006);
      } else {
        ++refused;
        CHECK(fits == "OOM");
        CHECK(end > card_x);  // past it
      }
    }
  }
  CHECK(fitting > 0);
  CHECK(refused > 0);
}

// Sharded training (docs/fit.md, "Sharded training"): the model state of a rank exactly as the
// ZeRO and FSDP rules give it for a known parameter count, Megatron's tensor-parallel share
// counted from the shapes, a 1F1B stage holding its micro-batches in flight, the smallest
// number of GPUs checked against one step fewer, and contradictory flags.

namespace {

using vram::detail::trace::json_value;

std::uint64_t count(const json_value& v, const char* key) { return std::uint64_t(field(v, key).as_int()); }

/// Whether the first allocator fits the first card.
bool first_fits(const json_value& a) {
  return field(field(field(a, "cards").array.at(0), "allocators").array.at(0), "fits").boolean;
}

constexpr std::uint64_t llama_70b = 68'976'648'192, gpt2_small = 124'439'808;


}  // namespace

TEST_CASE("vram-fit: a rank's model state is the ZeRO paper's, byte for byte (mixed-precision Adam, K = 12)") {
  struct preset {
    const char* name;
    std::uint64_t psi;
  };
  for (const preset& p : {preset{"gpt2", gpt2_small}, preset{"llama-2-70b", llama_70b}})
    for (std::uint64_t n : {1, 3, 8, 64})
      for (int stage : {1, 2, 3}) {
        const std::string args = std::string("--preset ") + p.name + " --sequence 128 --flash --checkpoint every --gpu 80 "
                                 "--no-search --gpus " + std::to_string(n) + " --zero " + std::to_string(stage);
        INFO(args);
        const json_value a = answer(args);
        const json_value& s = field(a, "sharding");
        CHECK(count(a, "parameters") == p.psi);
        CHECK(count(s, "rank_parameters") == p.psi);
        CHECK(count(s, "shards") == n);
        const std::uint64_t part = (p.psi + n - 1) / n;  // a rank's partition: ceil(Psi / N)
        const json_value& ms = field(s, "model_states");
        // ZeRO-1: 2Psi + 2Psi + K Psi/N; ZeRO-2: 2Psi + (2 + K) Psi/N; ZeRO-3: (2 + 2 + K) Psi/N.
        CHECK(count(ms, "weights") == (stage == 3 ? 2 * part : 2 * p.psi));
        CHECK(count(ms, "gradients") == (stage >= 2 ? 2 * part : 2 * p.psi));
        CHECK(count(ms, "optimizer") == 12 * part);
        // The generated step holds exactly that optimizer state at its peak (fp32 master, m, v).
        CHECK(count(field(a, "peak_by_category"), "optimizer") == 12 * part);
      }
}

TEST_CASE("vram-fit: FSDP's sharded state is fp32 under MixedPrecision; pure bf16 halves it") {
  const std::uint64_t part = llama_70b / 8;
  for (const char* strategy : {"full", "grad-op"}) {
    const json_value a = answer(std::string("--preset llama-2-70b --sequence 128 --flash --checkpoint every --gpu 80 "
                                            "--no-search --gpus 8 --fsdp ") + strategy);
    const json_value& ms = field(field(a, "sharding"), "model_states");
    CHECK(count(ms, "weights") == 4 * part);  // the sharded fp32 parameter is the master copy
    CHECK(count(ms, "gradients") == 4 * part);
    CHECK(count(ms, "optimizer") == 8 * part);
    CHECK(count(field(a, "peak_by_category"), "optimizer") == 8 * part);
  }
  const json_value pure = answer("--preset llama-2-70b --sequence 128 --flash --checkpoint every --gpu 80 --no-search "
                                 "--gpus 8 --fsdp full --no-master-weights");
  const json_value& ms = field(field(pure, "sharding"), "model_states");
  CHECK(count(ms, "total") == (2 + 2 + 4) * part);
}

namespace {

/// The generator's own peak of `c` for one rank of llama-2-70b (sequence 128, flash,
/// checkpointing every layer) under `plan`.
std::uint64_t own_peak(const vram::trace::parallel_plan& plan, vram::trace::category c) {
  using namespace vram::trace;
  step_options o;
  o.sequence = 128;
  o.flash_attention = true;
  o.checkpoint_every = 1;
  o.parallel = plan;
  return peak_by_category(generate_step(*find_preset("llama-2-70b"), o)).own_peak[std::size_t(c)];
}

}  // namespace

TEST_CASE("generator: sharded parameters are gathered around their use, whole for shard-grad-op") {
  using namespace vram::trace;
  const transformer_model m = *find_preset("llama-2-70b");
  const std::uint64_t part = llama_70b / 8;
  // The root unit (embedding, final norm, head) is gathered for the whole pass, in bf16.
  const std::uint64_t root = 2 * (2 * m.vocab * m.hidden + m.hidden), layer = 2 * m.layer_parameters();
  parallel_plan fsdp;
  fsdp.sharding = shard_kind::fsdp;
  fsdp.stage_of_zero = 3;
  fsdp.shards = 8;
  fsdp.master_weights = true;
  CHECK(own_peak(fsdp, category::weights) == 4 * part + root + layer);  // one layer at a time
  parallel_plan grad_op = fsdp;
  grad_op.stage_of_zero = 2;
  CHECK(own_peak(grad_op, category::weights) == 4 * part + 2 * llama_70b);  // every layer, to its backward
  // Offloaded parameters: only what is gathered; DeepSpeed's estimate for this case is 4 x the
  // largest layer (its gathered bf16 weights and their whole gradient).
  parallel_plan offloaded = fsdp;
  offloaded.sharding = shard_kind::zero;
  offloaded.offload = offload_kind::params;
  CHECK(own_peak(offloaded, category::weights) == root + layer);
  CHECK(own_peak(offloaded, category::gradients) == layer);
  CHECK(own_peak(offloaded, category::optimizer) == 0);
}

TEST_CASE("vram-fit: offloading leaves the device only what is computed with") {
  const json_value params = answer("--preset llama-2-70b --sequence 128 --flash --checkpoint every --gpu 80 --no-search "
                                   "--gpus 8 --zero 3 --offload params");
  CHECK(count(field(field(params, "sharding"), "model_states"), "total") == 0);
  CHECK(count(field(params, "peak_by_category"), "optimizer") == 0);
  const json_value optimizer = answer("--preset llama-2-70b --sequence 128 --flash --checkpoint every --gpu 80 "
                                      "--no-search --gpus 8 --zero 3 --offload optimizer");
  const json_value& ms = field(field(optimizer, "sharding"), "model_states");
  CHECK(count(ms, "weights") == 2 * (llama_70b / 8));  // DeepSpeed's estimate: 2 Psi / N (and the gathered layer)
  CHECK(count(ms, "gradients") + count(ms, "optimizer") == 0);
}

TEST_CASE("vram-fit: Megatron's tensor-parallel share, counted from the shapes") {
  const vram::trace::transformer_model m = *vram::trace::find_preset("llama-2-70b");
  const std::uint64_t tp = 8, h = m.hidden, kv = m.kv_heads * (h / m.heads), f = m.ffn;
  // Per layer: two norms whole; q and o (h x h), k and v (h x kv), the MLP's three (h x f) split.
  const std::uint64_t layer = 2 * h + (2 * h * h + 2 * h * kv + 3 * h * f) / tp;
  const std::uint64_t share = m.layers * layer + 2 * (m.vocab / tp) * h + h;  // embedding, head; the final norm
  const json_value a = answer("--preset llama-2-70b --sequence 128 --gpu 80 --no-search --gpus 8 --tp 8");
  CHECK(count(field(a, "sharding"), "rank_parameters") == share);
  CHECK(count(field(a, "peak_by_category"), "weights") == 2 * share);  // bf16, replicated state: nothing else split
  CHECK(count(field(a, "sharding"), "data_parallel") == 1);
}

TEST_CASE("generator: a 1F1B pipeline stage holds the activations of its micro-batches in flight") {
  using namespace vram::trace;
  const transformer_model m = *find_preset("llama-2-7b");
  step_options o;
  o.batch = 8;
  o.sequence = 512;
  o.flash_attention = true;
  o.parallel.pipeline = 4;
  auto activations = [&](std::uint64_t micro_batch, std::uint64_t stage) {
    step_options s = o;
    s.micro_batch = micro_batch;
    s.parallel.stage = stage;
    return peak_by_category(generate_step(m, s)).own_peak[std::size_t(category::activations)];
  };
  // One micro-batch of 1: one in flight. Eight micro-batches of 1: stage s holds 4 - s (the
  // last stage, which also makes the logits, one).
  for (std::uint64_t stage = 0; stage < 4; ++stage) {
    INFO("stage " << stage);
    step_options one = o;
    one.batch = 1;
    one.parallel.stage = stage;
    const std::uint64_t single = peak_by_category(generate_step(m, one)).own_peak[std::size_t(category::activations)];
    CHECK(activations(1, stage) == (4 - stage) * single);
  }
  // Stage 0 holds the embedding, the last the final norm and the head; 8 layers each.
  parallel_plan first, last;
  first.pipeline = last.pipeline = 4;
  last.stage = 3;
  CHECK(rank_parameters(m, first) == 8 * m.layer_parameters() + m.vocab * m.hidden);
  CHECK(rank_parameters(m, last) == 8 * m.layer_parameters() + m.hidden + m.vocab * m.hidden);
}

TEST_CASE("vram-fit: the smallest number of GPUs fits, and one step fewer does not") {
  struct strategy {
    const char* run;
    std::uint64_t step;  // the GPUs of one model replica: tp x pp
  };
  for (const strategy& s :
       {strategy{"--preset llama-2-70b --gpu 80 --zero 3", 1}, strategy{"--preset llama-2-70b --gpu 80 --fsdp full", 1},
        strategy{"--preset llama-2-7b --gpu 24 --zero 2", 1}, strategy{"--preset llama-2-7b --gpu 40 --zero 1", 1},
        strategy{"--preset llama-2-70b --gpu 16 --zero 1 --tp 8 --pp 4 --micro-batches 8 --batch 8", 32}}) {
    const std::string run = std::string(s.run) + " --sequence 2048 --flash --checkpoint every --no-search";
    INFO(run);
    const json_value a = answer(run + " --gpus " + std::to_string(s.step));
    const json_value& smallest = field(field(a, "sharding"), "smallest_gpus").array.at(0);
    REQUIRE(smallest.find("gpus")->is_number());
    const std::uint64_t n = count(smallest, "gpus");
    INFO("smallest " << n);
    CHECK(n % s.step == 0);
    CHECK(n > s.step);  // the search had something to do
    CHECK(first_fits(answer(run + " --gpus " + std::to_string(n))));
    CHECK_FALSE(first_fits(answer(run + " --gpus " + std::to_string(n - s.step))));
  }
  // Replicated state and hybrid FSDP do not shrink with more ranks: none fits when one replica
  // (one node) does not.
  const json_value ddp = answer("--preset llama-2-13b --sequence 2048 --flash --gpu 80 --no-search --gpus 64");
  CHECK(field(field(field(ddp, "sharding"), "smallest_gpus").array.at(0), "gpus").type == json_value::kind::null);
}

TEST_CASE("vram-fit: sharded runs answer for ZeRO, FSDP, tensor and pipeline parallelism") {
  for (const char* flags : {"--gpus 8 --zero 3", "--gpus 8 --fsdp full", "--gpus 16 --fsdp hybrid --node-gpus 8",
                            "--gpus 8 --fsdp grad-op", "--gpus 8 --tp 8", "--gpus 32 --tp 8 --pp 4 --micro-batches 8 --batch 8",
                            "--gpus 8 --zero 3 --offload params"}) {
    run_result r = run(std::string("--preset llama-2-70b --flash --checkpoint every --gpu 80 --no-search ") + flags);
    INFO(flags << "\n" << r.out);
    CHECK(r.status == 0);
    CHECK(r.out.find("per rank of ") != std::string::npos);
    CHECK(r.out.find("smallest number of GPUs that fits") != std::string::npos);
  }
}

TEST_CASE("vram-fit: contradictory sharding flags are refused with exit 2, naming the flag") {
  struct bad {
    const char* args;
    const char* named;
  };
  for (const bad& b : {bad{"--zero 3 --fsdp full", "--zero and --fsdp"}, bad{"--gpus 6 --tp 4", "--gpus (6)"},
                       bad{"--fsdp hybrid", "--node-gpus"}, bad{"--fsdp full --node-gpus 8", "--node-gpus"},
                       bad{"--gpus 12 --fsdp hybrid --node-gpus 8", "--node-gpus (8)"},
                       bad{"--pp 2 --zero 3", "--zero 3 with --pp"}, bad{"--pp 2 --fsdp full", "--fsdp with --pp"},
                       bad{"--zero 2 --offload params", "--offload params"},
                       bad{"--fsdp full --offload optimizer", "--offload optimizer"},
                       bad{"--gpus 8 --offload optimizer", "--offload"}, bad{"--zero 4", "--zero"},
                       bad{"--fsdp half", "--fsdp"}, bad{"--tp 3", "--tp (3)"}, bad{"--pp 3", "--pp (3)"},
                       bad{"--gpus 8 --zero 3 --mode lora", "--mode lora"}, bad{"--no-master-weights", "--zero or --fsdp"},
                       bad{"--batch 4 --micro-batches 3", "--micro-batches (3)"},
                       bad{"--batch 4 --micro-batches 2 --micro-batch 2", "--micro-batch"}, bad{"--gpus 0", "--gpus"},
                       bad{"--tp", "--tp"}}) {
    run_result r = run(std::string("--preset llama-2-70b --gpu 80 ") + b.args);
    INFO(b.args << "\n" << r.out);
    CHECK(r.status == 2);
    CHECK(r.out.find(b.named) != std::string::npos);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);  // one line
  }
}

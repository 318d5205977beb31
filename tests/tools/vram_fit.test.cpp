// The vram-fit executable, run as a user would: the 7B-on-24-GB case, GPT-2 on common cards,
// its bisection checked against itself one batch further, JSON output, and bad input.

#include <catch2/catch.hpp>

#include "support/run_tool.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <vram/trace/detail/json.hpp>

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

TEST_CASE("vram-fit: a Hugging Face config.json is a model") {
  const std::string path = scratch("config.json");
  std::ofstream config(path);
  config << R"({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
    "vocab_size": 32000, "tie_word_embeddings": false, "max_position_embeddings": 4096})";
  config.close();
  auto a = answer("--model '" + path + "' --mode inference --batch 2 --gpu 24 --no-search");
  std::filesystem::remove(path);
  CHECK(field(a, "parameters").as_int() == 6'738'415'616);  // Llama-2-7B's shape
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
                       bad{"--preset gpt2 --mode serving", "--mode"}, bad{"", "no model"}}) {
    run_result r = run(b.args);
    INFO(b.args << "\n" << r.out);
    CHECK(r.status == 2);
    CHECK(r.out.find(b.named) != std::string::npos);
  }
}

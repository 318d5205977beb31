// The vram-fit executable, run as a user would: the 7B-on-24-GB case, GPT-2 on common cards,
// its bisection checked against itself one batch further, JSON output, and bad input.

#include <catch2/catch.hpp>

#include "support/run_tool.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
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

TEST_CASE("vram-fit: the page's bars and the text agree, per card and allocator") {
  // 24 GiB: each allocator fits, rmm-pool-model by 0.56 GiB while it needs 31.25 unbounded;
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

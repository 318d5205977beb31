// Every number-taking flag of vram-fit, vram-replay and vram-quota, run as a user would, fed
// the hostile values of support/hostile_values.hpp (argv carries no NUL): each is refused
// with exit status 2 and a first line "TOOL: bad FLAG 'TEXT': what it must be", the text as
// given, before anything is replayed or any ledger is touched.
#include <catch2/catch.hpp>

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <vram/core/parse.hpp>

#include "support/hostile_values.hpp"
#include "support/run_tool.hpp"

#if !defined(VRAM_FIT_EXE) || !defined(VRAM_REPLAY_EXE) || !defined(VRAM_QUOTA_EXE)
#error "VRAM_FIT_EXE, VRAM_REPLAY_EXE, VRAM_QUOTA_EXE: tools/CMakeLists.txt defines them wherever the tools are built"
#endif

namespace {

using vram::test::hostile_value;

/// `text` as one shell word.
std::string shell_word(std::string_view text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<hostile_value> with(std::initializer_list<std::span<const hostile_value>> lists,
                                std::initializer_list<const char*> more = {}) {
  std::vector<hostile_value> out;
  for (auto list : lists) out.insert(out.end(), list.begin(), list.end());
  for (const char* m : more) out.push_back({"out of range", m});
  return out;
}

/// Runs `exe` with `before`, `flag` and each value, then `after`: each must be refused.
void refuses(const char* tool, const char* exe, const std::string& before, const std::string& flag,
             const std::vector<hostile_value>& values, const std::string& after = "") {
  for (const hostile_value& v : values) {
    const std::string args = before + " " + flag + " " + shell_word(v.text) + " " + after;
    INFO(tool << " " << args << " (" << v.what << ")");
    const vram::test::run_result r = vram::test::run_tool(exe, args);
    INFO(r.out);
    CHECK(r.status == 2);
    const std::string first_line = r.out.substr(0, r.out.find('\n'));
    CHECK(first_line.starts_with(std::string(tool) + ": bad " + flag + " " + vram::quoted(v.text) + ": "));
  }
}

const std::vector<hostile_value> counts =
    with({vram::test::hostile_values, vram::test::huge_counts}, {"4294967296"});

}  // namespace

TEST_CASE("vram-fit: every count and capacity flag refuses every hostile value", "[tools][parse]") {
  for (const char* flag : {"--layers", "--hidden", "--heads", "--kv-heads", "--ffn", "--vocab", "--positions",
                           "--batch", "--sequence", "--micro-batch", "--lora-rank", "--decode-steps", "--checkpoint"})
    refuses("vram-fit", VRAM_FIT_EXE, "--preset gpt2 --no-search", flag, counts);
  std::vector<hostile_value> cards;  // a bare number is GiB: "1.5" is a card
  for (const hostile_value& v : with({vram::test::hostile_values, vram::test::hostile_sizes},
                                     {"0", "0G", "0.1", "24,", "24,,48", ",24", "24, 48"}))
    if (v.text != "1.5") cards.push_back(v);
  refuses("vram-fit", VRAM_FIT_EXE, "--preset gpt2 --no-search", "--gpu", cards);
}

TEST_CASE("vram-replay: --capacity and --steps refuse every hostile value", "[tools][parse]") {
  refuses("vram-replay", VRAM_REPLAY_EXE, "--no-timing", "--capacity",
          with({vram::test::hostile_values, vram::test::hostile_sizes}, {"0", "0K"}));
  refuses("vram-replay", VRAM_REPLAY_EXE, "--no-timing", "--steps", with({counts}, {"0", "1001"}));
}

TEST_CASE("vram-quota: --hard, --soft and --mode refuse every hostile value", "[tools][parse]") {
  const std::string ledger = "/nonexistent/vram-hostile-flags";  // refused before it is looked for
  for (const char* flag : {"--hard", "--soft"})
    refuses("vram-quota", VRAM_QUOTA_EXE, "set " + ledger + " job", flag,
            with({vram::test::hostile_values, vram::test::hostile_sizes}, {"None", "none "}));
  refuses("vram-quota", VRAM_QUOTA_EXE, "create " + ledger, "--mode",
          with({vram::test::hostile_values}, {"0778", "8", "1000", "07777", "00660"}));
}

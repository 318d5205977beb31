// Every number-taking flag of vram-fit, vram-replay and vram-quota, run as a user would, fed
// the hostile values of support/hostile_values.hpp (argv carries no NUL): each is refused
// with exit status 2 and a first line "TOOL: bad FLAG 'TEXT': what it must be", the text as
// given, before anything is replayed or any ledger is touched. And one table across the three
// tools for the rest of the convention (docs/errors.md, "Exit status of the tools"): a missing
// input, a directory (or a plain file) where a file (or a ledger) is named, an unknown flag, a
// flag without its value and a bad value each get their exit status and one line.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
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

TEST_CASE("vram-fit: every count, capacity and context flag refuses every hostile value", "[tools][parse]") {
  for (const char* flag : {"--layers", "--hidden", "--heads", "--kv-heads", "--ffn", "--vocab", "--positions",
                           "--batch", "--sequence", "--micro-batch", "--lora-rank", "--decode-steps", "--checkpoint"})
    refuses("vram-fit", VRAM_FIT_EXE, "--preset gpt2 --no-search", flag, counts);
  std::vector<hostile_value> cards;  // a bare number is GiB: "1.5" is a card
  for (const hostile_value& v : with({vram::test::hostile_values, vram::test::hostile_sizes},
                                     {"0", "0G", "0.1", "24,", "24,,48", ",24", "24, 48"}))
    if (v.text != "1.5") cards.push_back(v);
  refuses("vram-fit", VRAM_FIT_EXE, "--preset gpt2 --no-search", "--gpu", cards);
  refuses("vram-fit", VRAM_FIT_EXE, "--preset gpt2 --no-search", "--steps", with({counts}, {"0", "17"}));
  std::vector<hostile_value> versions;  // "1.5" is a version
  for (const hostile_value& v : with({vram::test::hostile_values}, {"1", "0.41.", "0..41", "0.41.1.2", "0.1000"}))
    if (v.text != "1.5") versions.push_back(v);
  refuses("vram-fit", VRAM_FIT_EXE, "--preset gpt2 --no-search", "--bitsandbytes", versions);
  std::vector<hostile_value> context;  // "1.5" is GiB outside the allocator
  for (const hostile_value& v : with({vram::test::hostile_values, vram::test::hostile_sizes},
                                     {"-0.5", "65", "64.5", "1.", "0.5.5", "0.1234567", "1G", "24", "30"}))
    if (v.text != "1.5") context.push_back(v);
  refuses("vram-fit", VRAM_FIT_EXE, "--preset gpt2 --no-search --gpu 24", "--context-gib", context);
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

TEST_CASE("the three tools: one exit status and one line for each kind of error", "[tools][parse]") {
  const std::filesystem::path scratch =
      std::filesystem::temp_directory_path() / ("vram_tool_errors_" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch / "a-directory");
  std::ofstream(scratch / "plain-file") << "not a ledger\n";
  const std::string dir = (scratch / "a-directory").string(), file = (scratch / "plain-file").string();
  const std::string missing = (scratch / "missing").string();
  struct row {
    const char* what;
    const char* exe;
    std::string args;
    int status;
    std::string line;  // the whole output; a trailing "..." makes it a prefix
  };
  const row rows[] = {
      {"missing file", VRAM_FIT_EXE, "--model '" + missing + ".json'", 1,
       "vram-fit: --model " + missing + ".json: no such file"},
      {"directory as file", VRAM_FIT_EXE, "--model '" + dir + "'", 1,
       "vram-fit: --model " + dir + ": is a directory, not a model file"},
      {"unknown flag", VRAM_FIT_EXE, "--preset gpt2 --frobnicate", 2,
       "vram-fit: unknown option '--frobnicate' (see vram-fit --help)"},
      {"missing value", VRAM_FIT_EXE, "--preset gpt2 --batch", 2, "vram-fit: --batch: needs a value (see vram-fit --help)"},
      {"bad value", VRAM_FIT_EXE, "--preset gpt2 --mode serving", 2,
       "vram-fit: --mode: training, lora, inference or forward, not 'serving' (see vram-fit --help)"},
      {"bad value: a run that cannot be", VRAM_FIT_EXE, "--preset gpt2 --batch 0", 2,
       "vram-fit: --batch must be 1 to 2^20 (is 0) (see vram-fit --help)"},
      {"missing file", VRAM_REPLAY_EXE, "'" + missing + ".pickle'", 1, "vram-replay: " + missing + ".pickle: no such file"},
      {"directory as file", VRAM_REPLAY_EXE, "'" + dir + "'", 1,
       "vram-replay: " + dir + ": is a directory, not a trace file"},
      {"unknown flag", VRAM_REPLAY_EXE, "--frobnicate", 2,
       "vram-replay: unknown option '--frobnicate' (see vram-replay --help)"},
      {"missing value", VRAM_REPLAY_EXE, "--capacity", 2, "vram-replay: --capacity: needs a value (see vram-replay --help)"},
      {"bad value", VRAM_REPLAY_EXE, "--device tpu", 2, "vram-replay: --device: sim or cuda, not 'tpu' (see vram-replay --help)"},
      {"missing file", VRAM_QUOTA_EXE, "list '" + missing + "'", 1, "vram-quota: vram: quota ledger " + missing + "..."},
      {"file as ledger", VRAM_QUOTA_EXE, "list '" + file + "'", 1, "vram-quota: vram: quota ledger " + file + "..."},
      {"unknown flag", VRAM_QUOTA_EXE, "list '" + missing + "' --frobnicate", 2,
       "vram-quota: list: unknown argument '--frobnicate' (see vram-quota --help)"},
      {"missing value", VRAM_QUOTA_EXE, "set '" + missing + "' job --hard", 2,
       "vram-quota: --hard: needs a value (see vram-quota --help)"},
      {"bad value", VRAM_QUOTA_EXE, "set '" + missing + "' job --hard five", 2, "vram-quota: bad --hard 'five': ..."},
      {"no command", VRAM_QUOTA_EXE, "", 2, "vram-quota: no command (see vram-quota --help)"},
  };
  for (const row& r : rows) {
    INFO(r.what << ": " << r.exe << " " << r.args);
    const vram::test::run_result got = vram::test::run_tool(r.exe, r.args);
    INFO(got.out);
    CHECK(got.status == r.status);
    REQUIRE(got.out.ends_with("\n"));
    const std::string line = got.out.substr(0, got.out.size() - 1);
    CHECK(line.find('\n') == std::string::npos);  // one line
    if (r.line.ends_with("...")) CHECK(line.starts_with(r.line.substr(0, r.line.size() - 3)));
    else CHECK(line == r.line);
    // A usage error points to --help; a file that cannot be used is not a usage error.
    CHECK(line.ends_with(" (see " + std::filesystem::path(r.exe).filename().string() + " --help)") == (r.status == 2));
  }
  std::filesystem::remove_all(scratch);
}

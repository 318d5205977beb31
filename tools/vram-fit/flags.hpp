#pragma once
// vram-fit's command line: the usage text, the flags' parsers (counts, capacities, formats),
// a model from a JSON file, and the request they make. A room of main.cpp, included by it alone.

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <vram-fit/remedies.hpp>
#include <vram/core/bytes.hpp>
#include <vram/core/parse.hpp>
#include <vram/trace/detail/json.hpp>
#include <vram/trace/model.hpp>
#include <vram/trace/step.hpp>

namespace {

using namespace vram::trace;
using vram_fit::remedy;
using vram_fit::remedies_for;

const char* usage =
    "usage: vram-fit [model] [run] [cards] [output]\n"
    "\n"
    "model (one of):\n"
    "  --preset NAME          gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-2-7b, llama-2-13b,\n"
    "                         llama-2-70b, llama-3-8b, mixtral-8x7b, bert-base-uncased,\n"
    "                         bert-large-uncased (--list-presets: their shapes and sources)\n"
    "  --model FILE.json      a Hugging Face config.json, or vram-fit's own keys (as the flags)\n"
    "  --layers N --hidden N --heads N [--kv-heads N] --ffn N --vocab N [--positions N]\n"
    "  [--mlp gelu|swiglu] [--biases yes|no] [--tied yes|no]\n"
    "  [--experts N --experts-per-token K]   a mixture of experts: N MLPs a layer, K per token\n"
    "  [--encoder yes|no]     a BERT-style encoder (no KV cache: --mode forward, not inference)\n"
    "                         (each shape flag also overrides a preset)\n"
    "run:\n"
    "  --mode training|lora|inference|forward   (default training: every weight trained;\n"
    "                                   forward: one pass under no_grad, no KV cache)\n"
    "  --batch N --sequence N           sequences per step (inference: concurrent sequences)\n"
    "  --micro-batch N                  gradient accumulation: sequences per forward/backward\n"
    "  --weights fp32|bf16|int8|int4|nf4|fp4|nf4-dq|fp4-dq   (quantized: a frozen base only;\n"
    "                                   -dq: bitsandbytes' double quantization of the scales)\n"
    "  --bitsandbytes VERSION           nf4/fp4: the version's rules (before 0.43.2: each product\n"
    "                                   keeps its input; before 0.43: quantized from fp16)\n"
    "  --quantizer transformers|fabric  nf4/fp4: who quantizes (fabric, as litgpt: the head too,\n"
    "                                   from fp16)\n"
    "  --no-autocast                    fp32 activations with fp32 weights\n"
    "  --optimizer adamw|adamw8bit|paged-adamw|sgd|none  [--no-foreach]   (foreach: PyTorch's\n"
    "                                   default; paged-adamw: bitsandbytes', its large states in\n"
    "                                   managed memory, off the device's count)\n"
    "  --checkpoint none|every|K        activation checkpointing: every layer, or every K layers\n"
    "  --flash                          attention that never materializes the scores\n"
    "  --lora-rank R  --kv-cache fp32|bf16|int8  --decode-steps N\n"
    "  --steps N                        optimizer steps generated, 1 to 16 (default 2)\n"
    "  --cublas-workspace hopper|pre-hopper|KIB   cuBLAS's workspace per handle, in PyTorch's\n"
    "                                   allocator (default hopper: 32 MiB; pre-hopper: 8 MiB + 128 KiB)\n"
    "sharded training, per rank (--batch is each data-parallel rank's; docs/fit.md):\n"
    "  --gpus N                         ranks in all (default tp x pp)\n"
    "  --zero 0|1|2|3                   DeepSpeed ZeRO: shard optimizer state, + gradients, + parameters\n"
    "  --fsdp full|grad-op|hybrid       PyTorch FSDP (hybrid: full shard in a node of --node-gpus G)\n"
    "  --tp N  --pp N                   Megatron tensor parallel degree; pipeline stages (1F1B)\n"
    "  --micro-batches M                micro-batches per step: the batch split in M\n"
    "  --offload optimizer|params       ZeRO-Offload's optimizer state; or the parameters too\n"
    "  --no-master-weights              with --zero or --fsdp: no fp32 master copy of bf16 weights\n"
    "cards:\n"
    "  --gpu GIB[,GIB...]               card capacities in GiB, or sizes with a unit (default 24,48,80,141)\n"
    "  --context-gib X                  GiB of each card outside the allocator (default 0.5: the CUDA\n"
    "                                   context and cuBLAS; + 0.75 per NCCL communicator when sharded)\n"
    "output:\n"
    "  --json FILE                      the answer as JSON\n"
    "  --html FILE                      a self-contained page: what fills each card, per allocator\n"
    "  --no-search                      skip the largest-batch and -sequence search\n"
    "\n"
    "exit status: 0 answered (whether or not it fits), 1 a file could not be read or written,\n"
    "2 a bad command line or a model or run that cannot be (the message names the flag)\n";

/// The command line is wrong: exit 2 (docs/errors.md, "Exit status of the tools").
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A file the command line names cannot be used (missing, a directory, unreadable, not a
/// model): exit 1.
struct input_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `what` of a model's or a run's validate() (`vram: transformer_model: layers must be ...`) in
/// the words of the command line: the flag for each field.
std::string as_asked(std::string what) {
  for (const char* prefix : {"vram: transformer_model: ", "vram: step_options: "})
    if (what.starts_with(prefix)) what.erase(0, std::string_view(prefix).size());
  static const std::pair<const char*, const char*> flags[] = {
      {"micro_batch", "--micro-batch"}, {"checkpoint_every", "--checkpoint"}, {"lora_rank", "--lora-rank"},
      {"kv_cache", "--kv-cache"},       {"kv_heads", "--kv-heads"},           {"batch", "--batch"},
      {"sequence", "--sequence"},       {"layers", "--layers"},               {"hidden", "--hidden"},
      {"heads", "--heads"},             {"ffn", "--ffn"},                     {"vocab", "--vocab"},
      {"positions", "--positions"},     {"weights", "--weights"},             {"tensor parallel degree", "--tp"},
      {"pipeline stages", "--pp"},      {"experts_per_token", "--experts-per-token"},
      {"experts", "--experts"}};
  for (const auto& [field, flag] : flags)  // longer names first: micro_batch before batch
    for (std::size_t at = 0; (at = what.find(field, at)) != std::string::npos;) {
      const std::size_t end = at + std::string_view(field).size();
      // the field as the subject or with its value after it, not a word of the prose
      const bool word = (at == 0 || what[at - 1] == ' ' || what[at - 1] == '(') &&
                        (at == 0 || what.compare(end, 2, " (") == 0 || what.compare(end, 5, " must") == 0);
      if (word) what.replace(at, end - at, flag), at += std::string_view(flag).size();
      else at = end;
    }
  return what;
}

/// A count (vram::parse_count): no dimension, batch or step count of a model comes near 2^32.
std::uint64_t parse_count(const std::string& flag, const std::string& text) {
  std::optional<std::uint64_t> v = vram::parse_count(text);
  if (!v || *v > UINT32_MAX) throw usage_error(vram::refusal(flag, text, "a whole decimal number, at most 4294967295"));
  return *v;
}

/// The capacities of `list` (--gpu): sizes (vram::parse_bytes) whose unit is GiB when none is
/// given, separated by commas.
std::vector<double> parse_cards_gib(const std::string& list) {
  std::vector<double> out;
  for (std::size_t at = 0;;) {  // each item between commas, empty ones included
    const std::size_t comma = list.find(',', at);
    const std::string item = list.substr(at, comma - at);
    const bool bare = !item.empty() && vram::detail::parse::is_digit(item.back());
    std::optional<std::size_t> bytes = vram::parse_bytes(bare ? item + "G" : item);
    if (!bytes || *bytes == 0)
      throw usage_error(vram::refusal("--gpu", list,
                                      vram::quoted(item) + " is not a capacity: GiB (24, 40.5) or a size with a unit "
                                                           "(512M, 80GiB), not 0; capacities are separated by commas"));
    out.push_back(double(*bytes) / double(std::uint64_t{1} << 30));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

/// The largest --context-gib taken: more than any CUDA context and its libraries need by far.
inline constexpr std::uint64_t most_context_gib = 64;

/// --context-gib's value: GiB as a decimal number (0.5, 2), 0 to most_context_gib.
std::uint64_t parse_context_gib(const std::string& flag, const std::string& text) {
  const std::string what = "GiB as a decimal number (0, 0.5, 2), at most " + std::to_string(most_context_gib);
  const std::size_t dot = text.find('.');
  const std::optional<std::uint64_t> whole = vram::parse_count(text.substr(0, dot));
  std::optional<std::uint64_t> fraction = std::uint64_t{0};
  std::uint64_t scale = 1;
  if (dot != std::string::npos) {
    const std::string digits = text.substr(dot + 1);
    fraction = digits.size() <= 6 ? vram::parse_count(digits) : std::nullopt;
    for (std::size_t i = 0; i < digits.size(); ++i) scale *= 10;
  }
  if (!whole || !fraction || *whole > most_context_gib || (*whole == most_context_gib && *fraction != 0))
    throw usage_error(vram::refusal(flag, text, what));
  const std::uint64_t gib = std::uint64_t{1} << 30;
  return *whole * gib + (*fraction * gib + scale / 2) / scale;  // to the nearest byte
}

bool parse_yes_no(const std::string& flag, const std::string& text) {
  if (text == "yes" || text == "true") return true;
  if (text == "no" || text == "false") return false;
  throw usage_error(flag + ": yes or no, not '" + text + "'");
}

/// A version (--bitsandbytes), MAJOR.MINOR or MAJOR.MINOR.PATCH, as one number for comparing:
/// 0.43.2 is 43'002.
std::uint64_t parse_version(const std::string& flag, const std::string& text) {
  std::uint64_t v = 0;
  int parts = 0;
  for (std::size_t at = 0; at <= text.size(); ++parts) {
    const std::size_t dot = std::min(text.find('.', at), text.size());
    const std::optional<std::uint64_t> n = vram::parse_count(text.substr(at, dot - at));
    if (!n || *n > 999 || parts == 3)
      throw usage_error(vram::refusal(flag, text, "a version: MAJOR.MINOR or MAJOR.MINOR.PATCH (0.41.1)"));
    v = v * 1000 + *n;
    at = dot + 1;
  }
  if (parts < 2) throw usage_error(vram::refusal(flag, text, "a version: MAJOR.MINOR or MAJOR.MINOR.PATCH (0.41.1)"));
  return parts == 2 ? v * 1000 : v;
}

number_format parse_format(const std::string& flag, const std::string& text) {
  if (text == "fp32") return number_format::fp32;
  if (text == "bf16" || text == "fp16") return number_format::bf16;
  if (text == "int8") return number_format::int8;
  if (text == "int4") return number_format::int4;
  if (text == "nf4") return number_format::nf4;
  if (text == "fp4") return number_format::fp4;
  throw usage_error(flag + ": fp32, bf16, int8, int4, nf4 or fp4, not '" + text + "'");
}

const char* format_name(number_format f) {
  static const char* names[] = {"fp32", "bf16", "int8", "int4", "nf4", "fp4"};
  return names[static_cast<int>(f)];
}
const char* mode_name(run_mode m) {
  static const char* names[] = {"training", "lora", "inference", "forward"};
  return names[static_cast<int>(m)];
}
const char* optimizer_name(optimizer_kind o) {
  static const char* names[] = {"adamw", "adamw8bit", "sgd", "none", "paged-adamw"};
  return names[static_cast<int>(o)];
}

/// A model from a JSON file: vram-fit's keys (layers, hidden, ...) or a Hugging Face config
/// (num_hidden_layers, hidden_size, ... for Llama-style and Mixtral; n_layer, n_embd, ... for
/// GPT-2; model_type bert or roberta for an encoder).
transformer_model read_model(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) throw input_error("--model " + path + ": no such file");
  if (status.type() == std::filesystem::file_type::directory)
    throw input_error("--model " + path + ": is a directory, not a model file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw input_error("--model " + path + ": cannot open (" + std::strerror(errno) + ")");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw input_error("--model " + path + ": read error (" + std::strerror(errno) + ")");
  const std::string json = text.str();  // the reader views it
  vram::detail::trace::json_value v;
  try {
    vram::detail::trace::json_reader r(json, path);
    v = r.parse_value();
  } catch (const std::exception& e) {
    throw input_error(std::string("--model ") + e.what());
  }
  if (!v.is_object()) throw input_error("--model " + path + ": not a JSON object");
  auto count = [&](std::initializer_list<const char*> keys) -> std::optional<std::uint64_t> {
    for (const char* k : keys)
      if (const auto* x = v.find(k)) {
        if (!x->is_number() || !x->integral || x->integer < 0)
          throw input_error("--model " + path + ": '" + k + "' must be a non-negative integer");
        return static_cast<std::uint64_t>(x->integer);
      }
    return std::nullopt;
  };
  auto flag = [&](std::initializer_list<const char*> keys) -> std::optional<bool> {
    for (const char* k : keys)
      if (const auto* x = v.find(k)) {
        if (x->type != vram::detail::trace::json_value::kind::boolean)
          throw input_error("--model " + path + ": '" + k + "' must be true or false");
        return x->boolean;
      }
    return std::nullopt;
  };
  auto need = [&](std::optional<std::uint64_t> x, const char* what) {
    if (!x) throw input_error("--model " + path + ": no " + what);
    return *x;
  };
  const auto* type = v.find("model_type");
  auto type_is = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (type != nullptr && type->is_string() && type->string == n) return true;
    return false;
  };
  const bool gpt2 = type_is({"gpt2"});
  // BERT's family: learned positions, biases, GELU, tied; an encoder with token types.
  const bool bert = type_is({"bert", "roberta", "xlm-roberta"});
  // Experts beside a shared expert, or narrower than intermediate_size (Qwen-MoE, DeepSeek-MoE)
  // are shapes the model does not have: refused rather than answered wrong.
  for (const char* k : {"moe_intermediate_size", "shared_expert_intermediate_size", "n_shared_experts"})
    if (v.find(k) != nullptr)
      throw input_error("--model " + path + ": '" + k + "': shared or narrower experts are not modelled (docs/fit.md)");
  transformer_model m;
  m.name = path;
  m.layers = need(count({"layers", "num_hidden_layers", "n_layer"}), "layers");
  m.hidden = need(count({"hidden", "hidden_size", "n_embd"}), "hidden");
  m.heads = need(count({"heads", "num_attention_heads", "n_head"}), "heads");
  m.kv_heads = count({"kv_heads", "num_key_value_heads"}).value_or(m.heads);
  m.ffn = count({"ffn", "intermediate_size", "n_inner"}).value_or(gpt2 ? 4 * m.hidden : 0);
  if (m.ffn == 0) throw input_error("--model " + path + ": no ffn (intermediate_size)");
  m.vocab = need(count({"vocab", "vocab_size"}), "vocab");
  m.positions = count({"positions", "n_positions"}).value_or(0);
  if (bert && m.positions == 0) m.positions = count({"max_position_embeddings"}).value_or(0);
  if (const auto* mlp = v.find("mlp")) m.mlp = mlp->is_string() && mlp->string == "gelu" ? mlp_kind::gelu : mlp_kind::swiglu;
  else m.mlp = gpt2 || bert ? mlp_kind::gelu : mlp_kind::swiglu;
  m.biases = flag({"biases"}).value_or(gpt2 || bert);
  m.tied_embeddings = flag({"tied", "tie_word_embeddings"}).value_or(gpt2 || bert);
  m.experts = count({"experts", "num_local_experts", "num_experts"}).value_or(1);
  m.experts_per_token = count({"experts_per_token", "num_experts_per_tok"}).value_or(m.experts > 1 ? 2 : 1);
  m.encoder = flag({"encoder"}).value_or(bert);
  m.token_types = count({"token_types", "type_vocab_size"}).value_or(m.token_types);
  return m;
}

/// The sharding flags as given (sharding.hpp makes a rank's plan of them).
struct sharding_flags {
  std::uint64_t gpus = 0;  ///< 0: tp x pp
  std::optional<int> zero;
  std::string fsdp;  ///< full, grad-op, hybrid, or empty
  std::uint64_t node_gpus = 0;
  std::uint64_t tp = 1, pp = 1;
  std::uint64_t micro_batches = 0;
  offload_kind offload = offload_kind::none;
  bool master_weights = true;
  bool asked = false;  ///< any of them but --micro-batches given
};

/// What was asked.
struct request {
  transformer_model model;
  step_options run;
  sharding_flags sharding;
  std::vector<double> cards_gib = {24, 48, 80, 141};
  std::optional<std::uint64_t> context_bytes;  ///< --context-gib: the whole of each card outside the allocator
  std::string context_text;                    ///< --context-gib as given
  std::string json_path;
  std::string html_path;
  bool search = true;
};

request parse(const std::vector<std::string>& args) {
  request q;
  bool fabric = false;             // --quantizer fabric
  std::uint64_t bnb = 999'999'999;  // --bitsandbytes: the newest rules unless asked
  std::optional<transformer_model> base;
  std::map<std::string, std::string> shape;  // flags that set or override the model
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw usage_error(a + ": needs a value");
      return args[++i];
    };
    if (a == "--preset") {
      const std::string& name = value();
      base = find_preset(name);
      if (!base) throw usage_error("--preset: unknown preset '" + name + "' (--list-presets)");
    } else if (a == "--model") {
      base = read_model(value());
    } else if (a == "--layers" || a == "--hidden" || a == "--heads" || a == "--kv-heads" || a == "--ffn" ||
               a == "--vocab" || a == "--positions" || a == "--mlp" || a == "--biases" || a == "--tied" ||
               a == "--experts" || a == "--experts-per-token" || a == "--encoder") {
      shape[a] = value();
    } else if (a == "--mode") {
      const std::string& m = value();
      if (m == "training" || m == "pretraining" || m == "finetuning") q.run.mode = run_mode::training;
      else if (m == "lora") q.run.mode = run_mode::lora;
      else if (m == "inference") q.run.mode = run_mode::inference;
      else if (m == "forward") q.run.mode = run_mode::forward;
      else throw usage_error("--mode: training, lora, inference or forward, not '" + m + "'");
    } else if (a == "--batch") {
      q.run.batch = parse_count(a, value());
    } else if (a == "--sequence") {
      q.run.sequence = parse_count(a, value());
    } else if (a == "--micro-batch") {
      q.run.micro_batch = parse_count(a, value());
    } else if (a == "--weights") {
      std::string w = value();
      q.run.double_quant = w == "nf4-dq" || w == "fp4-dq";
      if (q.run.double_quant) w.resize(3);
      q.run.weights = parse_format(a, w);
    } else if (a == "--bitsandbytes") {
      bnb = parse_version(a, value());
    } else if (a == "--quantizer") {
      const std::string& f = value();
      if (f != "transformers" && f != "fabric") throw usage_error("--quantizer: transformers or fabric, not '" + f + "'");
      fabric = f == "fabric";
    } else if (a == "--steps") {
      const std::string& text = value();
      const std::uint64_t n = parse_count(a, text);
      if (n == 0 || n > 16) throw usage_error(vram::refusal(a, text, "1 to 16"));
      q.run.steps = int(n);
    } else if (a == "--cublas-workspace") {
      const std::string& text = value();
      if (text == "hopper") q.run.blas_workspace = vram::trace::blas_workspace_hopper;
      else if (text == "pre-hopper") q.run.blas_workspace = vram::trace::blas_workspace_before_hopper;
      else {
        const std::uint64_t kib = parse_count(a, text);
        if (kib > (std::uint64_t{1} << 22)) throw usage_error(vram::refusal(a, text, "hopper, pre-hopper or KiB, at most 4194304"));
        q.run.blas_workspace = kib << 10;
      }
    } else if (a == "--no-foreach") {
      q.run.foreach = false;
    } else if (a == "--no-autocast") {
      q.run.autocast = false;
    } else if (a == "--optimizer") {
      const std::string& o = value();
      if (o == "adamw") q.run.optimizer = optimizer_kind::adamw;
      else if (o == "adamw8bit") q.run.optimizer = optimizer_kind::adamw_8bit;
      else if (o == "sgd") q.run.optimizer = optimizer_kind::sgd;
      else if (o == "none") q.run.optimizer = optimizer_kind::none;
      else if (o == "paged-adamw") q.run.optimizer = optimizer_kind::paged_adamw;
      else throw usage_error("--optimizer: adamw, adamw8bit, paged-adamw, sgd or none, not '" + o + "'");
    } else if (a == "--checkpoint") {
      const std::string& c = value();
      q.run.checkpoint_every = c == "none" ? 0 : c == "every" ? 1 : parse_count(a, c);
    } else if (a == "--flash") {
      q.run.flash_attention = true;
    } else if (a == "--lora-rank") {
      q.run.lora_rank = parse_count(a, value());
    } else if (a == "--kv-cache") {
      q.run.kv_cache = parse_format(a, value());
    } else if (a == "--decode-steps") {
      q.run.decode_steps = parse_count(a, value());
    } else if (a == "--gpus" || a == "--tp" || a == "--pp" || a == "--node-gpus" || a == "--micro-batches") {
      const std::string& text = value();
      const std::uint64_t n = parse_count(a, text);
      if (n == 0 || n > (1u << 16)) throw usage_error(vram::refusal(a, text, "1 to 65536"));
      sharding_flags& f = q.sharding;
      (a == "--gpus" ? f.gpus : a == "--tp" ? f.tp : a == "--pp" ? f.pp : a == "--node-gpus" ? f.node_gpus : f.micro_batches) = n;
      f.asked |= a != "--micro-batches";  // micro-batches alone are gradient accumulation
    } else if (a == "--zero") {
      const std::string& z = value();
      if (z.size() != 1 || z[0] < '0' || z[0] > '3') throw usage_error("--zero: 0, 1, 2 or 3, not '" + z + "'");
      q.sharding.zero = z[0] - '0';
      q.sharding.asked = true;
    } else if (a == "--fsdp") {
      const std::string& f = value();
      if (f != "full" && f != "grad-op" && f != "hybrid")
        throw usage_error("--fsdp: full, grad-op or hybrid, not '" + f + "'");
      q.sharding.fsdp = f;
      q.sharding.asked = true;
    } else if (a == "--offload") {
      const std::string& f = value();
      if (f != "optimizer" && f != "params") throw usage_error("--offload: optimizer or params, not '" + f + "'");
      q.sharding.offload = f == "optimizer" ? offload_kind::optimizer : offload_kind::params;
      q.sharding.asked = true;
    } else if (a == "--no-master-weights") {
      q.sharding.master_weights = false;
      q.sharding.asked = true;
    } else if (a == "--gpu") {
      q.cards_gib = parse_cards_gib(value());
    } else if (a == "--context-gib") {
      q.context_text = value();
      q.context_bytes = parse_context_gib(a, q.context_text);
    } else if (a == "--json") {
      q.json_path = value();
    } else if (a == "--html") {
      q.html_path = value();
    } else if (a == "--no-search") {
      q.search = false;
    } else {
      throw usage_error("unknown option " + vram::quoted(a));
    }
  }
  // bitsandbytes' MatMul4Bit keeps its input before 0.43.2; Params4bit quantizes from fp16
  // before 0.43; Lightning Fabric's _Linear4bit quantizes from fp16 and converts the head too.
  q.run.four_bit = {bnb < 43'002, bnb < 43'000 || fabric, fabric};
  if (!base && shape.empty()) throw usage_error("no model: give --preset, --model or the shape flags");
  transformer_model m = base.value_or(transformer_model{});
  for (const auto& [flag, text] : shape) {
    if (flag == "--layers") m.layers = parse_count(flag, text);
    else if (flag == "--hidden") m.hidden = parse_count(flag, text);
    else if (flag == "--heads") m.heads = parse_count(flag, text);
    else if (flag == "--kv-heads") m.kv_heads = parse_count(flag, text);
    else if (flag == "--ffn") m.ffn = parse_count(flag, text);
    else if (flag == "--vocab") m.vocab = parse_count(flag, text);
    else if (flag == "--positions") m.positions = parse_count(flag, text);
    else if (flag == "--biases") m.biases = parse_yes_no(flag, text);
    else if (flag == "--tied") m.tied_embeddings = parse_yes_no(flag, text);
    else if (flag == "--experts") m.experts = parse_count(flag, text);
    else if (flag == "--experts-per-token") m.experts_per_token = parse_count(flag, text);
    else if (flag == "--encoder") m.encoder = parse_yes_no(flag, text);
    else if (flag == "--mlp") {
      if (text != "gelu" && text != "swiglu") throw usage_error("--mlp: gelu or swiglu, not '" + text + "'");
      m.mlp = text == "gelu" ? mlp_kind::gelu : mlp_kind::swiglu;
    }
  }
  if (!base && shape.count("--kv-heads") == 0) m.kv_heads = m.heads;
  q.model = m;
  return q;
}

}  // namespace

// vram-fit: will my model fit on this card, and what should I change? Generates the
// allocation trace of a training or serving step of a decoder-only transformer
// (vram/trace/step.hpp), replays it on each allocator on a simulated card of each capacity,
// and answers with the peak by category, what each allocator reserves, the largest batch and
// sequence that fit, and the remedies ranked by what they save. See docs/fit.md.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <vram-fit/remedies.hpp>
#include <vram-replay/lineup.hpp>
#include <vram-replay/output_file.hpp>
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
    "                         llama-2-70b, llama-3-8b (--list-presets: their shapes and sources)\n"
    "  --model FILE.json      a Hugging Face config.json, or vram-fit's own keys (as the flags)\n"
    "  --layers N --hidden N --heads N [--kv-heads N] --ffn N --vocab N [--positions N]\n"
    "  [--mlp gelu|swiglu] [--biases yes|no] [--tied yes|no]   (each also overrides a preset)\n"
    "run:\n"
    "  --mode training|lora|inference   (default training: every weight trained)\n"
    "  --batch N --sequence N           sequences per step (inference: concurrent sequences)\n"
    "  --micro-batch N                  gradient accumulation: sequences per forward/backward\n"
    "  --weights fp32|bf16|int8|int4    (int8/int4: a frozen base only)\n"
    "  --no-autocast                    fp32 activations with fp32 weights\n"
    "  --optimizer adamw|adamw8bit|sgd|none\n"
    "  --checkpoint none|every|K        activation checkpointing: every layer, or every K layers\n"
    "  --flash                          attention that never materializes the scores\n"
    "  --lora-rank R  --kv-cache fp32|bf16|int8  --decode-steps N\n"
    "cards:\n"
    "  --gpu GIB[,GIB...]               card capacities in GiB, or sizes with a unit (default 24,48,80,141)\n"
    "output:\n"
    "  --json FILE                      the answer as JSON\n"
    "  --html FILE                      a self-contained page: what fills each card, per allocator\n"
    "  --no-search                      skip the largest-batch and -sequence search\n"
    "\n"
    "exit status: 0 answered, 2 bad input (the message names the field)\n";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

bool parse_yes_no(const std::string& flag, const std::string& text) {
  if (text == "yes" || text == "true") return true;
  if (text == "no" || text == "false") return false;
  throw usage_error(flag + ": yes or no, not '" + text + "'");
}

number_format parse_format(const std::string& flag, const std::string& text) {
  if (text == "fp32") return number_format::fp32;
  if (text == "bf16" || text == "fp16") return number_format::bf16;
  if (text == "int8") return number_format::int8;
  if (text == "int4") return number_format::int4;
  throw usage_error(flag + ": fp32, bf16, int8 or int4, not '" + text + "'");
}

const char* format_name(number_format f) {
  static const char* names[] = {"fp32", "bf16", "int8", "int4"};
  return names[static_cast<int>(f)];
}
const char* mode_name(run_mode m) {
  static const char* names[] = {"training", "lora", "inference"};
  return names[static_cast<int>(m)];
}
const char* optimizer_name(optimizer_kind o) {
  static const char* names[] = {"adamw", "adamw8bit", "sgd", "none"};
  return names[static_cast<int>(o)];
}

/// A model from a JSON file: vram-fit's keys (layers, hidden, ...) or a Hugging Face config
/// (num_hidden_layers, hidden_size, ... for Llama-style; n_layer, n_embd, ... for GPT-2).
decoder_model read_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw usage_error("--model: cannot read '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();  // the reader views it
  vram::detail::trace::json_value v;
  try {
    vram::detail::trace::json_reader r(json, path);
    v = r.parse_value();
  } catch (const std::exception& e) {
    throw usage_error(std::string("--model: ") + e.what());
  }
  if (!v.is_object()) throw usage_error("--model: '" + path + "' is not a JSON object");
  auto count = [&](std::initializer_list<const char*> keys) -> std::optional<std::uint64_t> {
    for (const char* k : keys)
      if (const auto* x = v.find(k)) {
        if (!x->is_number() || !x->integral || x->integer < 0)
          throw usage_error(std::string("--model: '") + k + "' must be a non-negative integer");
        return static_cast<std::uint64_t>(x->integer);
      }
    return std::nullopt;
  };
  auto flag = [&](std::initializer_list<const char*> keys) -> std::optional<bool> {
    for (const char* k : keys)
      if (const auto* x = v.find(k)) {
        if (x->type != vram::detail::trace::json_value::kind::boolean)
          throw usage_error(std::string("--model: '") + k + "' must be true or false");
        return x->boolean;
      }
    return std::nullopt;
  };
  auto need = [&](std::optional<std::uint64_t> x, const char* what) {
    if (!x) throw usage_error(std::string("--model: no ") + what + " in '" + path + "'");
    return *x;
  };
  const auto* type = v.find("model_type");
  const bool gpt2 = type != nullptr && type->is_string() && type->string == "gpt2";
  decoder_model m;
  m.name = path;
  m.layers = need(count({"layers", "num_hidden_layers", "n_layer"}), "layers");
  m.hidden = need(count({"hidden", "hidden_size", "n_embd"}), "hidden");
  m.heads = need(count({"heads", "num_attention_heads", "n_head"}), "heads");
  m.kv_heads = count({"kv_heads", "num_key_value_heads"}).value_or(m.heads);
  m.ffn = count({"ffn", "intermediate_size", "n_inner"}).value_or(gpt2 ? 4 * m.hidden : 0);
  if (m.ffn == 0) throw usage_error("--model: no ffn (intermediate_size) in '" + path + "'");
  m.vocab = need(count({"vocab", "vocab_size"}), "vocab");
  m.positions = count({"positions", "n_positions"}).value_or(0);
  if (const auto* mlp = v.find("mlp")) m.mlp = mlp->is_string() && mlp->string == "gelu" ? mlp_kind::gelu : mlp_kind::swiglu;
  else m.mlp = gpt2 ? mlp_kind::gelu : mlp_kind::swiglu;
  m.biases = flag({"biases"}).value_or(gpt2);
  m.tied_embeddings = flag({"tied", "tie_word_embeddings"}).value_or(gpt2);
  return m;
}

/// What was asked.
struct request {
  decoder_model model;
  step_options run;
  std::vector<double> cards_gib = {24, 48, 80, 141};
  std::string json_path;
  std::string html_path;
  bool search = true;
};

request parse(const std::vector<std::string>& args) {
  request q;
  std::optional<decoder_model> base;
  std::map<std::string, std::string> shape;  // flags that set or override the model
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw usage_error(a + " needs a value");
      return args[++i];
    };
    if (a == "--preset") {
      const std::string& name = value();
      base = find_preset(name);
      if (!base) throw usage_error("--preset: unknown preset '" + name + "' (--list-presets)");
    } else if (a == "--model") {
      base = read_model(value());
    } else if (a == "--layers" || a == "--hidden" || a == "--heads" || a == "--kv-heads" || a == "--ffn" ||
               a == "--vocab" || a == "--positions" || a == "--mlp" || a == "--biases" || a == "--tied") {
      shape[a] = value();
    } else if (a == "--mode") {
      const std::string& m = value();
      if (m == "training" || m == "pretraining" || m == "finetuning") q.run.mode = run_mode::training;
      else if (m == "lora") q.run.mode = run_mode::lora;
      else if (m == "inference") q.run.mode = run_mode::inference;
      else throw usage_error("--mode: training, lora or inference, not '" + m + "'");
    } else if (a == "--batch") {
      q.run.batch = parse_count(a, value());
    } else if (a == "--sequence") {
      q.run.sequence = parse_count(a, value());
    } else if (a == "--micro-batch") {
      q.run.micro_batch = parse_count(a, value());
    } else if (a == "--weights") {
      q.run.weights = parse_format(a, value());
    } else if (a == "--no-autocast") {
      q.run.autocast = false;
    } else if (a == "--optimizer") {
      const std::string& o = value();
      if (o == "adamw") q.run.optimizer = optimizer_kind::adamw;
      else if (o == "adamw8bit") q.run.optimizer = optimizer_kind::adamw_8bit;
      else if (o == "sgd") q.run.optimizer = optimizer_kind::sgd;
      else if (o == "none") q.run.optimizer = optimizer_kind::none;
      else throw usage_error("--optimizer: adamw, adamw8bit, sgd or none, not '" + o + "'");
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
    } else if (a == "--gpu") {
      q.cards_gib = parse_cards_gib(value());
    } else if (a == "--json") {
      q.json_path = value();
    } else if (a == "--html") {
      q.html_path = value();
    } else if (a == "--no-search") {
      q.search = false;
    } else {
      throw usage_error("unknown option '" + a + "'");
    }
  }
  if (!base && shape.empty()) throw usage_error("no model: give --preset, --model or the shape flags");
  decoder_model m = base.value_or(decoder_model{});
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
    else if (flag == "--mlp") {
      if (text != "gelu" && text != "swiglu") throw usage_error("--mlp: gelu or swiglu, not '" + text + "'");
      m.mlp = text == "gelu" ? mlp_kind::gelu : mlp_kind::swiglu;
    }
  }
  if (!base && shape.count("--kv-heads") == 0) m.kv_heads = m.heads;
  q.model = m;
  return q;
}

// ---- answering ------------------------------------------------------------------------------

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", bytes / double(std::uint64_t{1} << 30));
  return b;
}

/// The allocators a whole model step is replayed on: vram-replay's default lineup but the
/// activation arena (a bump allocator for activations alone, not for weights and state).
std::vector<vram_replay::allocator_config> fit_allocators() {
  std::vector<vram_replay::allocator_config> out;
  for (auto& a : vram_replay::default_allocators())
    if (a.name != "arena") out.push_back(std::move(a));
  return out;
}

/// One allocator on one card: what it reserved, and whether the step ran without a refusal.
struct outcome {
  std::string allocator;
  std::uint64_t peak_reserved = 0;
  bool fits = false;
};

std::vector<outcome> replay_on(const step_trace& s, std::size_t capacity,
                               const std::vector<vram_replay::allocator_config>& allocators) {
  std::vector<outcome> out;
  replay_options o;
  o.capacity = capacity;
  o.time_operations = false;
  o.series_points = 2;
  for (const auto& a : allocators) {
    replay_result r = a.run(s.t, o);
    out.push_back({a.name, r.peak_reserved_bytes, r.ooms == 0 && r.error.empty()});
  }
  return out;
}

/// A capacity no step asks for: what an allocator reserves when nothing refuses it.
std::size_t unbounded_for(const category_peak& peak) {
  return static_cast<std::size_t>(std::min<std::uint64_t>(4 * peak.peak_live + (std::uint64_t{16} << 30),
                                                          std::uint64_t{1} << 46));
}

/// A model and a run as a key, for remembering what the run needs.
std::string key_of(const decoder_model& m, const step_options& o) {
  std::ostringstream k;
  k << m.layers << ' ' << m.hidden << ' ' << m.heads << ' ' << m.kv_heads << ' ' << m.ffn << ' ' << m.vocab << ' '
    << m.positions << ' ' << int(m.mlp) << ' ' << m.biases << ' ' << m.tied_embeddings << " | " << int(o.mode) << ' ' << o.batch << ' ' << o.sequence << ' ' << o.micro_batch << ' ' << int(o.weights) << ' '
    << o.autocast << ' ' << int(o.optimizer) << ' ' << o.checkpoint_every << ' ' << o.flash_attention << ' '
    << o.lora_rank << ' ' << int(o.kv_cache) << ' ' << o.decode_steps << ' ' << o.steps;
  return k.str();
}

/// What run `o` reserves on `allocator` when nothing refuses it, remembered per run and
/// allocator (the remedies and their combinations ask for the same runs on every card).
std::uint64_t needs_of(const decoder_model& m, const step_options& o, const vram_replay::allocator_config& allocator,
                       category_peak* peak = nullptr) {
  static std::map<std::string, std::pair<std::uint64_t, category_peak>> known;
  const std::string key = allocator.name + ' ' + key_of(m, o);
  auto it = known.find(key);
  if (it == known.end()) {
    step_trace t = generate_step(m, o);
    category_peak p = peak_by_category(t);
    it = known.emplace(key, std::pair{replay_on(t, unbounded_for(p), {allocator})[0].peak_reserved, p}).first;
  }
  if (peak != nullptr) *peak = it->second.second;
  return it->second.first;
}

/// Whether run `o` fits `capacity` on `allocator`. Without a refusal a capped replay is the
/// unbounded one, so a run that needs no more than the card fits, and one whose live bytes
/// alone exceed it cannot; only between the two is the capped replay run.
bool fits_on(const decoder_model& m, const step_options& o, std::size_t capacity,
             const vram_replay::allocator_config& allocator) {
  category_peak p;
  const std::uint64_t needs = needs_of(m, o, allocator, &p);
  if (needs <= capacity) return true;
  if (p.peak_live > capacity) return false;
  return replay_on(generate_step(m, o), capacity, {allocator})[0].fits;
}

/// The largest value of `field` in [1, limit] for which the step fits under `allocator`,
/// 0 when even 1 does not. Fitting is taken as monotone in the field (more never fits less).
std::uint64_t largest_fitting(const request& q, std::uint64_t step_options::*field, std::uint64_t limit,
                              std::size_t capacity, const vram_replay::allocator_config& allocator) {
  auto fits = [&](std::uint64_t v) {
    step_options o = q.run;
    o.*field = v;
    if (field == &step_options::micro_batch) o.batch = v * (q.run.batch / q.run.micro_batch);  // same accumulation
    try {
      return fits_on(q.model, o, capacity, allocator);
    } catch (const vram::invalid_argument&) {
      return false;  // beyond what the model allows (its learned positions)
    }
  };
  if (!fits(1)) return 0;
  std::uint64_t lo = 1, hi = 2;
  while (hi <= limit && fits(hi)) lo = hi, hi *= 2;
  if (hi > limit) hi = limit + 1;
  while (hi - lo > 1) {  // fits(lo), !fits(hi)
    std::uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

/// When the weights and what the mode must keep beside them exceed a card before any
/// activation, no allocator and no batch can fit: say so, with the numbers.
std::string floor_verdict(const request& q, const category_peak& peak, double capacity) {
  const double w = double(peak.own_peak[0]), g = double(peak.own_peak[1]), o = double(peak.own_peak[2]);
  std::ostringstream s;
  if (w > capacity) {
    s << "the weights alone (" << gib(w) << " GiB) exceed the card: quantize the base (int8, int4) or shard the model";
  } else if (q.run.mode == run_mode::training && w + g > capacity) {
    s << "full training cannot fit: weights " << gib(w) << " + gradients " << gib(g) << " = " << gib(w + g)
      << " GiB exceed the card before any activation or optimizer state; only a frozen base (--mode lora, a "
         "quantized base) or offloading can fit";
  } else if (w + g + o > capacity) {
    s << "weights, gradients and optimizer state (" << gib(w + g + o)
      << " GiB) exceed the card: a lighter optimizer (8-bit AdamW, SGD), a frozen base or offloading is needed";
  }
  return s.str();
}

/// Remedies combined, best first: each round applies the remedy (among those that apply to
/// the run so far) that lowers what `allocator` needs the most, until the run fits `capacity`
/// or no remedy lowers it. The names applied, in order, and the run they make.
struct combination {
  std::vector<std::string> applied;
  step_options run;
  std::uint64_t needs = 0;
  bool fits = false;
};

combination combine(const request& q, std::size_t capacity, const vram_replay::allocator_config& allocator) {
  combination c{{}, q.run, needs_of(q.model, q.run, allocator), false};
  for (;;) {
    c.fits = fits_on(q.model, c.run, capacity, allocator);
    if (c.fits) return c;
    const remedy* best = nullptr;
    std::uint64_t best_needs = c.needs;
    std::vector<remedy> candidates = remedies_for(c.run);
    for (const remedy& r : candidates) {
      std::uint64_t n = needs_of(q.model, r.run, allocator);
      if (n < best_needs) best = &r, best_needs = n;
    }
    if (best == nullptr) return c;
    c.applied.push_back(best->name);
    c.run = best->run;
    c.needs = best_needs;
  }
}

/// The self-contained HTML page: per card, one stacked bar per allocator of what fills it at
/// the peak (each category, then what the allocator reserves beyond the live bytes), against
/// the card's capacity.
class html_page {
 public:
  /// The categories' colours, then fragmentation's.
  static constexpr const char* colours[category_count + 1] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                              "#9467bd", "#8c564b", "#7f7f7f"};

  html_page(const request& q, const category_peak& peak) : peak_(peak) {
    using vram::detail::trace::json_quote;
    body_ << "<h1>vram-fit: " << escape(q.model.name) << "</h1>\n<p>" << q.model.parameters() << " parameters; "
          << mode_name(q.run.mode) << ", batch " << q.run.batch << " &times; sequence " << q.run.sequence
          << ", weights " << format_name(q.run.weights) << ". Peak live " << gib(double(peak.peak_live))
          << " GiB.</p>\n<p>";
    for (std::size_t i = 0; i <= category_count; ++i)
      body_ << "<span class=key style=\"background:" << colours[i] << "\"></span>"
            << (i < category_count ? category_names[i] : "reserved beyond live") << " ";
    body_ << "</p>\n";
  }

  struct remedy_row {
    std::string name, cost;
    double saves;
    std::uint64_t needs;
    bool fits;
  };

  void card(double card_gib, std::size_t capacity, const std::string& verdict, const std::vector<outcome>& needs,
            const std::vector<outcome>& results, const std::vector<remedy_row>& remedies, const std::string& combination,
            bool combination_fits) {
    std::uint64_t widest = capacity;
    for (const outcome& n : needs) widest = std::max<std::uint64_t>(widest, n.peak_reserved);
    const double width = 900, scale = (width - 180) / (double(widest) * 1.05);
    const int row = 34;
    body_ << "<h2>" << card_gib << " GiB card</h2>\n";
    if (!verdict.empty()) body_ << "<p class=verdict>" << escape(verdict) << "</p>\n";
    body_ << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << row * needs.size() + 30
          << "\">\n";
    for (std::size_t a = 0; a < needs.size(); ++a) {
      const int y = int(a) * row + 6;
      double x = 170;
      body_ << "<text x=\"0\" y=\"" << y + 17 << "\">" << escape(needs[a].allocator) << (results[a].fits ? "" : " (OOM)")
            << "</text>\n";
      auto bar = [&](std::uint64_t bytes, const char* colour, const std::string& what) {
        const double w = double(bytes) * scale;
        if (w <= 0) return;
        body_ << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"24\" fill=\"" << colour
              << "\"><title>" << escape(what) << " " << gib(double(bytes)) << " GiB</title></rect>\n";
        x += w;
      };
      for (std::size_t i = 0; i < category_count; ++i) bar(peak_.at_peak[i], colours[i], category_names[i]);
      const std::uint64_t reserved = needs[a].peak_reserved;
      bar(reserved > peak_.peak_live ? reserved - peak_.peak_live : 0, colours[category_count], "reserved beyond live");
    }
    const double cx = 170 + double(capacity) * scale;
    body_ << "<line x1=\"" << cx << "\" y1=\"0\" x2=\"" << cx << "\" y2=\"" << row * needs.size() + 4
          << "\" stroke=\"#000\" stroke-width=\"2\"/>\n<text text-anchor=\"end\" x=\"" << cx - 4 << "\" y=\""
          << row * needs.size() + 20 << "\">the card: " << card_gib << " GiB</text>\n</svg>\n";
    if (!remedies.empty()) {
      body_ << "<table><tr><th>remedy, alone</th><th>saves GiB</th><th>needs GiB</th><th></th><th>costs</th></tr>\n";
      for (const remedy_row& r : remedies)
        body_ << "<tr><td>" << escape(r.name) << "</td><td>" << gib(r.saves) << "</td><td>" << gib(double(r.needs))
              << "</td><td>" << (r.fits ? "fits" : "OOM") << "</td><td>" << escape(r.cost) << "</td></tr>\n";
      body_ << "</table>\n";
    }
    if (combination.empty()) body_ << "<p>" << (combination_fits ? "It fits as asked." : "No remedy helps.") << "</p>\n";
    else
      body_ << "<p>" << (combination_fits ? "To fit: " : "Even with ") << escape(combination)
            << (combination_fits ? "." : ", it does not fit.") << "</p>\n";
  }

  [[nodiscard]] std::string finish() const {
    return "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>vram-fit</title><style>"
           "body{font:14px sans-serif;margin:2em}svg text{font:13px sans-serif}"
           ".key{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}.verdict{color:#b00}"
           "td,th{padding:2px 10px;text-align:left}"
           "</style></head><body>\n" +
           body_.str() + "</body></html>\n";
  }

 private:
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '<') out += "&lt;";
      else if (c == '>') out += "&gt;";
      else if (c == '&') out += "&amp;";
      else if (c == '"') out += "&quot;";
      else out += c;
    }
    return out;
  }
  const category_peak& peak_;
  std::ostringstream body_;
};

int answer(const request& q) {
  q.model.validate();
  q.run.validate(q.model);
  vram_replay::output_file json_file(q.json_path), html_file(q.html_path);  // opened first: a bad path fails at once
  for (vram_replay::output_file* f : {&json_file, &html_file})
    if (!f->path().empty() && !f->open()) {
      std::cerr << "vram-fit: " << f->error() << "\n";
      return 1;
    }
  const auto allocators = fit_allocators();
  const step_trace base = generate_step(q.model, q.run);
  const category_peak peak = peak_by_category(base);
  html_page page(q, peak);
  std::vector<outcome> needs;
  for (const auto& a : allocators) needs.push_back({a.name, needs_of(q.model, q.run, a), true});
  std::ostringstream out, json;
  using vram::detail::trace::json_quote;
  out << q.model.name << ": " << q.model.parameters() << " parameters; " << mode_name(q.run.mode) << ", batch "
      << q.run.batch << " x sequence " << q.run.sequence << ", weights " << format_name(q.run.weights);
  if (q.run.mode != run_mode::inference) out << ", optimizer " << optimizer_name(q.run.optimizer);
  out << "\n\n";
  out << "peak live " << gib(double(peak.peak_live)) << " GiB:";
  for (std::size_t i = 0; i < category_count; ++i)
    if (peak.at_peak[i] != 0) out << " " << category_names[i] << " " << gib(double(peak.at_peak[i]));
  out << "\nreserved at the peak, when nothing refuses:";
  for (const outcome& n : needs) out << " " << n.allocator << " " << gib(double(n.peak_reserved));
  out << " GiB\n";
  json << "{\"model\": " << json_quote(q.model.name) << ", \"parameters\": " << q.model.parameters()
       << ", \"mode\": \"" << mode_name(q.run.mode) << "\", \"batch\": " << q.run.batch
       << ", \"sequence\": " << q.run.sequence << ", \"peak_live\": " << peak.peak_live << ", \"peak_by_category\": {";
  for (std::size_t i = 0; i < category_count; ++i)
    json << (i ? ", " : "") << "\"" << category_names[i] << "\": " << peak.at_peak[i];
  json << "}, \"needs\": {";
  for (std::size_t a = 0; a < needs.size(); ++a)
    json << (a ? ", " : "") << "\"" << needs[a].allocator << "\": " << needs[a].peak_reserved;
  json << "}, \"cards\": [";

  // Remedies: each alone, what it needs on the first allocator (nothing refusing).
  struct ranked {
    remedy r;
    std::uint64_t live, needs;
  };
  std::vector<ranked> remedies;
  for (remedy& r : remedies_for(q.run)) {
    category_peak p{};
    const std::uint64_t needs = needs_of(q.model, r.run, allocators[0], &p);
    remedies.push_back({r, p.peak_live, needs});
  }
  std::stable_sort(remedies.begin(), remedies.end(), [](const ranked& x, const ranked& y) { return x.needs < y.needs; });

  for (std::size_t c = 0; c < q.cards_gib.size(); ++c) {
    const std::size_t capacity = static_cast<std::size_t>(q.cards_gib[c] * double(std::uint64_t{1} << 30));
    out << "\n" << q.cards_gib[c] << " GiB card\n";
    const std::string verdict = floor_verdict(q, peak, double(capacity));
    if (!verdict.empty()) out << "  " << verdict << "\n";
    json << (c ? ", " : "") << "{\"capacity\": " << capacity << ", \"verdict\": " << json_quote(verdict)
         << ", \"allocators\": [";
    std::vector<outcome> results;  // on this card: whether it fits, and what it then reserves
    for (std::size_t a = 0; a < allocators.size(); ++a) {
      const bool fits = fits_on(q.model, q.run, capacity, allocators[a]);
      results.push_back({allocators[a].name,
                         needs[a].peak_reserved <= capacity ? needs[a].peak_reserved
                                                            : replay_on(base, capacity, {allocators[a]})[0].peak_reserved,
                         fits});
    }
    char line[256];
    std::snprintf(line, sizeof line, "  %-16s %10s %14s", "allocator", "fits", "headroom GiB");
    out << line << (q.search ? "   largest batch, sequence" : "") << "\n";
    for (std::size_t a = 0; a < results.size(); ++a) {
      const outcome& r = results[a];
      const double headroom = double(capacity) - double(r.peak_reserved);
      std::snprintf(line, sizeof line, "  %-16s %10s %14s", r.allocator.c_str(), r.fits ? "yes" : "OOM",
                    r.fits ? gib(headroom).c_str() : "-");
      out << line;
      json << (a ? ", " : "") << "{\"allocator\": \"" << r.allocator << "\", \"fits\": " << (r.fits ? "true" : "false");
      if (q.search) {
        const bool accumulates = q.run.micro_batch != 0;
        auto batch_field = accumulates ? &step_options::micro_batch : &step_options::batch;
        const std::uint64_t max_sequence = q.model.positions != 0 ? q.model.positions : std::uint64_t{1} << 20;
        std::uint64_t b = largest_fitting(q, batch_field, 1u << 16, capacity, allocators[a]);
        std::uint64_t s = largest_fitting(q, &step_options::sequence, max_sequence, capacity, allocators[a]);
        out << "   " << b << (accumulates ? " per micro-batch" : "") << ", " << s;
        json << ", \"largest_batch\": " << b << ", \"largest_sequence\": " << s;
      }
      out << "\n";
      json << "}";
    }
    json << "], \"remedies\": [";
    out << "  remedies, each alone (" << allocators[0].name << " needs " << gib(double(needs[0].peak_reserved))
        << " GiB as asked):\n";
    std::vector<html_page::remedy_row> rows;
    for (std::size_t i = 0; i < remedies.size(); ++i) {
      const ranked& k = remedies[i];
      const bool fits = fits_on(q.model, k.r.run, capacity, allocators[0]);
      rows.push_back({k.r.name, k.r.cost, double(needs[0].peak_reserved) - double(k.needs), k.needs, fits});
      const double saved = double(needs[0].peak_reserved) - double(k.needs);
      std::snprintf(line, sizeof line, "    %-44s saves %8s GiB, needs %8s GiB %-4s  ", k.r.name.c_str(),
                    gib(saved).c_str(), gib(double(k.needs)).c_str(), fits ? "fits" : "OOM");
      out << line << k.r.cost << "\n";
      json << (i ? ", " : "") << "{\"remedy\": " << json_quote(k.r.name) << ", \"cost\": " << json_quote(k.r.cost)
           << ", \"peak_live\": " << k.live << ", \"needs\": " << k.needs << ", \"fits\": " << (fits ? "true" : "false")
           << "}";
    }
    const combination best = combine(q, capacity, allocators[0]);
    std::string names;
    for (const std::string& n : best.applied) names += (names.empty() ? "" : " + ") + n;
    page.card(q.cards_gib[c], capacity, verdict, needs, results, rows, names, best.fits);
    if (best.applied.empty() && best.fits) out << "  it fits as asked\n";
    else if (best.fits) out << "  to fit: " << names << " (needs " << gib(double(best.needs)) << " GiB)\n";
    else
      out << "  no combination of these remedies fits" << (names.empty() ? "" : ": with " + names + " it still needs ")
          << (names.empty() ? "" : gib(double(best.needs)) + " GiB") << "\n";
    json << "], \"combination\": {\"applied\": [";
    for (std::size_t i = 0; i < best.applied.size(); ++i) json << (i ? ", " : "") << json_quote(best.applied[i]);
    json << "], \"needs\": " << best.needs << ", \"fits\": " << (best.fits ? "true" : "false") << "}}";
  }
  json << "]}\n";
  std::cout << out.str();
  if (!q.json_path.empty()) {
    json_file.stream() << json.str();
    if (!json_file.close()) {
      std::cerr << "vram-fit: " << json_file.error() << "\n";
      return 1;
    }
    std::cout << "\nwrote " << q.json_path << "\n";
  }
  if (!q.html_path.empty()) {
    html_file.stream() << page.finish();
    if (!html_file.close()) {
      std::cerr << "vram-fit: " << html_file.error() << "\n";
      return 1;
    }
    std::cout << (q.json_path.empty() ? "\n" : "") << "wrote " << q.html_path << "\n";
  }
  return 0;
}

void list_presets() {
  for (const model_preset& p : model_presets()) {
    const decoder_model& m = p.model;
    std::printf("%-12s %6.2fB params  layers %llu, hidden %llu, heads %llu/%llu kv, ffn %llu (%s), vocab %llu  [%s]\n",
                m.name.c_str(), double(m.parameters()) / 1e9, (unsigned long long)m.layers,
                (unsigned long long)m.hidden, (unsigned long long)m.heads, (unsigned long long)m.kv_heads,
                (unsigned long long)m.ffn, m.mlp == mlp_kind::gelu ? "GELU" : "SwiGLU", (unsigned long long)m.vocab,
                p.source);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && (args[0] == "-h" || args[0] == "--help")) {
    std::cout << usage;
    return 0;
  }
  if (args.size() == 1 && args[0] == "--list-presets") {
    list_presets();
    return 0;
  }
  try {
    return answer(parse(args));
  } catch (const usage_error& e) {
    std::cerr << "vram-fit: " << e.what() << "\n\n" << usage;
    return 2;
  } catch (const vram::invalid_argument& e) {
    std::cerr << "vram-fit: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "vram-fit: " << e.what() << "\n";
    return 1;
  }
}

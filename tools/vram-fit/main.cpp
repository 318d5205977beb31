// vram-fit: will my model fit on this card, and what should I change? Generates the
// allocation trace of a training or serving step of a transformer (vram/trace/step.hpp),
// replays it on each allocator on a simulated card of each capacity, and answers with the
// peak by category, what each allocator reserves, the largest batch and sequence that fit,
// and the remedies ranked by what they save. Each card first loses what it holds outside the
// allocator (the CUDA context, the libraries, NCCL); the allocators are replayed on the rest.
// See docs/fit.md. This file writes the answer; its rooms parse the flags
// (flags.hpp), keep the memory outside the allocator (outside.hpp), search (search.hpp), quote
// the measured runs of the kind asked (accuracy.hpp) and draw the HTML page (render.hpp).

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

#include <vram-fit/accuracy.hpp>
#include <vram-fit/flags.hpp>
#include <vram-fit/outside.hpp>
#include <vram-fit/remedies.hpp>
#include <vram-fit/render.hpp>
#include <vram-fit/search.hpp>
#include <vram-fit/sharding.hpp>
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
  const step_options worst = worst_rank(q.model, q.run, allocators[0]);  // one rank of a sharded run: the worst
  const step_trace base = generate_step(q.model, worst);
  const category_peak peak = peak_by_category(base);
  html_page page(q, peak);
  std::vector<outcome> needs;
  for (const auto& a : allocators) needs.push_back({a.name, needs_of(q.model, q.run, a), true});
  std::ostringstream out, json;
  using vram::detail::trace::json_quote;
  out << q.model.name << ": " << q.model.parameters() << " parameters";
  if (q.model.mixture())  // the assumption behind the experts' activations (docs/fit.md)
    out << " (" << q.model.experts << " experts, " << q.model.experts_per_token
        << " a token, routed evenly; each expert's temporaries sized for every token)";
  if (q.model.encoder) out << " (encoder)";
  out << "; " << mode_name(q.run.mode) << ", batch "
      << q.run.batch << " x sequence " << q.run.sequence << ", weights " << format_name(q.run.weights);
  if (q.run.double_quant) out << "-dq";
  if (q.run.mode == run_mode::training || q.run.mode == run_mode::lora)
    out << ", optimizer " << optimizer_name(q.run.optimizer) << (q.run.foreach ? "" : " (single-tensor)");
  char workspace[32];
  std::snprintf(workspace, sizeof workspace, "%g", double(q.run.blas_workspace) / double(1 << 20));
  out << ", cuBLAS workspace " << workspace << " MiB a handle\n";
  if (q.sharding.asked) out << sharding_lines(q, q.model, worst);
  const outside_allocator kept = outside_of(q, q.sharding.gpus), kept_searching = outside_for_search(q);
  out << outside_line(kept) << "not modelled, beside it:";
  for (std::size_t i = 0; i < not_modelled().size(); ++i) out << (i ? "; " : " ") << not_modelled()[i];
  const accuracy_answer accuracy = accuracy_of(q);
  out << "\n" << accuracy.text << "\n";
  // The card's capacity less what it holds outside the allocator: what the allocator may use.
  const auto usable_of = [&](double card_gib, const outside_allocator& o) {
    return static_cast<std::size_t>(card_gib * double(std::uint64_t{1} << 30)) - o.total();
  };
  out << "peak live " << gib(double(peak.peak_live)) << " GiB:";
  for (std::size_t i = 0; i < category_count; ++i)
    if (peak.at_peak[i] != 0) out << " " << category_names[i] << " " << gib(double(peak.at_peak[i]));
  out << "\nreserved at the peak, when nothing refuses:";
  for (const outcome& n : needs) out << " " << n.allocator << " " << gib(double(n.peak_reserved));
  out << " GiB\n";
  json << "{\"model\": " << json_quote(q.model.name) << ", \"parameters\": " << q.model.parameters()
       << ", \"experts\": " << q.model.experts << ", \"experts_per_token\": " << q.model.experts_per_token
       << ", \"encoder\": " << (q.model.encoder ? "true" : "false")
       << ", \"mode\": \"" << mode_name(q.run.mode) << "\", \"batch\": " << q.run.batch
       << ", \"sequence\": " << q.run.sequence << ", \"cublas_workspace\": " << q.run.blas_workspace << ", \"peak_live\": " << peak.peak_live << ", \"peak_by_category\": {";
  for (std::size_t i = 0; i < category_count; ++i)
    json << (i ? ", " : "") << "\"" << category_names[i] << "\": " << peak.at_peak[i];
  json << "}, \"needs\": {";
  for (std::size_t a = 0; a < needs.size(); ++a)
    json << (a ? ", " : "") << "\"" << needs[a].allocator << "\": " << needs[a].peak_reserved;
  json << "}, \"outside_allocator\": {\"bytes\": " << kept.total() << ", \"context\": " << kept.context
       << ", \"nccl\": " << kept.nccl << ", \"communicators\": " << kept.communicators
       << ", \"source\": " << (kept.asked ? "\"--context-gib\"" : "\"default\"") << "}, \"margin\": {\"outside_allocator\": "
       << kept.total() << ", \"fragmentation_replayed\": true, \"not_modelled\": [";
  for (std::size_t i = 0; i < not_modelled().size(); ++i) json << (i ? ", " : "") << json_quote(not_modelled()[i]);
  json << "]}, \"measured_runs\": " << accuracy.json << ", ";
  std::vector<std::uint64_t> smallest;  // per card, the fewest GPUs that fit (0: none)
  for (double card : q.cards_gib)
    if (q.sharding.asked)
      smallest.push_back(smallest_gpus(q, usable_of(card, kept_searching), allocators[0]));
  if (q.sharding.asked) {
    const sharding_flags& f = q.sharding;
    const parallel_plan& p = worst.parallel;
    const model_states ms = model_states_of(q.model, worst);
    const std::uint64_t micro = q.run.micro_batch == 0 ? q.run.batch : q.run.micro_batch;
    json << "\"sharding\": {\"strategy\": \"" << strategy_name(f) << "\", \"gpus\": " << f.gpus
         << ", \"data_parallel\": " << f.gpus / replica_gpus(f) << ", \"tensor_parallel\": " << f.tp
         << ", \"pipeline_parallel\": " << f.pp << ", \"micro_batches\": " << q.run.batch / micro
         << ", \"shards\": " << p.shards << ", \"master_weights\": " << (p.master_weights ? "true" : "false")
         << ", \"offload\": \"" << offload_name(p.offload) << "\", \"worst_stage\": " << p.stage
         << ", \"rank_parameters\": " << rank_parameters(q.model, p) << ", \"model_states\": {\"weights\": "
         << ms.weights << ", \"gradients\": " << ms.gradients << ", \"optimizer\": " << ms.optimizer
         << ", \"total\": " << ms.total() << "}, \"smallest_gpus\": [";
    for (std::size_t c = 0; c < q.cards_gib.size(); ++c) {
      const std::size_t capacity = static_cast<std::size_t>(q.cards_gib[c] * double(std::uint64_t{1} << 30));
      const std::uint64_t n = smallest[c];
      json << (c ? ", " : "") << "{\"capacity\": " << capacity << ", \"usable\": " << usable_of(q.cards_gib[c], kept_searching)
           << ", \"allocator\": \"" << allocators[0].name
           << "\", \"gpus\": " << (n == 0 ? std::string("null") : std::to_string(n)) << "}";
    }
    json << "]}, ";
  }
  json << "\"cards\": [";

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
    const std::size_t card_bytes = static_cast<std::size_t>(q.cards_gib[c] * double(std::uint64_t{1} << 30));
    const std::size_t capacity = usable_of(q.cards_gib[c], kept);  // what the allocators are replayed on
    out << "\n" << q.cards_gib[c] << " GiB card\n  for the allocator " << gib(double(capacity)) << " GiB, outside it "
        << gib(double(kept.total())) << " GiB\n";
    const std::string verdict = floor_verdict(q, peak, double(capacity));
    if (!verdict.empty()) out << "  " << verdict << "\n";
    if (q.sharding.asked) {
      const std::uint64_t n = smallest[c];
      out << "  smallest number of GPUs that fits, " << strategy_name(q.sharding) << " x tensor " << q.sharding.tp
          << " x pipeline " << q.sharding.pp << " (" << allocators[0].name << "): ";
      if (n != 0) out << n << "\n";
      else
        out << "none up to 65536: "
            << (q.run.parallel.shards_optimizer() && q.sharding.fsdp != "hybrid"
                    ? "what each rank keeps whole (activations, unsharded state, gathered layers) exceeds the card"
                    : "more ranks shard nothing more")
            << "\n";
    }
    json << (c ? ", " : "") << "{\"capacity\": " << card_bytes << ", \"usable\": " << capacity
         << ", \"outside_allocator\": " << kept.total() << ", \"verdict\": " << json_quote(verdict)
         << ", \"allocators\": [";
    // On this card, per allocator: whether it fits, and what it reserves here when it does
    // (a capped pool grows less than an unbounded one) or needs when it does not. The text's
    // headroom and the page's bars are drawn from this one figure.
    std::vector<outcome> results;
    for (std::size_t a = 0; a < allocators.size(); ++a) {
      const bool fits = fits_on(q.model, q.run, capacity, allocators[a]);
      const bool capped = fits && needs[a].peak_reserved > capacity;
      results.push_back({allocators[a].name,
                         capped ? replay_on(base, capacity, {allocators[a]})[0].peak_reserved : needs[a].peak_reserved,
                         fits});
    }
    char line[256];
    std::snprintf(line, sizeof line, "  %-19s %7s %14s", "allocator", "fits", "headroom GiB");
    out << line << (q.search ? "   largest batch, sequence" : "") << "\n";
    for (std::size_t a = 0; a < results.size(); ++a) {
      const outcome& r = results[a];
      const double headroom = double(capacity) - double(r.peak_reserved);
      std::snprintf(line, sizeof line, "  %-19s %7s %14s", r.allocator.c_str(), r.fits ? "yes" : "OOM",
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
    if (q.search) {
      out << "  margin of the largest batch and sequence: " << gib(double(kept.total()))
          << " GiB outside the allocator; each allocator's fragmentation is in its replay at " << gib(double(capacity))
          << " GiB\n";
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
    page.card(q.cards_gib[c], card_bytes, kept.total(), verdict, results, rows, names, best.fits);
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
    const transformer_model& m = p.model;
    std::string kind = m.encoder ? ", encoder" : "";
    if (m.mixture())
      kind += ", " + std::to_string(m.experts) + " experts, " + std::to_string(m.experts_per_token) + " a token";
    std::printf("%-18s %6.2fB params  layers %llu, hidden %llu, heads %llu/%llu kv, ffn %llu (%s%s), vocab %llu  [%s]\n",
                m.name.c_str(), double(m.parameters()) / 1e9, (unsigned long long)m.layers,
                (unsigned long long)m.hidden, (unsigned long long)m.heads, (unsigned long long)m.kv_heads,
                (unsigned long long)m.ffn, m.mlp == mlp_kind::gelu ? "GELU" : "SwiGLU", kind.c_str(),
                (unsigned long long)m.vocab, p.source);
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
    request q = parse(args);
    check_sharding(q);
    check_outside(q);
    q.run = rank_run(q, q.sharding.gpus);
    return answer(q);
  } catch (const usage_error& e) {
    std::cerr << "vram-fit: " << e.what() << " (see vram-fit --help)\n";
    return 2;
  } catch (const vram::invalid_argument& e) {  // a model or run that cannot be: the flags' words
    std::cerr << "vram-fit: " << as_asked(e.what()) << " (see vram-fit --help)\n";
    return 2;
  } catch (const input_error& e) {
    std::cerr << "vram-fit: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "vram-fit: " << e.what() << "\n";
    return 1;
  }
}

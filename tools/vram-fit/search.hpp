#pragma once
// vram-fit's search: a step replayed on each allocator on a card, what a run needs when
// nothing refuses it, whether it fits, the largest batch and sequence that fit (bisection),
// and the remedies combined. A room of main.cpp, included by it alone.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <vram-fit/flags.hpp>
#include <vram-fit/remedies.hpp>
#include <vram-replay/lineup.hpp>
#include <vram/trace/model.hpp>
#include <vram/trace/step.hpp>

namespace {

using namespace vram::trace;
using vram_fit::remedy;
using vram_fit::remedies_for;

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", bytes / double(std::uint64_t{1} << 30));
  return b;
}

/// The allocators a whole model step is replayed on: vram-replay's default lineup but the
/// activation arena (a bump allocator for activations alone, not for weights and state), and
/// PyTorch's caching allocator (modelled), which a PyTorch run reserves through unless told otherwise.
std::vector<vram_replay::allocator_config> fit_allocators() {
  std::vector<vram_replay::allocator_config> out;
  for (auto& a : vram_replay::default_allocators())
    if (a.name != "arena") out.push_back(std::move(a));
  out.push_back(vram_replay::torch_caching_model_config());
  return out;
}

/// One allocator on one card: what it reserved, and whether the step ran without a refusal.
struct outcome {
  std::string allocator;
  std::uint64_t peak_reserved = 0;
  bool fits = false;
  bool returned_to_device = false;  ///< it freed memory back to the device during the step
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
    out.push_back({a.name, r.peak_reserved_bytes, r.ooms == 0 && r.error.empty(), r.upstream_deallocations != 0});
  }
  return out;
}

/// A capacity no step asks for: what an allocator reserves when nothing refuses it.
std::size_t unbounded_for(const category_peak& peak) {
  return static_cast<std::size_t>(std::min<std::uint64_t>(4 * peak.peak_live + (std::uint64_t{16} << 30),
                                                          std::uint64_t{1} << 46));
}

/// A model and a run as a key, for remembering what the run needs.
std::string key_of(const transformer_model& m, const step_options& o) {
  std::ostringstream k;
  k << m.layers << ' ' << m.hidden << ' ' << m.heads << ' ' << m.kv_heads << ' ' << m.ffn << ' ' << m.vocab << ' '
    << m.positions << ' ' << int(m.mlp) << ' ' << m.biases << ' ' << m.tied_embeddings << ' ' << m.experts << ' '
    << m.experts_per_token << ' ' << m.encoder << ' ' << m.token_types << " | " << int(o.mode) << ' ' << o.batch << ' ' << o.sequence << ' ' << o.micro_batch << ' ' << int(o.weights) << ' '
    << o.autocast << ' ' << int(o.optimizer) << ' ' << o.checkpoint_every << ' ' << o.flash_attention << ' '
    << o.lora_rank << ' ' << int(o.kv_cache) << ' ' << o.decode_steps << ' ' << o.steps << ' ' << o.double_quant << ' '
    << o.foreach << ' ' << o.four_bit.keeps_input << o.four_bit.from_fp16 << o.four_bit.head;
  const parallel_plan& p = o.parallel;
  k << " | " << int(p.sharding) << ' ' << p.stage_of_zero << ' ' << p.shards << ' ' << p.tensor << ' ' << p.pipeline
    << ' ' << p.stage << ' ' << p.master_weights << ' ' << int(p.offload);
  return k.str();
}

/// The ranks whose worst is a run's answer: the one rank of a run without a pipeline; else the
/// first stage (the most micro-batches in flight, the embedding) and the last (the head and the
/// logits). A stage between holds as many layers as the first, fewer micro-batches in flight
/// and no embedding: never more than the first.
std::vector<step_options> ranks_of(const step_options& o) {
  step_options first = o, last = o;
  first.parallel.stage = 0;
  if (o.parallel.pipeline == 1) return {first};
  last.parallel.stage = o.parallel.pipeline - 1;
  return {first, last};
}

/// What one rank of run `o` reserves on `allocator` when nothing refuses it, remembered per run
/// and allocator (the remedies and their combinations ask for the same runs on every card);
/// `peak` its live bytes, `returned` whether the allocator freed memory back to the device.
std::uint64_t rank_needs(const transformer_model& m, const step_options& o, const vram_replay::allocator_config& allocator,
                         category_peak* peak = nullptr, bool* returned = nullptr) {
  struct need {
    outcome unbounded;
    category_peak peak;
  };
  static std::map<std::string, need> known;
  const std::string key = allocator.name + ' ' + key_of(m, o);
  auto it = known.find(key);
  if (it == known.end()) {
    step_trace t = generate_step(m, o);
    category_peak p = peak_by_category(t);
    it = known.emplace(key, need{replay_on(t, unbounded_for(p), {allocator})[0], p}).first;
  }
  if (peak != nullptr) *peak = it->second.peak;
  if (returned != nullptr) *returned = it->second.unbounded.returned_to_device;
  return it->second.unbounded.peak_reserved;
}

/// The rank of run `o` (ranks_of) that needs the most on `allocator`: a pipeline's worst stage.
step_options worst_rank(const transformer_model& m, const step_options& o, const vram_replay::allocator_config& allocator) {
  std::vector<step_options> ranks = ranks_of(o);
  std::size_t worst = 0;
  for (std::size_t i = 1; i < ranks.size(); ++i)
    if (rank_needs(m, ranks[i], allocator) > rank_needs(m, ranks[worst], allocator)) worst = i;
  return ranks[worst];
}

/// What the worst rank of run `o` reserves on `allocator` when nothing refuses it.
std::uint64_t needs_of(const transformer_model& m, const step_options& o, const vram_replay::allocator_config& allocator,
                       category_peak* peak = nullptr) {
  return rank_needs(m, worst_rank(m, o, allocator), allocator, peak);
}

/// Whether every rank of run `o` fits `capacity` on `allocator`: its step replayed at that
/// capacity without a refusal, remembered per run, capacity and allocator. A rank whose live
/// bytes alone exceed the capacity cannot fit, and is not replayed. One that needs no more than
/// the capacity unbounded fits without a capped replay only when its allocator returned nothing
/// to the device: the simulated device then places every request after the last, and a capped
/// replay is the unbounded one. Where the allocator frees to the device (`upstream`), its
/// address space fragments, and a request can be refused with fewer bytes reserved than the
/// card holds: the capped replay decides.
bool fits_on(const transformer_model& m, const step_options& o, std::size_t capacity,
             const vram_replay::allocator_config& allocator) {
  static std::map<std::string, bool> known;
  for (const step_options& rank : ranks_of(o)) {
    category_peak p;
    bool returned = false;
    const std::uint64_t needs = rank_needs(m, rank, allocator, &p, &returned);
    if (p.peak_live > capacity) return false;
    if (needs <= capacity && !returned) continue;
    const std::string key = allocator.name + ' ' + std::to_string(capacity) + ' ' + key_of(m, rank);
    auto it = known.find(key);
    if (it == known.end())
      it = known.emplace(key, replay_on(generate_step(m, rank), capacity, {allocator})[0].fits).first;
    if (!it->second) return false;
  }
  return true;
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

/// When the weights and what the mode must keep beside them exceed what a card leaves the
/// allocator (`capacity`) before any activation, no allocator and no batch can fit: say so,
/// with the numbers.
std::string floor_verdict(const request& q, const category_peak& peak, double capacity) {
  const double w = double(peak.own_peak[0]), g = double(peak.own_peak[1]), o = double(peak.own_peak[2]);
  std::ostringstream s;
  const std::string card = "the " + gib(capacity) + " GiB the card leaves the allocator";
  if (!q.run.parallel.single()) {  // one rank's share: more ranks or a deeper sharding is the answer
    if (w + g + o > capacity)
      s << "on each rank, weights, gradients and optimizer state at their peaks (" << gib(w + g + o)
        << " GiB) exceed " << card << ": more ranks, a deeper sharding (--zero 3, --fsdp full), --tp, --pp or --offload";
    return s.str();
  }
  if (w > capacity) {
    s << "the weights alone (" << gib(w) << " GiB) exceed " << card << ": quantize the base (int8, int4) or shard the model";
  } else if (q.run.mode == run_mode::training && w + g > capacity) {
    s << "full training cannot fit: weights " << gib(w) << " + gradients " << gib(g) << " = " << gib(w + g)
      << " GiB exceed " << card << " before any activation or optimizer state; only a frozen base (--mode lora, a "
         "quantized base) or offloading can fit";
  } else if (w + g + o > capacity) {
    s << "weights, gradients and optimizer state (" << gib(w + g + o)
      << " GiB) exceed " << card << ": a lighter optimizer (8-bit AdamW, SGD), a frozen base or offloading is needed";
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

}  // namespace

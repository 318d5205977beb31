#pragma once
// vram-fit's sharded training: one rank's plan from the flags (refusing what cannot run
// together), the model-state bytes of a rank by the ZeRO and FSDP rules, the lines saying what
// is sharded and how, and the smallest number of GPUs that fits. A room of main.cpp, included
// by it alone. The rules and their sources are in docs/fit.md, "Sharded training".

#include <cstdint>
#include <sstream>
#include <string>

#include <vram-fit/flags.hpp>
#include <vram-fit/search.hpp>
#include <vram/trace/step.hpp>

namespace {

using namespace vram::trace;

/// The tensor-parallel times pipeline ranks one model replica spans.
std::uint64_t replica_gpus(const sharding_flags& f) { return f.tp * f.pp; }

/// Refuses the sharding flags that contradict each other or the run (exit 2, one line), and
/// turns --micro-batches into the micro-batch size.
void check_sharding(request& q) {
  sharding_flags& f = q.sharding;
  const auto n = [](std::uint64_t v) { return std::to_string(v); };
  if (f.micro_batches != 0) {
    if (q.run.micro_batch != 0) throw usage_error("--micro-batches and --micro-batch say the same thing: give one");
    if (q.run.batch % f.micro_batches != 0)
      throw usage_error("--micro-batches (" + n(f.micro_batches) + ") must divide --batch (" + n(q.run.batch) + ")");
    q.run.micro_batch = q.run.batch / f.micro_batches;
  }
  if (!f.asked) return;
  if (f.zero && !f.fsdp.empty()) throw usage_error("--zero and --fsdp are two ways to shard the same state: give one");
  if (q.run.mode != run_mode::training)
    throw usage_error("--gpus, --zero, --fsdp, --tp, --pp and --offload model full training (--mode training), not "
                      "--mode " + std::string(mode_name(q.run.mode)));
  if (f.gpus == 0) f.gpus = replica_gpus(f);
  if (f.gpus % replica_gpus(f) != 0)
    throw usage_error("--gpus (" + n(f.gpus) + ") must be a multiple of --tp x --pp (" + n(replica_gpus(f)) + ")");
  const bool hybrid = f.fsdp == "hybrid";
  if (f.node_gpus != 0 && !hybrid) throw usage_error("--node-gpus goes with --fsdp hybrid");
  if (hybrid && f.node_gpus == 0) throw usage_error("--fsdp hybrid needs --node-gpus G (the GPUs of one node)");
  if (hybrid && (f.node_gpus % replica_gpus(f) != 0 || f.gpus % f.node_gpus != 0))
    throw usage_error("--node-gpus (" + n(f.node_gpus) + ") must divide --gpus (" + n(f.gpus) +
                      ") and be a multiple of --tp x --pp (" + n(replica_gpus(f)) + ")");
  if (f.pp > 1 && f.zero && *f.zero >= 2)
    throw usage_error("--zero " + n(std::uint64_t(*f.zero)) +
                      " with --pp: DeepSpeed's pipeline engine shards the optimizer state only (--zero 1)");
  if (f.pp > 1 && !f.fsdp.empty()) throw usage_error("--fsdp with --pp is not modelled (give --zero 1 or none)");
  const bool shards_state = (f.zero && *f.zero >= 1) || !f.fsdp.empty();
  if (f.offload != offload_kind::none && !shards_state)
    throw usage_error("--offload needs sharded state: --zero 1, 2 or 3, or --fsdp");
  if (f.offload == offload_kind::optimizer && !f.fsdp.empty())
    throw usage_error("--offload optimizer: FSDP offloads the parameters with their gradients and optimizer state "
                      "(--offload params), not the optimizer state alone");
  if (f.offload == offload_kind::params && !((f.zero && *f.zero == 3) || f.fsdp == "full" || hybrid))
    throw usage_error("--offload params needs sharded parameters: --zero 3, --fsdp full or --fsdp hybrid");
  if (!f.master_weights && !f.zero && f.fsdp.empty()) throw usage_error("--no-master-weights goes with --zero or --fsdp");
}

/// The run of one rank (stage 0) when `gpus` GPUs run `q`'s strategy.
step_options rank_run(const request& q, std::uint64_t gpus) {
  const sharding_flags& f = q.sharding;
  step_options o = q.run;
  if (!f.asked) return o;
  parallel_plan& p = o.parallel;
  p.tensor = f.tp;
  p.pipeline = f.pp;
  p.stage = 0;
  const std::uint64_t data_parallel = gpus / replica_gpus(f);
  if (f.zero) {
    p.sharding = shard_kind::zero;
    p.stage_of_zero = *f.zero;
  } else if (!f.fsdp.empty()) {
    p.sharding = shard_kind::fsdp;
    p.stage_of_zero = f.fsdp == "grad-op" ? 2 : 3;
  }
  p.shards = p.sharding == shard_kind::none ? 1 : f.fsdp == "hybrid" ? f.node_gpus / replica_gpus(f) : data_parallel;
  p.master_weights = p.sharding != shard_kind::none && f.master_weights && o.weights == number_format::bf16;
  p.offload = f.offload;
  return o;
}

/// A rank's model state by the sharding rules alone (nothing generated): what lives on its
/// device between steps. Ψ is the rank's parameters (rank_parameters), N the shards.
struct model_states {
  std::uint64_t weights = 0, gradients = 0, optimizer = 0;
  [[nodiscard]] std::uint64_t total() const { return weights + gradients + optimizer; }
};

model_states model_states_of(const transformer_model& m, const step_options& o) {
  const parallel_plan& p = o.parallel;
  const std::uint64_t psi = rank_parameters(m, p), shard = (psi + p.shards - 1) / p.shards;
  const std::uint64_t w = bytes_of(o.weights, 1);
  const bool fsdp_master = p.sharding == shard_kind::fsdp && p.master_weights;
  const std::uint64_t kept = fsdp_master ? 4 : w;  // a sharded parameter's (and its gradient's) bytes
  model_states s;
  s.weights = !p.shards_parameters() ? psi * w : p.offload == offload_kind::params ? 0 : shard * kept;
  s.gradients = !p.shards_gradients() ? psi * w : p.offload != offload_kind::none ? 0 : shard * kept;
  if (p.shards_optimizer() && p.offload != offload_kind::none) return s;
  const std::uint64_t held = p.shards_optimizer() ? shard : psi, moment = p.master_weights ? 4 : w;
  switch (o.optimizer) {
    case optimizer_kind::adamw: s.optimizer = 2 * moment * held; break;
    case optimizer_kind::sgd: s.optimizer = moment * held; break;
    case optimizer_kind::adamw_8bit: s.optimizer = 2 * (held + 4 * ((held + 255) / 256)); break;  // large tensors' rule
    case optimizer_kind::none:
    case optimizer_kind::paged_adamw: break;  // in managed memory (a partition is one large tensor)
  }
  if (p.master_weights && p.sharding == shard_kind::zero && o.optimizer != optimizer_kind::none) s.optimizer += 4 * held;
  return s;
}

/// The strategy as asked: zero-0 to zero-3, fsdp-full, fsdp-grad-op, fsdp-hybrid, replicated.
std::string strategy_name(const sharding_flags& f) {
  if (f.zero) return "zero-" + std::to_string(*f.zero);
  return f.fsdp.empty() ? "replicated" : "fsdp-" + f.fsdp;
}
const char* offload_name(offload_kind k) { return k == offload_kind::none ? "none" : k == offload_kind::optimizer ? "optimizer" : "params"; }

/// The lines that say which figures are one rank's and how each is split.
std::string sharding_lines(const request& q, const transformer_model& m, const step_options& worst) {
  const sharding_flags& f = q.sharding;
  const parallel_plan& p = worst.parallel;
  std::ostringstream s;
  s << "per rank of " << f.gpus << " GPUs (data parallel " << f.gpus / replica_gpus(f) << " x tensor " << f.tp
    << " x pipeline " << f.pp << "; each rank runs --batch " << q.run.batch << "): ";
  const std::uint64_t psi = rank_parameters(m, p);
  if (p.sharding == shard_kind::none) s << "model state replicated";
  else {
    s << strategy_name(f) << ", "
      << (p.shards_parameters() ? "weights, gradients and optimizer state"
          : p.shards_gradients() ? "gradients and optimizer state"
          : p.shards_optimizer() ? "optimizer state"
                                 : "nothing")
      << " split over " << p.shards << " ranks (ceil(" << psi << " / " << p.shards << ") elements each)";
    if (p.shards_parameters())
      s << (p.stage_of_zero == 2 ? ", gathered whole for the forward and backward" : ", each layer gathered around its use");
    if (p.master_weights) s << "; bf16 weights with an fp32 master copy and fp32 moments";
    if (p.offload != offload_kind::none)
      s << "; " << (p.offload == offload_kind::params ? "parameters, " : "") << "optimizer state and gradient partition in host memory";
  }
  s << "; activations whole per rank\n";
  if (f.tp > 1)
    s << "tensor parallel " << f.tp << ": q, k, v, o, the MLP's matrices, the embedding and the head split 1/" << f.tp
      << ", the norms whole; activations of q, k, v, attention, the MLP's inner width and the logits split, the "
         "norms' inputs and the residual stream whole\n";
  if (f.pp > 1) {
    const std::uint64_t micro = q.run.micro_batch == 0 ? q.run.batch : q.run.micro_batch, mbs = q.run.batch / micro;
    s << "pipeline " << f.pp << ": " << m.layers / f.pp << " layers a stage, 1F1B over " << mbs
      << " micro-batches: stage 0 holds " << std::min<std::uint64_t>(f.pp, mbs) << " in flight, the last stage 1; the "
      << "figures are stage " << p.stage << "'s (the worst)\n";
  }
  const model_states ms = model_states_of(m, worst);
  s << "model state per rank by the sharding rules: weights " << gib(double(ms.weights)) << " + gradients "
    << gib(double(ms.gradients)) << " + optimizer " << gib(double(ms.optimizer)) << " = " << gib(double(ms.total()))
    << " GiB (Psi " << psi << ")\n";
  return s.str();
}

/// The smallest number of GPUs for which every rank of `q`'s strategy fits `capacity` on
/// `allocator`; 0 when none up to 65536 does. Only the data-parallel degree varies (tensor and
/// pipeline degrees as asked). Replicated state and hybrid FSDP (sharded inside a node) do not
/// shrink with more ranks: one replica, or one node, fits or nothing does. Fitting is taken as
/// monotone in the ranks: a bisection over the data-parallel degree, each probe pruned by the
/// model state's rule before any trace is generated.
std::uint64_t smallest_gpus(const request& q, std::size_t capacity, const vram_replay::allocator_config& allocator) {
  const sharding_flags& f = q.sharding;
  const std::uint64_t replica = replica_gpus(f);
  auto fits = [&](std::uint64_t gpus) {
    const step_options o = rank_run(q, gpus);
    if (o.optimizer != optimizer_kind::adamw_8bit)  // the rule is exact: a rank holds all of it at the step
      for (const step_options& rank : ranks_of(o))
        if (model_states_of(q.model, rank).total() > capacity) return false;
    return fits_on(q.model, o, capacity, allocator);
  };
  const step_options o = rank_run(q, f.gpus);
  if (!o.parallel.shards_optimizer()) return fits(replica) ? replica : 0;
  if (f.fsdp == "hybrid") return fits(f.node_gpus) ? f.node_gpus : 0;
  const std::uint64_t most = (std::uint64_t{1} << 16) / replica;  // data-parallel degrees
  if (fits(replica)) return replica;
  if (!fits(most * replica)) return 0;
  std::uint64_t lo = 1, hi = 2;  // !fits(lo), fits(hi) once found
  while (hi < most && !fits(hi * replica)) lo = hi, hi *= 2;
  if (hi > most) hi = most;
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid * replica) ? hi : lo) = mid;
  }
  return hi * replica;
}

}  // namespace

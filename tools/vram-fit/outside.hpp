#pragma once
// vram-fit's memory outside the allocator: what a card holds beside the step that is replayed
// (the CUDA context and its libraries, NCCL's buffers across GPUs), kept off every
// card before any allocator is replayed on it, and the margin an answer keeps. A room of
// main.cpp, included by it alone. The figures and their sources are in docs/fit.md, "Memory
// outside the allocator".

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <vram-fit/flags.hpp>
#include <vram-fit/search.hpp>
#include <vram/core/parse.hpp>

namespace {

// Tunable: each figure as its source gives it, in MiB.
/// An idle PyTorch CUDA context under lazy module loading, the default since CUDA 12.2 on Linux:
/// 426 MiB by nvidia-smi (PyTorch 2.10, CUDA 13.0, RTX 6000 Ada;
/// github.com/unslothai/unsloth-zoo/pull/1053), the largest of the published figures (about
/// 300 and 400 MB in github.com/pytorch/pytorch/issues/107667 and /109888; 287,047,680 bytes
/// with a small tensor in github.com/pytorch/pytorch/pull/86509, against 666,632,192 loading
/// every module eagerly).
/// cuBLAS's workspaces are not here: PyTorch takes them from its caching allocator, so the
/// generated step allocates them (step_options::blas_workspace).
inline constexpr std::uint64_t context_mib = 426;
/// What one NCCL communicator holds on a rank: 688 MB for a group of more than two A100s over
/// NVLink after an all-reduce (github.com/NVIDIA/nccl/issues/964; a group of two, 544 MB),
/// taken here as MiB, the larger reading. Its buffers grow with the channels (NCCL_BUFFSIZE,
/// 4 MiB by default, per channel and peer).
inline constexpr std::uint64_t nccl_communicator_mib = 688;

// Derived: the defaults, whole and quarter GiB that cover the figures above.
inline constexpr std::uint64_t mib = std::uint64_t{1} << 20;
/// The context and its libraries on every card: 512 MiB.
inline constexpr std::uint64_t default_context_bytes = 512 * mib;
/// Each NCCL communicator a rank belongs to: 768 MiB.
inline constexpr std::uint64_t default_communicator_bytes = 768 * mib;
static_assert(context_mib <= default_context_bytes / mib);
static_assert(nccl_communicator_mib <= default_communicator_bytes / mib);

/// Memory each card holds outside the allocator; the allocator is replayed on what is left.
struct outside_allocator {
  std::uint64_t context = 0;        ///< the CUDA context and its libraries
  std::uint64_t nccl = 0;           ///< NCCL's communicators, communicators x one each
  std::uint64_t communicators = 0;  ///< the process groups of degree above 1 a rank is in
  bool asked = false;               ///< --context-gib gave the whole of it
  [[nodiscard]] std::uint64_t total() const { return context + nccl; }
};

/// The process groups of degree above 1 one rank of `gpus` GPUs is in: data parallel, tensor,
/// pipeline, and hybrid FSDP's replication across nodes.
std::uint64_t communicators_of(const sharding_flags& f, std::uint64_t gpus) {
  if (!f.asked) return 0;
  const std::uint64_t replica = f.tp * f.pp;
  const std::uint64_t data = f.fsdp == "hybrid" ? f.node_gpus / replica : gpus / replica;
  return (data > 1) + (f.tp > 1) + (f.pp > 1) + (f.fsdp == "hybrid" && gpus > f.node_gpus);
}

/// What `q` keeps outside the allocator on each card when it runs on `gpus` GPUs.
outside_allocator outside_of(const request& q, std::uint64_t gpus) {
  if (q.context_bytes) return {*q.context_bytes, 0, 0, true};
  const std::uint64_t n = communicators_of(q.sharding, gpus);
  return {default_context_bytes, n * default_communicator_bytes, n, false};
}

/// For the smallest-number-of-GPUs search: the most it keeps at any number of GPUs tried, the
/// data-parallel communicator (and hybrid FSDP's across nodes) counted at each.
outside_allocator outside_for_search(const request& q) {
  const sharding_flags& f = q.sharding;
  return outside_of(q, std::max<std::uint64_t>(f.gpus, 2 * f.tp * f.pp * (f.fsdp == "hybrid" ? f.node_gpus : 1)));
}

/// Refuses a card that what is kept outside the allocator would fill (exit 2, one line).
void check_outside(const request& q) {
  const outside_allocator o = outside_for_search(q);
  for (double card : q.cards_gib)
    if (card * double(std::uint64_t{1} << 30) <= double(o.total())) {
      std::ostringstream c;
      c << card;
      if (o.asked)
        throw usage_error(vram::refusal("--context-gib", q.context_text,
                                        "less than every card (--gpu): it fills the card of " + c.str() + " GiB"));
      throw usage_error("--gpu: the card of " + c.str() + " GiB holds no more than the " + gib(double(o.total())) +
                        " GiB kept outside the allocator (the CUDA context, the libraries, NCCL): give --context-gib");
    }
}

/// One line: what each card keeps outside the allocator, and where the figure comes from.
std::string outside_line(const outside_allocator& o) {
  std::string s = "outside the allocator, on each card: " + gib(double(o.total())) + " GiB (";
  if (o.asked) return s + "--context-gib)\n";
  s += "CUDA context " + gib(double(o.context));
  if (o.communicators != 0)
    s += " + NCCL " + std::to_string(o.communicators) + " communicator" + (o.communicators > 1 ? "s" : "") + " x " +
         gib(double(default_communicator_bytes)) + " = " + gib(double(o.nccl));
  return s + "; --context-gib sets it)\n";
}

/// What an answer does not model, for the margin's line and the JSON's `margin.not_modelled`.
const std::vector<std::string>& not_modelled() {
  static const std::vector<std::string> v = {
      "PyTorch's caching allocator's options (it is replayed with its defaults)",
      "cuDNN and fused kernels' workspaces", "CUDA graphs' private pools", "memory of other processes on the card"};
  return v;
}

}  // namespace

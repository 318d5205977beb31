#pragma once
// vram_replay::allocator_config: the allocator configurations vram-replay compares, each a
// named function that builds a fresh allocator on a fresh device and replays a trace on it.

#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/budget_slab.hpp>
#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/source/simulated_device_source.hpp>
#include <vram/trace/replay.hpp>
#include <peers/rmm_pool_model.hpp>
#include <peers/torch_caching_model.hpp>

namespace vram_replay {

using namespace vram;
using vram::trace::replay;
using vram::trace::replay_options;
using vram::trace::replay_result;
using vram::trace::trace;

/// One way of serving a trace. `run` builds everything afresh (device included), so runs are
/// independent and may be repeated.
struct allocator_config {
  std::string name;
  std::string description;
  std::function<replay_result(const trace&, const replay_options&)> run;
};

namespace detail {

/// One host stream per trace stream, so stream-ordered allocators see the trace's streams.
struct trace_streams {
  explicit trace_streams(std::uint32_t n) : streams(n) {
    for (auto& s : streams) refs.emplace_back(s);
  }
  std::vector<host_stream> streams;
  std::vector<stream_ref> refs;
};

/// 2 MiB: the page cudaMalloc and cuMemCreate map.
inline constexpr std::size_t device_granularity = std::size_t{2} << 20;

inline simulated_device_source device(std::size_t capacity, bool contiguous) {
  return simulated_device_source(
      simulated_device_options{.capacity = capacity, .granularity = device_granularity, .contiguous = contiguous});
}

/// Adds nothing to a result.
struct no_note {
  template <class A>
  void operator()(const A&, replay_result&) const noexcept {}
};

/// Builds the allocator with `make()` and replays `t` on it: on one host stream per trace
/// stream, or (`on_streams` false, for stream-bound allocators) all on the synchronous stream.
/// `annotate(allocator, result)` runs after the replay, before the allocator is destroyed.
template <class Make, class Annotate = no_note>
replay_result run_with(const char* name, const char* code, const trace& t, const replay_options& o, Make&& make,
                       bool on_streams = true, Annotate&& annotate = {}) {
  trace_streams streams(on_streams ? t.streams : 0);
  auto allocator = make();
  auto result = replay(t, *allocator, [&] { return allocator->stats(); }, streams.refs, o);
  result.allocator = name;
  result.code = code;
  annotate(*allocator, result);
  return result;
}

/// One line on a planned_pool's plan, for the report.
inline std::string describe(const plan_summary& s) {
  if (s.plans_made == 0)
    return s.plans_refused != 0 ? "no plan: the device could not hold its range" : "no plan (the trace was not replayed as steps)";
  char line[256];
  std::snprintf(line, sizeof line,
                "plan of %zu allocations (%zu placed), range %.4f of its lower bound%s, planned in %.1f ms (%zu orders "
                "tried); last step: %zu served from the plan, %zu off it; %zu plan(s) made",
                s.entries, s.planned_entries,
                s.lower_bound_bytes == 0 ? 1.0 : double(s.range_bytes) / double(s.lower_bound_bytes),
                s.lower_part_bytes != 0 ? " in two parts" : "",
                double(s.planning_time.count()) / 1e6, s.orders_tried, s.last_step_planned, s.last_step_off_plan,
                s.plans_made);
  return line;
}

}  // namespace detail

/// stream_pool on a contiguous (VMM-like) device, growing in place on demand.
inline allocator_config pool_contiguous_config() {
  return {"pool-contiguous", "stream_pool on a contiguous simulated device (cuda_vmm_source-like), growing on demand",
          [](const trace& t, const replay_options& o) {
            return detail::run_with("pool-contiguous", "vram::stream_pool<vram::cuda_vmm_source>", t, o, [&] {
              return std::make_unique<stream_pool<simulated_device_source>>(detail::device(o.capacity, true),
                                                                            stream_pool_options{});
            });
          }};
}

/// pool-contiguous without its per-stream bins (small_max = 0): every block placed by best
/// fit and coalesced at its free. On request: what the bins' speed costs in placement.
inline allocator_config pool_no_bins_config() {
  return {"pool-no-bins", "stream_pool on a contiguous simulated device, no per-stream bins (small_max = 0): best fit for every block",
          [](const trace& t, const replay_options& o) {
            return detail::run_with("pool-no-bins", "vram::stream_pool<vram::cuda_vmm_source> with stream_pool_options{.small_max = 0}", t, o, [&] {
              return std::make_unique<stream_pool<simulated_device_source>>(detail::device(o.capacity, true),
                                                                            stream_pool_options{.small_max = 0});
            });
          }};
}

/// planned_pool over pool-contiguous's device: learns the first step of a trace replayed as
/// steps (vram-replay --steps) and serves the later ones from its plan. On request: without
/// steps it is told no boundary and serves everything online, like pool-contiguous.
inline allocator_config pool_planned_config() {
  return {"pool-planned",
          "planned_pool on a contiguous simulated device: the first step recorded and placed offline, the later ones "
          "served from the plan (use with --steps 2 or more)",
          [](const trace& t, const replay_options& o) {
            using pool = planned_pool<simulated_device_source>;
            return detail::run_with(
                "pool-planned", "vram::planned_pool<vram::cuda_vmm_source>", t, o, [&] { return std::make_unique<pool>(detail::device(o.capacity, true)); }, true,
                [](const pool& p, replay_result& r) { r.note = detail::describe(p.summary()); });
          }};
}

/// stream_pool on separate cudaMalloc-like chunks of 20 MiB (PyTorch's large-segment size)
/// or the request, whichever is larger.
inline allocator_config pool_segments_config() {
  return {"pool-segments", "stream_pool on cudaMalloc-like segments (20 MiB growth step, no merging across segments)",
          [](const trace& t, const replay_options& o) {
            return detail::run_with("pool-segments", "vram::stream_pool<vram::cuda_device_source> with stream_pool_options{.growth_step = 20 << 20}", t, o, [&] {
              return std::make_unique<stream_pool<simulated_device_source>>(
                  detail::device(o.capacity, false), stream_pool_options{.growth_step = std::size_t{20} << 20});
            });
          }};
}

/// activation_arena on a contiguous device, 64 MiB chunks: fits LIFO (activation) traces;
/// on others it shows what out-of-order frees cost a bump allocator. The arena is bound to
/// one stream, so the whole trace runs on the synchronous stream.
inline allocator_config arena_config() {
  return {"arena", "activation_arena (64 MiB chunks) on a contiguous simulated device",
          [](const trace& t, const replay_options& o) {
            return detail::run_with("arena", "vram::activation_arena<vram::cuda_vmm_source>", t, o, [&] {
              return std::make_unique<activation_arena<simulated_device_source>>(detail::device(o.capacity, true));
            }, false);
          }};
}

/// budget_slab with the whole capacity as its fixed device budget, spilling to a second
/// simulated device standing in for pinned host memory. Its reserved bytes are the budget
/// from the start, so it is not in the default list: use it with a --capacity below the
/// trace's peak to see spills (peak_spilled_bytes) where the others report OOMs.
inline allocator_config slab_config() {
  return {"slab", "budget_slab: the capacity as a fixed device budget, spilling to (simulated) host memory",
          [](const trace& t, const replay_options& o) {
            using slab = budget_slab<simulated_device_source, simulated_device_source>;
            return detail::run_with("slab", "vram::budget_slab<vram::cuda_device_source, vram::cuda_pinned_source>", t, o, [&] {
              return std::make_unique<slab>(detail::device(o.capacity, false),
                                            detail::device(std::size_t{1} << 40, false),
                                            budget_slab_options{.device_budget = o.capacity});
            });
          }};
}

/// Every allocation straight to the device (cudaMalloc / cudaFree each time): the baseline.
inline allocator_config upstream_config() {
  return {"upstream", "no pool: every allocation a cudaMalloc-like call on the simulated device (2 MiB pages)",
          [](const trace& t, const replay_options& o) {
            detail::trace_streams streams(t.streams);
            auto dev = detail::device(o.capacity, false);
            auto result = replay(t, dev, [&] { return dev.stats(); }, streams.refs, o);
            result.allocator = "upstream";
            result.code = "vram::cuda_device_source (cudaMalloc per allocation)";
            return result;
          }};
}

/// The peer: RMM's pool algorithm (rmm_pool_model.hpp) on cudaMalloc-like segments, starting
/// empty (an initial pool size of 0) and growing by doubling (no maximum size).
inline allocator_config rmm_pool_model_config() {
  return {"rmm-pool-model",
          "RMM's pool algorithm rebuilt (address-ordered lists: O(n) best fit and coalescing; growth by doubling on "
          "cudaMalloc-like segments; no CUDA events)",
          [](const trace& t, const replay_options& o) {
            return detail::run_with("rmm-pool-model", "rmm::mr::pool_memory_resource (RMM itself; modelled here)", t, o, [&] {
              return std::make_unique<peers::rmm_pool_model<simulated_device_source>>(detail::device(o.capacity, false));
            });
          }};
}

/// The peer PyTorch users run under: PyTorch's CUDA caching allocator (torch_caching_model.hpp,
/// default options) on cudaMalloc-like segments. On request: replaying a PyTorch snapshot on
/// it reproduces what PyTorch reserved, beside what vram's allocators would.
inline allocator_config torch_caching_model_config() {
  return {"torch-caching-model",
          "PyTorch's CUDA caching allocator rebuilt (default options: 512 B rounding, small pool of 2 MiB segments, "
          "20 MiB segments for 1-10 MiB, best fit per stream, splitting and merging within segments, cached segments "
          "released on a refusal; no CUDA events)",
          [](const trace& t, const replay_options& o) {
            return detail::run_with("torch-caching-model", "c10::cuda::CUDACachingAllocator (PyTorch itself; modelled here)", t, o, [&] {
              return std::make_unique<peers::torch_caching_model<simulated_device_source>>(detail::device(o.capacity, false));
            });
          }};
}

/// The default comparison, in report order.
inline std::vector<allocator_config> default_allocators() {
  return {pool_contiguous_config(), pool_segments_config(), arena_config(), upstream_config(), rmm_pool_model_config()};
}

/// Every configuration (the defaults, then those that only make sense on request).
inline std::vector<allocator_config> all_allocators() {
  auto all = default_allocators();
  all.push_back(pool_no_bins_config());
  all.push_back(pool_planned_config());
  all.push_back(slab_config());
  all.push_back(torch_caching_model_config());
  return all;
}

/// The configuration called `name` among `all`; throws std::invalid_argument listing the names.
inline allocator_config find_allocator(const std::vector<allocator_config>& all, const std::string& name) {
  std::string names;
  for (const auto& c : all) {
    if (c.name == name) return c;
    names += (names.empty() ? "" : ", ") + c.name;
  }
  throw std::invalid_argument("unknown allocator '" + name + "' (known: " + names + ")");
}

}  // namespace vram_replay

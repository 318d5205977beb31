// Repeating steps: host time per operation of planned_pool serving a step from its plan
// against stream_pool serving the same step online (the pool planned_pool falls back to),
// both on pool-contiguous's device (built-in steps, a generated training loop whose gradients
// cross the step boundary, shared traces); and the time planning takes, on recorded-like steps and
// at the placement's worst case (every block live at once: each one scans all placed).
//
//   bench.planned_steps --benchmark_min_time=0.2

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <vram-replay/lineup.hpp>
#include <vram/alloc/planned_pool.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/repeat_steps.hpp>
#include <vram/trace/step.hpp>
#include <vram/trace/workloads.hpp>

namespace {

using vram::trace::event;
using vram::trace::trace;

/// A generated step of GPT-2 small's training loop whose gradients cross the step boundary.
trace training_loop() {
  vram::trace::step_options o;
  o.batch = 4;
  o.sequence = 512;
  return vram::trace::training_loop_step(*vram::trace::find_preset("gpt2"), o);
}

/// The trace as three steps (repeat_steps), read once, and the stride of its ids: an id of
/// step k is an original id plus k strides.
struct stepped_trace {
  trace steps;
  std::uint64_t stride = 1;
};
const stepped_trace& stepped(const std::string& name) {
  static std::map<std::string, stepped_trace> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  trace t = name == "training"        ? vram::trace::transformer_training()
            : name == "training-loop" ? training_loop()
                                      : vram::trace::read_trace(std::string(VRAM_SHARED_TRACES) + "/" + name);
  stepped_trace out{vram::trace::repeat_steps(t, 3)};
  t.for_each_event([&](const event& e) { out.stride = std::max(out.stride, e.id + 1); });
  return cache.emplace(name, std::move(out)).first->second;
}

vram::simulated_device_source device() {
  return vram::simulated_device_source(vram::simulated_device_options{
      .capacity = std::size_t{80} << 30, .granularity = std::size_t{2} << 20, .contiguous = true});
}

/// Runs events [from, to) of `t` on `r`; a block's slot is its id modulo the step stride, so
/// the second step's events can run again and again (each step frees what the last one left).
struct slot {
  void* p = nullptr;
  std::size_t bytes = 0;
};

template <class R>
void run_events(R& r, const trace& t, std::size_t from, std::size_t to, std::vector<slot>& slots, std::uint64_t stride) {
  for (std::size_t i = from; i < to; ++i) {
    const event& e = t.events[i];
    slot& b = slots[e.id % stride];
    if (e.kind == event::op::alloc) {
      b = {r.allocate(vram::stream_ref{}, e.bytes), e.bytes};
    } else {
      r.deallocate(vram::stream_ref{}, b.p, b.bytes);
      b = {};
    }
  }
}

template <class R>
void serve_steps(benchmark::State& state, const std::string& name) {
  const trace* t = nullptr;
  std::uint64_t stride = 1;
  try {
    t = &stepped(name).steps;
    stride = stepped(name).stride;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  if (t->streams != 1) {  // the loop runs everything on the synchronous stream
    state.SkipWithError("a trace of one stream is needed");
    return;
  }
  std::vector<slot> slots(stride);
  R r(device());
  auto mark = [&] {
    if constexpr (vram::has_step_marks<R>) r.mark_step();
  };
  const std::size_t first = t->step_starts[1], second = t->step_starts[2];
  run_events(r, *t, 0, t->step_starts[0], slots, stride);  // the blocks live at the start
  mark();
  run_events(r, *t, t->step_starts[0], first, slots, stride);  // learned
  mark();
  for (auto _ : state) {
    run_events(r, *t, first, second, slots, stride);
    mark();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * (second - first)));
  if constexpr (vram::has_step_marks<R>) {
    auto s = r.summary();
    state.counters["off_plan"] = static_cast<double>(s.last_step_off_plan);
    state.counters["planned"] = static_cast<double>(s.last_step_planned);
  }
  for (slot& b : slots)  // leave nothing live
    if (b.p != nullptr) r.deallocate(vram::stream_ref{}, b.p, b.bytes);
}

/// A step of `n` blocks: nested lifetimes (activations freed in reverse) and short temporaries.
std::vector<vram::detail::planned_pool::lifetime> step_blocks(std::size_t n, bool all_live) {
  std::mt19937_64 rng(42);
  std::vector<vram::detail::planned_pool::lifetime> blocks;
  std::vector<std::size_t> open;
  std::uint32_t tick = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t size = 256 * (1 + rng() % 4096);
    if (all_live) {
      blocks.push_back({size, tick++, static_cast<std::uint32_t>(2 * n)});
      continue;
    }
    if (rng() % 3 == 0) {
      blocks.push_back({size, tick, tick + 1});
      tick += 2;
    } else {
      open.push_back(blocks.size());
      blocks.push_back({size, tick++, 0});
    }
  }
  while (!open.empty()) {
    blocks[open.back()].end = tick++;
    open.pop_back();
  }
  return blocks;
}

void planning(benchmark::State& state, bool all_live) {
  auto blocks = step_blocks(static_cast<std::size_t>(state.range(0)), all_live);
  vram::detail::planned_pool::placement where;
  for (auto _ : state) {
    where = vram::detail::planned_pool::place(blocks, std::chrono::nanoseconds(0));
    benchmark::DoNotOptimize(std::as_const(where.range));
  }
  state.counters["range_per_bound"] = double(where.range) / double(where.lower_bound);
  state.counters["orders"] = static_cast<double>(where.orders_tried);
}

int register_all() {
  using pool = vram::stream_pool<vram::simulated_device_source>;
  using planned = vram::planned_pool<vram::simulated_device_source>;
  for (const char* name : {"training", "training-loop", "memory.pickle", "medium_1024_training_memory_snapshot.pickle",
                           "df_index_resolver.json.gz", "pangu_2.6B.csv"}) {
    benchmark::RegisterBenchmark((std::string("step/") + name + "/pool-contiguous").c_str(),
                                 [name](benchmark::State& s) { serve_steps<pool>(s, name); });
    benchmark::RegisterBenchmark((std::string("step/") + name + "/pool-planned").c_str(),
                                 [name](benchmark::State& s) { serve_steps<planned>(s, name); });
  }
  benchmark::RegisterBenchmark("planning/nested", [](benchmark::State& s) { planning(s, false); })
      ->Arg(1000)->Arg(5000)->Arg(20000)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("planning/all-live (worst case)", [](benchmark::State& s) { planning(s, true); })
      ->Arg(1000)->Arg(5000)->Arg(20000)->Unit(benchmark::kMillisecond);
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();

// Replay speed: whole traces (built-in workloads and the shared real traces) replayed against
// each vram-replay allocator configuration, on the simulated device. Reports host time per
// operation and, as counters, peak reserved / peak live (the fragmentation overhead).
//
//   bench.replay --benchmark_min_time=0.2

#include <benchmark/benchmark.h>

#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <vram-replay/lineup.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/workloads.hpp>

namespace {

using vram::trace::trace;

const trace& workload(const std::string& name) {
  static std::map<std::string, trace> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  trace t;
  if (name == "training") t = vram::trace::transformer_training();
  else if (name == "inference") t = vram::trace::kv_cache_inference();
  else t = vram::trace::read_trace(std::string(VRAM_SHARED_TRACES) + "/" + name);
  return cache.emplace(name, std::move(t)).first->second;
}

void replay(benchmark::State& state, const std::string& name, const vram_replay::allocator_config& config) {
  const trace* t = nullptr;
  try {
    t = &workload(name);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  vram::trace::replay_options o;
  o.time_operations = false;
  o.series_points = 1;
  vram::trace::replay_result r;
  for (auto _ : state) {
    r = config.run(*t, o);
    benchmark::DoNotOptimize(std::as_const(r.peak_reserved_bytes));
  }
  // Items are trace operations (allocs + frees): items_per_second inverts to ns per op,
  // including setup of the device and pool per iteration.
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * t->events.size()));
  state.counters["reserved_per_live"] = r.reserved_per_live();
  state.counters["ooms"] = static_cast<double>(r.ooms);
}

int register_all() {
  for (const char* name : {"training", "inference", "memory.pickle", "df_index_resolver.json.gz", "pangu_2.6B.csv"})
    for (const auto& c : vram_replay::default_allocators())
      benchmark::RegisterBenchmark((std::string("replay/") + name + "/" + c.name).c_str(),
                                   [name, c](benchmark::State& s) { replay(s, name, c); })
          ->Unit(benchmark::kMillisecond);
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();

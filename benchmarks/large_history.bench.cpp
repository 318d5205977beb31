// Large histories end to end: a tracker writing N events to its event log
// (tracker_options::event_log) over a pool, then vram-replay's engine replaying the log as a
// stream (read_trace_stream) and, for comparison, read into memory (read_trace). Each stage
// runs in a child process, so its figures are its own: wall seconds and peak resident set
// (the child's ru_maxrss), reported as counters.
//
//   VRAM_LARGE_HISTORY_EVENTS=10000000 build-bench/benchmarks/bench.large_history
//
// (100 thousand events without the variable: what CI's smoke run of every benchmark takes.)
// The workload: two tenants, 64 blocks live at once per tenant, 4 KiB .. 4 MiB, on one
// stream; N / 2 allocations and N / 2 frees. The log is written to the temp directory and
// removed after the run.

#include <benchmark/benchmark.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <vram-replay/lineup.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/ref.hpp>
#include <vram/core/tenant.hpp>
#include <vram/source/host_source.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/read_trace_stream.hpp>

#include "support/child_peak_memory.hpp"  // (tests/support: the tests measure memory so too)

namespace {

struct stage_result {
  double seconds = 0;
  double peak_mib = 0;
  bool ok = false;
};

/// Runs `work` in a child process; its wall time and peak resident set.
stage_result in_child(const std::function<bool()>& work) {
  stage_result r;
  auto start = std::chrono::steady_clock::now();
  try {
    r.peak_mib = double(vram::test::child_peak_kib(work)) / 1024.0;
    r.ok = true;
  } catch (const std::runtime_error&) {
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

/// Writes `events` events through a tracker over a stream_pool into the log at `path`.
bool write_history(const std::string& path, std::size_t events) {
  using pool_t = vram::stream_pool<vram::host_source>;
  pool_t pool;
  auto reg = std::make_shared<vram::tenant_registry>();
  vram::tenant tenants[] = {reg->create("serving/llama"), reg->create("train")};
  vram::tracker_adaptor tracker{vram::ref(pool), vram::tracker_options{.registry = reg, .event_log = path}};
  std::vector<std::pair<void*, std::size_t>> live(128, {nullptr, 0});
  for (std::size_t i = 0; 2 * i < events; ++i) {
    vram::tenant_scope scope(tenants[i % 2]);
    auto& slot = live[i % live.size()];
    if (slot.first != nullptr) tracker.deallocate_sync(slot.first, slot.second);
    slot.second = std::size_t{4096} << (i * 7 % 11);
    slot.first = tracker.allocate_sync(slot.second);
  }
  for (auto [p, n] : live)
    if (p != nullptr) tracker.deallocate_sync(p, n);
  return tracker.flush_event_log();
}

/// Replays the log at `path` on pool-contiguous (as vram-replay does), streamed or held.
bool replay_history(const std::string& path, bool streamed, std::size_t events) {
  vram::trace::trace t = streamed ? vram::trace::read_trace_stream(path) : vram::trace::read_trace(path);
  auto r = vram_replay::pool_contiguous_config().run(t, vram::trace::replay_options{.time_operations = false});
  return r.ooms == 0 && r.events == events;
}

void large_history(benchmark::State& state) {
  const auto events = static_cast<std::size_t>(state.range(0));
  const std::string path =
      (std::filesystem::temp_directory_path() / ("vram-large-history-" + std::to_string(::getpid()) + ".csv")).string();
  stage_result write, streamed, held;
  for (auto _ : state) {
    write = in_child([&] { return write_history(path, events); });
    streamed = in_child([&] { return replay_history(path, true, events); });
    held = in_child([&] { return replay_history(path, false, events); });
  }
  std::error_code ec;
  double file_mib = double(std::filesystem::file_size(path, ec)) / double(1 << 20);
  std::filesystem::remove(path, ec);
  if (!write.ok || !streamed.ok || !held.ok) {
    state.SkipWithError("a stage failed (see its exit status)");
    return;
  }
  state.counters["events"] = double(events);
  state.counters["log_MiB"] = file_mib;
  state.counters["write_s"] = write.seconds;
  state.counters["write_ns_per_event"] = write.seconds * 1e9 / double(events);
  state.counters["write_peak_MiB"] = write.peak_mib;
  state.counters["stream_replay_s"] = streamed.seconds;
  state.counters["stream_replay_peak_MiB"] = streamed.peak_mib;
  state.counters["held_replay_s"] = held.seconds;
  state.counters["held_replay_peak_MiB"] = held.peak_mib;
}

}  // namespace

int main(int argc, char** argv) {
  const char* asked = std::getenv("VRAM_LARGE_HISTORY_EVENTS");
  long long events = asked != nullptr ? std::atoll(asked) : 100000;
  if (events < 1000) {
    std::fprintf(stderr, "bench.large_history: VRAM_LARGE_HISTORY_EVENTS must be at least 1000\n");
    return 2;
  }
  benchmark::RegisterBenchmark("large_history", large_history)
      ->Arg(events)
      ->Iterations(1)
      ->Unit(benchmark::kSecond)
      ->UseRealTime();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

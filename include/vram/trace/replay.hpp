#pragma once
// vram::trace::replay: runs a trace against one allocator and measures what it costs in
// memory (peak live vs peak reserved, OOMs) and in host time (ns per operation).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/trace/detail/quantiles.hpp>
#include <vram/trace/trace.hpp>

namespace vram::trace {

struct replay_options {
  /// Bytes of the (simulated) device.
  std::size_t capacity = std::size_t{80} << 30;
  /// Points kept in the time series (the series is downsampled to about this many).
  std::size_t series_points = 2000;
  /// Time each operation (steady_clock around each allocate/deallocate).
  bool time_operations = true;
  /// Called now and then with (events done, events total), e.g. for a progress line.
  std::function<void(std::size_t, std::size_t)> progress;
};

/// One point of the live/reserved time series.
struct series_point {
  std::size_t event = 0;
  std::uint64_t live_bytes = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t largest_free_block = 0;  ///< the allocator's, where its stats() report it
  std::optional<std::uint64_t> recorded_reserved_bytes;
  /// Live bytes per tenant (by event::tenant), where the trace names tenants.
  std::vector<std::uint64_t> live_by_tenant;
};

/// An allocator's free blocks by size class: class k holds the blocks of [2^k, 2^(k+1)) bytes.
struct free_block_histogram {
  bool captured = false;  ///< false: the allocator cannot list its free blocks, or peak live was not reached
  std::size_t at_event = 0;
  std::uint64_t blocks[64] = {};
  std::uint64_t bytes[64] = {};

  void add(std::size_t size) noexcept {
    if (size == 0) return;
    int k = 63 - __builtin_clzll(size);
    ++blocks[k];
    bytes[k] += size;
  }
};

/// The figures of one step of a trace replayed as repeated steps (the k-th starts at
/// trace::step_starts[k]).
struct step_figures {
  std::uint64_t peak_live_bytes = 0;
  /// Sampled at the step's boundaries, at its new peaks of live bytes and at series points
  /// (the allocators release nothing inside a step unless they run out of memory).
  std::uint64_t peak_reserved_bytes = 0;
};

/// The figures of one (trace, allocator) replay.
struct replay_result {
  std::string trace;
  std::string allocator;
  std::string code;   ///< the C++ a user writes for this allocator on a GPU ("" where none is given)
  std::string error;  ///< non-empty when the configuration could not run (e.g. no GPU)
  std::size_t events = 0, allocs = 0, frees = 0;
  std::size_t ooms = 0;  ///< allocations the allocator refused at this capacity (skipped, frees ignored)
  std::uint64_t peak_live_bytes = 0;      ///< sum of live requested bytes, at its peak
  std::uint64_t peak_reserved_bytes = 0;  ///< bytes the allocator held from the device, at its peak
  std::uint64_t reserved_at_peak_live = 0;
  std::size_t upstream_allocations = 0, upstream_deallocations = 0;
  std::uint64_t peak_spilled_bytes = 0;  ///< budget_slab: peak bytes served from the spill side
  /// Host time per operation, net of the timer's own cost (ns_clock, subtracted). Quantiles
  /// are interpolated within the clock's step where it moves in steps (detail::trace::step_quantile:
  /// 10 ns on the dev machines), so that they resolve what the step hides.
  double ns_per_op_p50 = 0, ns_per_op_p99 = 0, ns_per_op_mean = 0;
  /// Whether any operation was timed (replay_options::time_operations): else the ns figures are 0.
  bool timed = false;
  /// The timer's own cost: the median of an empty region timed like an operation (two
  /// steady_clock reads, about 20-40 ns on the dev machines, as much as a pool operation),
  /// interpolated the same way.
  double ns_clock = 0;
  std::optional<std::uint64_t> recorded_reserved_bytes;  ///< the recording allocator's peak, if known
  std::vector<series_point> series;
  /// The allocator's free blocks when live bytes first reach the trace's peak (has_free_blocks).
  free_block_histogram free_blocks_at_peak;
  /// Per step, where the trace is a repeated step; then host times cover the steps after the
  /// first only (the first is where a planning allocator learns).
  std::vector<step_figures> steps;
  /// A line the allocator's configuration adds to the report (e.g. what its plan was).
  std::string note;

  /// peak reserved / peak live: 1.0 is a perfect allocator (0 when nothing was live).
  [[nodiscard]] double reserved_per_live() const noexcept {
    return peak_live_bytes == 0 ? 0.0 : double(peak_reserved_bytes) / double(peak_live_bytes);
  }
  /// Over the steps after the first: their peak reserved / their peak live (0 without steps).
  [[nodiscard]] double later_steps_reserved_per_live() const noexcept {
    std::uint64_t live = 0, reserved = 0;
    for (std::size_t k = 1; k < steps.size(); ++k) {
      live = std::max(live, steps[k].peak_live_bytes);
      reserved = std::max(reserved, steps[k].peak_reserved_bytes);
    }
    return live == 0 ? 0.0 : double(reserved) / double(live);
  }
};

/// Replays `t` against `r`. `stats_of()` returns the vram::stats that count what `r` holds
/// from the device (the allocator's own stats(), or the device's for an upstream-only run).
/// `streams` has t.streams entries (or is empty: everything on the synchronous stream).
/// Blocks live at the start are allocated first, untimed; everything still live at the end
/// is freed, untimed, so `r` ends empty. `stats_of()` is called only at new peaks of live
/// bytes and at series points, so the replay's own bookkeeping stays out of the allocator's
/// caches between timed operations; the peak of reserved bytes comes from the final stats.
/// Where `r` lists its free blocks (has_free_blocks), they are counted by size class once,
/// when live bytes first reach the trace's peak. Where the trace is a repeated step, `r` is
/// told each boundary (has_step_marks: mark_step(), untimed) and each step is measured apart.
template <resource R, class StatsOf>
replay_result replay(const trace& t, R& r, StatsOf&& stats_of, const std::vector<stream_ref>& streams,
                     const replay_options& options = {}) {
  replay_result out;
  out.trace = t.name;
  out.events = t.size() - t.initial_live;
  out.recorded_reserved_bytes = t.recorded_peak_reserved;

  // The live blocks by id: memory bounded by the blocks live at once, so a streamed trace of
  // any length replays in bounded memory.
  struct live_block {
    void* p;
    std::uint64_t bytes;
    std::uint32_t stream;
    std::uint16_t tenant;
  };
  std::vector<std::uint64_t> tenant_live(t.tenants.size(), 0);
  const std::uint64_t trace_peak = t.peak_live_bytes();
  std::unordered_map<std::uint64_t, live_block> live_blocks;
  detail::trace::timing_histogram ns;
  auto elapsed = [](std::chrono::steady_clock::time_point start) {
    return static_cast<std::uint32_t>(std::min<long long>(
        UINT32_MAX, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count()));
  };
  if (options.time_operations) {
    detail::trace::timing_histogram clock;
    for (int i = 0; i < 4096; ++i) {  // calibrate: an empty region timed like an operation
      auto start = std::chrono::steady_clock::now();
      clock.add(elapsed(start));
    }
    out.ns_clock = clock.step_quantile(0.5);
  }
  auto stream_at = [&](std::uint32_t s) { return s < streams.size() ? streams[s] : stream_ref{}; };

  const std::size_t total = t.size();
  std::uint64_t live = 0;
  std::size_t every = std::max<std::size_t>(1, total / std::max<std::size_t>(1, options.series_points));
  std::size_t progress_every = std::max<std::size_t>(1, total / 100);
  std::size_t recorded = 0;  // next recorded_reserved sample
  std::optional<std::uint64_t> recorded_now;

  // Frees what is left, so `r` (and its device) end empty, also where reading a streamed
  // trace fails half way.
  auto free_live = [&] {
    for (auto& [id, b] : live_blocks)
      if (b.p != nullptr) r.deallocate(stream_at(b.stream), b.p, static_cast<std::size_t>(b.bytes), default_alignment);
    live_blocks.clear();
  };
  // Steps: the boundaries are marked, and only the steps after the first are timed.
  const std::size_t first_timed = t.step_starts.size() >= 2 ? t.step_starts[1] : t.initial_live;
  std::size_t next_step = 0;  // index into t.step_starts
  auto sample_step = [&](std::uint64_t reserved) {
    if (!out.steps.empty()) out.steps.back().peak_reserved_bytes = std::max(out.steps.back().peak_reserved_bytes, reserved);
  };
  std::size_t i = 0;
  auto step = [&](const event& e) {
    if (next_step < t.step_starts.size() && t.step_starts[next_step] == i) {
      sample_step(stats_of().reserved_bytes);  // the end of the last step
      if constexpr (has_step_marks<R>) r.mark_step();
      out.steps.push_back({live, stats_of().reserved_bytes});
      ++next_step;
    }
    bool timed = options.time_operations && i >= first_timed;
    if (e.kind == event::op::alloc) {
      void* p = nullptr;
      try {
        auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        p = r.allocate(stream_at(e.stream), static_cast<std::size_t>(e.bytes), default_alignment);
        if (timed) ns.add(elapsed(start));
      } catch (const out_of_memory&) {
        ++out.ooms;
      } catch (const invalid_argument&) {
        ++out.ooms;  // beyond what the allocator accepts at all
      }
      if (i >= t.initial_live) ++out.allocs;
      if (p != nullptr || e.bytes == 0) {  // a refused allocation is skipped, and so is its free
        live_blocks[e.id] = {p, e.bytes, e.stream, e.tenant};
        live += e.bytes;
        if (e.tenant < tenant_live.size()) tenant_live[e.tenant] += e.bytes;
        if constexpr (has_free_blocks<R>) {
          if (live == trace_peak && !out.free_blocks_at_peak.captured) {  // the first time: once per replay
            out.free_blocks_at_peak.captured = true;
            out.free_blocks_at_peak.at_event = i;
            r.for_each_free_block([&](std::size_t size) { out.free_blocks_at_peak.add(size); });
          }
        }
        if (live > out.peak_live_bytes) {
          vram::stats s = stats_of();
          out.peak_live_bytes = live;
          out.reserved_at_peak_live = s.reserved_bytes;
          out.peak_reserved_bytes = std::max<std::uint64_t>(out.peak_reserved_bytes, s.reserved_bytes);
        }
        if (!out.steps.empty() && live > out.steps.back().peak_live_bytes) {
          out.steps.back().peak_live_bytes = live;
          sample_step(stats_of().reserved_bytes);
        }
      }
    } else {
      ++out.frees;
      if (auto it = live_blocks.find(e.id); it != live_blocks.end()) {
        if (it->second.p != nullptr) {  // (a zero-byte allocation may be nullptr: nothing to free)
          auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
          r.deallocate(stream_at(e.stream), it->second.p, static_cast<std::size_t>(it->second.bytes), default_alignment);
          if (timed) ns.add(elapsed(start));
        }
        live -= it->second.bytes;
        if (it->second.tenant < tenant_live.size()) tenant_live[it->second.tenant] -= it->second.bytes;
        live_blocks.erase(it);
      }
    }
    while (recorded < t.recorded_reserved.size() && t.recorded_reserved[recorded].event_index <= i + 1)
      recorded_now = t.recorded_reserved[recorded++].reserved_bytes;
    if (i % every == 0 || i + 1 == total) {
      vram::stats now = stats_of();
      out.peak_reserved_bytes = std::max<std::uint64_t>(out.peak_reserved_bytes, now.reserved_bytes);
      out.series.push_back({i, live, now.reserved_bytes, now.largest_free_block, recorded_now, tenant_live});
      sample_step(now.reserved_bytes);
    }
    if (options.progress && i % progress_every == 0) options.progress(i, total);
    ++i;
  };
  try {
    t.for_each_event(step);
  } catch (...) {
    free_live();
    throw;
  }
  vram::stats end = stats_of();
  sample_step(end.reserved_bytes);
  out.peak_reserved_bytes = std::max<std::uint64_t>(out.peak_reserved_bytes, end.peak_reserved_bytes);
  out.upstream_allocations = end.upstream_allocations;
  out.upstream_deallocations = end.upstream_deallocations;
  out.peak_spilled_bytes = end.peak_spilled_bytes;
  free_live();
  if (ns.count() != 0) {
    out.timed = true;
    out.ns_per_op_mean = std::max(0.0, ns.mean() - out.ns_clock);
    auto at = [&](double q) { return std::max(0.0, ns.step_quantile(q) - out.ns_clock); };
    out.ns_per_op_p50 = at(0.50);
    out.ns_per_op_p99 = at(0.99);
  }
  return out;
}

}  // namespace vram::trace

// Traces replayed from their files as streams: the same figures as the trace read into
// memory, in both streamed formats, and memory bounded by the live blocks, not the events
// (a child process's peak resident set, 200 thousand events against 2 million).

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <vram-replay/lineup.hpp>
#include <vram/trace/detail/rmm_csv.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/read_trace_stream.hpp>
#include <vram/trace/replay.hpp>
#include <vram/trace/workloads.hpp>

#include "support/child_peak_memory.hpp"
#include "support/sanitizers.hpp"

using vram::trace::event;
using vram::trace::trace;

namespace {

std::string scratch(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("vram-stream-" + std::to_string(::getpid()) + "-" + name)).string();
}

/// A trace of `events` events: 64 blocks live before the window (freed in it), then churn
/// over at most 512 live blocks of 4 KiB .. 4 MiB on two streams.
void write_churn(const std::string& path, std::size_t events) {
  std::ofstream out(path);
  out << "# vram-trace 1\nop,id,bytes,stream,time_ns\n";
  std::mt19937_64 rng(7);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live;  // id, bytes
  std::uint64_t next = 0;
  for (int i = 0; i < 64; ++i) {
    out << "L," << next << ",1048576,0,0\n";
    live.emplace_back(next++, 1048576);
  }
  for (std::size_t i = 64; i < events; ++i) {
    if (live.size() < 512 && (live.empty() || rng() % 2 == 0)) {
      std::uint64_t bytes = std::uint64_t{4096} << (rng() % 11);
      out << "A," << next << ',' << bytes << ',' << (next % 2) << ',' << i << '\n';
      live.emplace_back(next++, bytes);
    } else {
      std::size_t k = rng() % live.size();
      out << "F," << live[k].first << ',' << live[k].second << ',' << (live[k].first % 2) << ',' << i << '\n';
      live[k] = live.back();
      live.pop_back();
    }
    if (i % 100000 == 0) out << "R,," << (std::uint64_t{1} << 30) + i << ",,\n";
  }
}

vram::trace::replay_result replay_pool(const trace& t) {
  return vram_replay::pool_contiguous_config().run(t, vram::trace::replay_options{.time_operations = false});
}

void check_same(const trace& streamed, const trace& in_memory) {
  REQUIRE(streamed.streamed.has_value());
  CHECK(streamed.events.size() == streamed.initial_live);  // only the blocks live at the start are held
  CHECK(streamed.size() == in_memory.events.size());
  CHECK(streamed.allocs() == in_memory.allocs());
  CHECK(streamed.frees() == in_memory.frees());
  CHECK(streamed.initial_live == in_memory.initial_live);
  CHECK(streamed.streams == in_memory.streams);
  CHECK(streamed.warnings == in_memory.warnings);
  CHECK(streamed.peak_live_bytes() == in_memory.peak_live_bytes());
  CHECK(streamed.recorded_reserved.size() == in_memory.recorded_reserved.size());
  auto a = replay_pool(streamed), b = replay_pool(in_memory);
  CHECK(a.events == b.events);
  CHECK(a.peak_live_bytes == b.peak_live_bytes);
  CHECK(a.peak_reserved_bytes == b.peak_reserved_bytes);
  CHECK(a.ooms == b.ooms);
  REQUIRE(a.series.size() == b.series.size());
  for (std::size_t i = 0; i < a.series.size(); ++i) {
    CHECK(a.series[i].live_bytes == b.series[i].live_bytes);
    CHECK(a.series[i].reserved_bytes == b.series[i].reserved_bytes);
    CHECK(a.series[i].recorded_reserved_bytes == b.series[i].recorded_reserved_bytes);
  }
}

/// The peak resident set (KiB) of a child that reads the trace at `path` and replays it.
long peak_kib_of_replay(const std::string& path, bool streamed) {
  return vram::test::child_peak_kib([&] {
    trace t = streamed ? vram::trace::read_trace_stream(path) : vram::trace::read_trace(path);
    return replay_pool(t).ooms == 0;
  });
}

}  // namespace

TEST_CASE("a streamed vram trace replays like the trace read into memory") {
  std::string path = scratch("churn.vtrace");
  write_churn(path, 300000);
  check_same(vram::trace::read_trace_stream(path), vram::trace::read_trace(path));
  std::filesystem::remove(path);
}

TEST_CASE("a streamed RMM log (as the tracker writes it) replays like the log read into memory") {
  // The built-in training workload as an RMM log: addresses reused, frees before any alloc of
  // their address (blocks live at the start), the tracker's Tenant column.
  trace w = vram::trace::transformer_training();
  std::string path = scratch("training.csv");
  {
    std::ofstream out(path);
    out << vram::detail::trace::rmm_csv_header;
    std::unordered_map<std::uint64_t, std::uint64_t> address;  // id -> a made-up address
    std::uint64_t top = 0x7f0000000000;
    for (std::size_t i = 0; i < w.events.size(); ++i) {
      const event& e = w.events[i];
      if (i < w.initial_live) {  // live before the log began: only its free is logged
        address[e.id] = top += 1 << 20;
        continue;
      }
      if (e.kind == event::op::alloc) address[e.id] = top += 1 << 20;
      vram::detail::trace::write_rmm_csv_line(out, 1, static_cast<std::int64_t>(i), e.kind == event::op::alloc ? "allocate" : "free",
                                              address[e.id], e.bytes, e.stream, "train");
    }
  }
  trace streamed = vram::trace::read_trace_stream(path);
  CHECK(streamed.format == "rmm-csv");
  CHECK(streamed.name == std::filesystem::path(path).filename().string());
  check_same(streamed, vram::trace::read_trace(path));
  std::filesystem::remove(path);
}

TEST_CASE("a streamed trace that changes between its readings is an error naming the file") {
  std::string path = scratch("changing.vtrace");
  write_churn(path, 1000);
  trace t = vram::trace::read_trace_stream(path);
  write_churn(path, 900);
  CHECK_THROWS_WITH(replay_pool(t), Catch::Contains(path) && Catch::Contains("changed while it was replayed"));
  std::filesystem::remove(path);
}

TEST_CASE("formats that do not stream are read into memory") {
  std::string path = scratch("lifetimes.csv");
  std::ofstream(path) << "id,lower,upper,size\n0,0,2,100\n1,1,3,200\n";
  trace t = vram::trace::read_trace_stream(path);
  CHECK_FALSE(t.streamed.has_value());
  CHECK(t.format == "lifetime-csv");
  CHECK_THROWS_AS(vram::trace::read_trace_stream(scratch("missing")), vram::trace::trace_error);
  std::filesystem::remove(path);
}

TEST_CASE("a streamed replay's memory is bounded by the live blocks, not the events") {
  std::string small = scratch("small.vtrace"), large = scratch("large.vtrace");
  // Under a sanitizer the bound is not checked (support/sanitizers.hpp): the work runs smaller.
  const std::size_t events = vram::test::sanitized_build ? 20000 : 200000;
  write_churn(small, events);
  write_churn(large, 10 * events);
  long streamed_small = peak_kib_of_replay(small, true), streamed_large = peak_kib_of_replay(large, true);
  long held_small = peak_kib_of_replay(small, false), held_large = peak_kib_of_replay(large, false);
  INFO("peak KiB: streamed " << streamed_small << " -> " << streamed_large << ", in memory " << held_small << " -> "
                             << held_large);
  // 1.8 million more events held cost 32 bytes each and the file's text (about 50 MB in
  // all); streamed, they cost nothing that stays.
  if constexpr (vram::test::sanitized_build) {
    WARN("a sanitizer's quarantine and shadow hold memory: the bound is checked in the unsanitized build");
  } else {
    CHECK(held_large - held_small > 40 * 1024);
    CHECK(streamed_large - streamed_small < 4 * 1024);
  }
  std::filesystem::remove(small);
  std::filesystem::remove(large);
}

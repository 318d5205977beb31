// The replay engine, the allocator configurations and the built-in workloads.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>

#include <vram/trace/detail/json.hpp>
#include <vram/trace/detail/quantiles.hpp>
#include <vram-replay/lineup.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/replay.hpp>
#include <vram/trace/report.hpp>
#include <vram/trace/workloads.hpp>

#include "support/real_traces.hpp"
#include "support/recording_resource.hpp"

using vram::trace::event;
using vram::trace::trace;

namespace {

trace small_trace() {
  return vram::trace::parse_trace(
      "# vram-trace 1\nL,100,4096,0,0\nA,1,1000,0,1\nA,2,3000,0,2\nF,1,1000,0,3\nA,3,500,0,4\nF,2,3000,0,5\nF,3,500,0,6\n",
      "small");
}

const trace& real(const std::string& file) {
  static std::map<std::string, trace> cache;
  auto it = cache.find(file);
  if (it == cache.end()) {
    it = cache.emplace(file, vram::trace::read_trace(vram::test::shared(file))).first;
  }
  return it->second;
}

}  // namespace

TEST_CASE("replay on a plain device: peak live, OOMs skipped, frees of OOM'd blocks ignored") {
  trace t = small_trace();
  auto dev = vram::simulated_device_source(vram::simulated_device_options{.capacity = 1 << 20, .granularity = 256});
  auto r = vram::trace::replay(t, dev, [&] { return dev.stats(); }, {});
  CHECK(r.peak_live_bytes == 4096 + 4000);
  CHECK(r.peak_live_bytes == t.peak_live_bytes());
  CHECK(r.peak_reserved_bytes == 4096 + 1024 + 3072);
  CHECK(r.ooms == 0);
  CHECK(r.allocs == 3);
  CHECK(r.frees == 3);
  CHECK(dev.stats().live_allocations == 0);  // everything freed at the end

  // A device too small for block 2: it is counted, skipped, and its free ignored.
  auto tiny = vram::simulated_device_source(vram::simulated_device_options{.capacity = 6144, .granularity = 256});
  auto s = vram::trace::replay(t, tiny, [&] { return tiny.stats(); }, {});
  CHECK(s.ooms == 1);
  CHECK(s.peak_live_bytes == 4096 + 1000);
  CHECK(tiny.stats().live_allocations == 0);
}

TEST_CASE("replay over a recording, leak-checking upstream") {
  trace t = vram::trace::transformer_training({.layers = 2, .hidden = 256, .heads = 4, .vocab = 1000, .batch = 2,
                                               .sequence = 128, .steps = 2});
  vram::test::recording_resource<vram::host_source> rec{vram::host_source{}};
  vram::stats none;
  auto r = vram::trace::replay(t, rec, [&] { return none; }, {});
  CHECK(r.ooms == 0);
  CHECK(r.peak_live_bytes == t.peak_live_bytes());
  CHECK(r.allocs == t.allocs());
  CHECK(rec.counters().allocations == t.allocs());
  CHECK(rec.counters().live_allocations() == 0);  // the engine frees what the trace leaves live
}

TEST_CASE("built-in workloads are consistent traces") {
  for (const trace& t : vram::trace::builtin_workloads()) {
    INFO(t.name);
    std::unordered_map<std::uint64_t, std::uint64_t> live;
    for (const auto& e : t.events) {
      REQUIRE(e.stream < t.streams);
      if (e.kind == event::op::alloc) {
        REQUIRE(live.emplace(e.id, e.bytes).second);
      } else {
        REQUIRE(live.count(e.id) == 1);
        REQUIRE(live[e.id] == e.bytes);
        live.erase(e.id);
      }
    }
    CHECK(live.empty());
    CHECK(t.allocs() > 1000);
  }
  vram::trace::transformer_shape plain, recompute;
  recompute.recompute = true;
  CHECK(vram::trace::transformer_training(recompute).peak_live_bytes() <
        vram::trace::transformer_training(plain).peak_live_bytes());
  CHECK(vram::trace::kv_cache_inference().streams == 4);
}

TEST_CASE("every default configuration replays every built-in workload") {
  vram::trace::replay_options o;
  for (const trace& t : vram::trace::builtin_workloads())
    for (const auto& c : vram_replay::default_allocators()) {
      INFO(t.name << " on " << c.name);
      auto r = c.run(t, o);
      CHECK(r.allocator == c.name);
      CHECK(r.peak_live_bytes == t.peak_live_bytes());
      CHECK(r.peak_reserved_bytes >= r.peak_live_bytes);
      CHECK(r.ooms == 0);
      CHECK(r.ns_per_op_p99 >= r.ns_per_op_p50);
      CHECK(!r.series.empty());
    }
}

TEST_CASE("real traces replay on the pools with the trace's own peak live and no OOM at 80 GiB", "[traces]") {
  vram::trace::replay_options o;
  o.time_operations = false;
  for (const char* file : {"memory.pickle", "medium_1024_training_memory_snapshot.pickle", "df_index_resolver.json.gz",
                           "pangu_2.6B.csv"}) {
    const trace& t = real(file);
    for (const auto& c : {vram_replay::pool_contiguous_config(), vram_replay::pool_segments_config(),
                          vram_replay::upstream_config(), vram_replay::rmm_pool_model_config()}) {
      INFO(file << " on " << c.name);
      auto r = c.run(t, o);
      CHECK(r.peak_live_bytes == t.peak_live_bytes());
      CHECK(r.peak_reserved_bytes >= r.peak_live_bytes);
      CHECK(r.reserved_per_live() < 2.0);
      CHECK(r.ooms == 0);
      CHECK(r.recorded_reserved_bytes == t.recorded_peak_reserved);
    }
  }
}

TEST_CASE("capacity below peak live: every configuration reports OOMs, none crashes", "[traces]") {
  const trace& t = real("memory.pickle");
  vram::trace::replay_options o;
  o.capacity = std::size_t{1} << 30;  // 1 GiB < 1.66 GiB live
  o.time_operations = false;
  for (const auto& c : vram_replay::default_allocators()) {
    INFO(c.name);
    auto r = c.run(t, o);
    CHECK(r.ooms > 0);
    CHECK(r.peak_reserved_bytes <= o.capacity);
  }
  auto slab = vram_replay::slab_config().run(t, o);  // spills instead of failing
  CHECK(slab.ooms == 0);
  CHECK(slab.peak_spilled_bytes > 0);
  CHECK(slab.peak_live_bytes == t.peak_live_bytes());
}

TEST_CASE("JSON and HTML reports parse") {
  trace t = small_trace();
  std::vector<vram::trace::replay_result> results;
  for (const auto& c : vram_replay::default_allocators()) results.push_back(c.run(t, {}));
  std::ostringstream json;
  vram::trace::write_json(json, results);
  std::string text = json.str();
  vram::detail::trace::json_reader reader(text, "report.json");
  auto doc = reader.parse_value();
  CHECK(reader.at_end());
  REQUIRE(doc.is_array());
  REQUIRE(doc.array.size() == results.size());
  for (const auto& o : doc.array) {
    for (const char* key : {"trace", "allocator", "events", "peak_live_bytes", "peak_reserved_bytes", "ooms",
                            "ns_per_op_p50", "ns_per_op_p99", "ns_clock", "recorded_reserved_bytes"})
      CHECK(o.find(key) != nullptr);
    CHECK(o.find("recorded_reserved_bytes")->is_null());
    CHECK(o.find("peak_live_bytes")->as_int() == 8096);
    REQUIRE(o.find("free_blocks_at_peak") != nullptr);
  }
  // The pool lists its free blocks at the peak: the classes add up to what it held free.
  const auto* classes = doc.array.front().find("free_blocks_at_peak");
  REQUIRE(classes->is_array());
  std::int64_t free_at_peak = 0;
  for (const auto& c : classes->array) free_at_peak += c.find("bytes")->as_int();
  std::int64_t captured = 0;
  for (int k = 0; k < 64; ++k) captured += std::int64_t(results.front().free_blocks_at_peak.bytes[k]);
  CHECK(free_at_peak == captured);
  CHECK(free_at_peak > 0);  // its 2 MiB granule, less what is live
  CHECK(free_at_peak + std::int64_t(results.front().peak_live_bytes) <= std::int64_t(results.front().reserved_at_peak_live));
  CHECK(doc.array[3].find("free_blocks_at_peak")->is_null());  // upstream: a bare device lists none
  std::ostringstream html;
  vram::trace::write_html(html, {{&t, results}});
  std::string page = html.str();
  CHECK(page.starts_with("<!DOCTYPE html>"));
  CHECK(page.find("http://") == page.find("http://www.w3.org/2000/svg"));  // only the SVG namespace
  auto count = [&](const std::string& s) {
    std::size_t n = 0;
    for (auto p = page.find(s); p != std::string::npos; p = page.find(s, p + 1)) ++n;
    return n;
  };
  CHECK(count("<script>") == 1);  // the zoom, inline: nothing loaded
  CHECK(count(" src=") == 0);
  // live vs reserved, waste, the largest free block, the free blocks at peak by size (no
  // tenants in this trace: no tenants' figure).
  CHECK(count("<svg") == 4);
  CHECK(count("<figure id=\"t0-") == 4);
  CHECK(count("-tenants\"") == 0);
  CHECK(count("<svg") == count("</svg>"));
  CHECK(count("<table") == count("</table>"));
  CHECK(count("<polyline") >= 2 * results.size());
}

TEST_CASE("HTML report: numbers as people read them (whole nanoseconds, ratios to three decimals)") {
  trace t = small_trace();
  vram::trace::replay_result r = vram_replay::default_allocators().front().run(t, {});
  r.peak_live_bytes = 3000;
  r.peak_reserved_bytes = 4096;  // 1.365333...
  r.ns_per_op_p50 = 23.456789;
  r.ns_per_op_p99 = 1514.6875;
  std::ostringstream html;
  vram::trace::write_html(html, {{&t, {r}}});
  std::string page = html.str();
  INFO(page.substr(0, 2000));
  CHECK(page.find("<td>1.365</td><td>" + std::to_string(r.ooms) + "</td><td>" + std::to_string(r.upstream_allocations) +
                  "</td><td>23</td><td>1,515</td>") != std::string::npos);
  CHECK(page.find("23.4") == std::string::npos);
  CHECK(page.find("1514.6") == std::string::npos);
}

namespace {

/// Durations drawn by `draw`, each read as a clock moving in steps of `step` units would read
/// it: the difference of two readings at a random phase (plus a unit of jitter per reading,
/// like a tick-to-nanosecond conversion).
template <class Draw>
std::vector<std::uint32_t> read_in_steps(Draw draw, double step, bool jitter, std::size_t n = 20000) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> phase(0, step);
  std::uniform_int_distribution<int> unit(0, 1);
  std::vector<std::uint32_t> v;
  for (std::size_t i = 0; i < n; ++i) {
    double start = phase(rng), end = start + draw(rng);
    double ticks = std::floor(end / step) * step - std::floor(start / step) * step;
    v.push_back(static_cast<std::uint32_t>(std::lround(ticks)) + (jitter ? unit(rng) : 0));
  }
  return v;
}

}  // namespace

TEST_CASE("step_quantile recovers a median that a clock moving in 10-unit steps hides") {
  using vram::detail::trace::step_quantile;
  for (double true_median : {33.0, 45.0, 47.5, 52.0, 58.0}) {
    // Narrow spreads are where the plain median is furthest off (it reads 40, 50 or 60).
    std::uniform_real_distribution<double> spread(true_median - 4, true_median + 4);
    for (bool jitter : {false, true}) {
      auto v = read_in_steps([&](std::mt19937_64& g) { return spread(g); }, 10, jitter);
      auto w = v;
      std::sort(w.begin(), w.end());
      double plain = w[(w.size() - 1) / 2];
      double estimate = step_quantile(v, 0.5);
      INFO("true median " << true_median << ", jitter " << jitter << ": plain " << plain << ", estimate " << estimate);
      CHECK(std::abs(estimate - true_median - (jitter ? 0.5 : 0)) < 1.0);
    }
  }
  // A wide spread over many steps, as a replay's operations are: still within a unit.
  std::exponential_distribution<double> tail(1.0 / 30);
  auto v = read_in_steps([&](std::mt19937_64& g) { return 40 + tail(g); }, 10, true, 200000);
  CHECK(std::abs(step_quantile(v, 0.5) - (40 + 30 * std::log(2.0) + 0.5)) < 1.5);
  // The time-stamp counter's steps on this project's VMs: 24.45 ticks.
  std::uniform_real_distribution<double> timer(60, 65);
  auto t = read_in_steps([&](std::mt19937_64& g) { return timer(g); }, 24.45, true);
  CHECK(std::abs(step_quantile(t, 0.5) - 63.0) < 1.5);
}

TEST_CASE("step_quantile is the plain quantile on a clock without steps, and on tiny samples") {
  using vram::detail::trace::step_quantile;
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<std::uint32_t> ns(20, 120);
  std::vector<std::uint32_t> v(10001);
  for (auto& x : v) x = ns(rng);
  auto w = v;
  std::sort(w.begin(), w.end());
  CHECK(step_quantile(v, 0.5) == w[5000]);
  CHECK(step_quantile(v, 0.99) == w[9900]);
  std::vector<std::uint32_t> one{42};
  CHECK(step_quantile(one, 0.5) == 42);
  std::vector<std::uint32_t> same(100, 30);  // one group and no neighbour: no step to spread over
  CHECK(step_quantile(same, 0.5) == 30);
}

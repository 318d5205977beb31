#pragma once
// Reports of replay results: a text table per trace, JSON (one object per trace x allocator)
// and one self-contained HTML page with inline SVG plots (no scripts, nothing from the network).

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include <vram/trace/detail/json.hpp>
#include <vram/trace/detail/svg_chart.hpp>
#include <vram/trace/replay.hpp>
#include <vram/trace/trace.hpp>

namespace vram::trace {

using detail::trace::format_bytes;

/// The table of one trace's results.
/// Why an allocator refused allocations on a trace, in a sentence (for the table's notes).
inline const char* why_ooms(const replay_result& r) {
  if (r.allocator == "arena")
    return "an activation arena returns space only when everything above it is dead and keeps "
           "every chunk until reset(), so on a whole trace (long-lived blocks, no step boundaries) "
           "it grows until the capacity stops it; it is meant for one step's activations";
  if (r.allocator == "slab") return "the device budget and the spill budget were both full";
  return "the capacity (--capacity) was exhausted even after releasing free memory";
}

inline void print_table(std::ostream& out, const trace& t, const std::vector<replay_result>& results) {
  char line[512];
  out << "\n== " << t.name << " (" << t.format << "): " << t.allocs() << " allocs, " << t.frees() << " frees";
  if (t.initial_live != 0) out << ", " << t.initial_live << " blocks live at the start";
  out << ", " << t.streams << (t.streams == 1 ? " stream" : " streams");
  if (t.warnings != 0) out << ", " << t.warnings << " warnings";
  out << "\n";
  for (const auto& w : t.warning_examples) out << "   warning: " << w << "\n";
  std::snprintf(line, sizeof line, "%-16s %12s %12s %9s %6s %10s %9s %9s %12s %14s\n", "allocator", "peak live",
                "peak reserved", "res/live", "OOMs", "upstream", "p50 ns", "p99 ns", "spilled", "recorded res.");
  out << line;
  for (const auto& r : results) {
    if (!r.error.empty()) {
      out << r.allocator << ": " << r.error << "\n";
      continue;
    }
    std::snprintf(line, sizeof line, "%-16s %12s %12s %9.3f %6zu %10zu %9.0f %9.0f %12s %14s\n", r.allocator.c_str(),
                  format_bytes(double(r.peak_live_bytes)).c_str(), format_bytes(double(r.peak_reserved_bytes)).c_str(),
                  r.reserved_per_live(), r.ooms, r.upstream_allocations, r.ns_per_op_p50, r.ns_per_op_p99,
                  r.peak_spilled_bytes ? format_bytes(double(r.peak_spilled_bytes)).c_str() : "-",
                  r.recorded_reserved_bytes ? format_bytes(double(*r.recorded_reserved_bytes)).c_str() : "-");
    out << line;
  }
  double clock = 0;
  for (const auto& r : results) clock = std::max(clock, r.ns_clock);
  if (clock > 0) {
    std::snprintf(line, sizeof line, "%.1f", clock);
    out << "(p50/p99: host ns per operation, net of the timer's own " << line
        << " ns per reading pair; interpolated within the clock's steps where it moves in steps)\n";
  }
  for (const auto& r : results)
    if (r.error.empty() && r.peak_spilled_bytes != 0)
      out << "(" << r.allocator << ": peak reserved includes the " << format_bytes(double(r.peak_spilled_bytes))
          << " it spilled to host memory; on the device it never holds more than its budget)\n";
  for (const auto& r : results)
    if (r.error.empty() && r.ooms != 0) out << "(" << r.allocator << ": " << r.ooms << " OOMs: " << why_ooms(r) << ")\n";
  // The verdict: the fewest bytes reserved among the runs that served every allocation from
  // the device (a spilled run did not fit).
  const replay_result* best = nullptr;
  for (const auto& r : results)
    if (r.error.empty() && r.ooms == 0 && r.peak_spilled_bytes == 0 && r.peak_live_bytes != 0 &&
        (best == nullptr || r.peak_reserved_bytes < best->peak_reserved_bytes))
      best = &r;
  if (best != nullptr) {
    std::snprintf(line, sizeof line, "%.3f", best->reserved_per_live());
    out << "lowest reserved: " << best->allocator << ", " << line << " of peak live (" << format_bytes(double(best->peak_reserved_bytes))
        << " for " << format_bytes(double(best->peak_live_bytes)) << ")\n";
  } else {
    out << "no allocator served every allocation from the device at this capacity\n";
  }
  out << "(columns: docs/replay.md, \"vram-replay: which allocator fragments least on my workload?\")\n";
}

/// One JSON object per result, in an array.
inline void write_json(std::ostream& out, const std::vector<replay_result>& results) {
  using vram::detail::trace::json_quote;
  out << "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    out << "  {\"trace\": " << json_quote(r.trace) << ", \"allocator\": " << json_quote(r.allocator)
        << ", \"events\": " << r.events << ", \"allocs\": " << r.allocs << ", \"frees\": " << r.frees
        << ", \"peak_live_bytes\": " << r.peak_live_bytes << ", \"peak_reserved_bytes\": " << r.peak_reserved_bytes
        << ", \"reserved_at_peak_live_bytes\": " << r.reserved_at_peak_live
        << ", \"reserved_per_live\": " << r.reserved_per_live() << ", \"ooms\": " << r.ooms
        << ", \"upstream_allocations\": " << r.upstream_allocations
        << ", \"upstream_deallocations\": " << r.upstream_deallocations
        << ", \"peak_spilled_bytes\": " << r.peak_spilled_bytes << ", \"ns_per_op_p50\": " << r.ns_per_op_p50
        << ", \"ns_per_op_p99\": " << r.ns_per_op_p99 << ", \"ns_per_op_mean\": " << r.ns_per_op_mean
        << ", \"ns_clock\": " << r.ns_clock
        << ", \"recorded_reserved_bytes\": ";
    if (r.recorded_reserved_bytes) out << *r.recorded_reserved_bytes;
    else out << "null";
    out << ", \"error\": ";
    if (r.error.empty()) out << "null";
    else out << json_quote(r.error);
    out << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  out << "]\n";
}


/// One self-contained HTML page: per trace, the table, live vs reserved over time per
/// allocator, and the waste (1 - live / reserved) over time.
inline void write_html(std::ostream& out, const std::vector<std::pair<const trace*, std::vector<replay_result>>>& runs) {
  using detail::trace::chart;
  using detail::trace::colour;
  using detail::trace::escape_html;
  using detail::trace::line;
  out << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>vram-replay report</title>\n"
         "<style>body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}"
         "td:first-child{text-align:left}</style></head><body>\n<h1>vram-replay report</h1>\n"
         "<p>Peak live is the lower bound no allocator can beat; peak reserved is what each allocator held from "
         "the (simulated) device. Waste = 1 - live / reserved.</p>\n";
  for (const auto& [t, results] : runs) {
    out << "<h2>" << escape_html(t->name) << "</h2>\n<p>" << escape_html(t->format) << ": " << t->allocs()
        << " allocations, " << t->frees() << " frees, " << t->initial_live << " blocks live at the start, "
        << t->streams << " stream(s), " << t->warnings << " warning(s).</p>\n";
    out << "<table><tr><th>allocator</th><th>peak live</th><th>peak reserved</th><th>reserved/live</th><th>OOMs</th>"
           "<th>upstream calls</th><th>p50 ns</th><th>p99 ns</th><th>recorded reserved</th></tr>\n";
    char buf[256];
    for (const auto& r : results) {
      if (!r.error.empty()) {
        out << "<tr><td>" << escape_html(r.allocator) << "</td><td colspan=\"8\">" << escape_html(r.error) << "</td></tr>\n";
        continue;
      }
      // As in the text table: the ratio to three decimals, nanoseconds as whole numbers.
      std::snprintf(buf, sizeof buf, "%.3f</td><td>%zu</td><td>%zu</td><td>%.0f</td><td>%.0f", r.reserved_per_live(),
                    r.ooms, r.upstream_allocations, r.ns_per_op_p50, r.ns_per_op_p99);
      out << "<tr><td>" << escape_html(r.allocator) << "</td><td>" << format_bytes(double(r.peak_live_bytes))
          << "</td><td>" << format_bytes(double(r.peak_reserved_bytes)) << "</td><td>" << buf
          << "</td><td>" << (r.recorded_reserved_bytes ? format_bytes(double(*r.recorded_reserved_bytes)) : "-")
          << "</td></tr>\n";
    }
    out << "</table>\n";
    std::vector<line> bytes_lines, waste_lines;
    double y_max = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      if (!r.error.empty()) continue;
      line reserved{r.allocator + " reserved", colour(i), {}}, waste{r.allocator, colour(i), {}};
      for (const auto& p : r.series) {
        reserved.points.emplace_back(double(p.event), double(p.reserved_bytes));
        waste.points.emplace_back(double(p.event),
                                  p.reserved_bytes == 0 ? 0.0 : 1.0 - double(p.live_bytes) / double(p.reserved_bytes));
        y_max = std::max(y_max, double(p.reserved_bytes));
      }
      bytes_lines.push_back(std::move(reserved));
      waste_lines.push_back(std::move(waste));
    }
    if (!results.empty() && results.front().error.empty()) {
      line live{"live (all)", "#000000", {}, true};
      line recorded{"recorded reserved", "#7f7f7f", {}, true};
      for (const auto& p : results.front().series) {
        live.points.emplace_back(double(p.event), double(p.live_bytes));
        y_max = std::max(y_max, double(p.live_bytes));
        if (p.recorded_reserved_bytes) {
          recorded.points.emplace_back(double(p.event), double(*p.recorded_reserved_bytes));
          y_max = std::max(y_max, double(*p.recorded_reserved_bytes));
        }
      }
      bytes_lines.push_back(std::move(live));
      if (!recorded.points.empty()) bytes_lines.push_back(std::move(recorded));
    }
    out << chart("live vs reserved bytes", bytes_lines, y_max * 1.05, true);
    out << chart("waste: 1 - live / reserved", waste_lines, 1.0, false);
  }
  out << "</body></html>\n";
}

}  // namespace vram::trace

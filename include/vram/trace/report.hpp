#pragma once
// Reports of replay results: a text table per trace, JSON (one object per trace x allocator)
// and one self-contained HTML page with inline SVG plots (one inline script zooms them; nothing
// from the network).

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

/// The run that reserved the fewest bytes among those that served every allocation from the
/// device (a spilled run did not fit); nullptr where none did.
inline const replay_result* lowest_reserved(const std::vector<replay_result>& results) {
  const replay_result* best = nullptr;
  for (const auto& r : results)
    if (r.error.empty() && r.ooms == 0 && r.peak_spilled_bytes == 0 && r.peak_live_bytes != 0 &&
        (best == nullptr || r.peak_reserved_bytes < best->peak_reserved_bytes))
      best = &r;
  return best;
}

/// Which allocator to write, and why, in one line: among the runs that fit, those within 1% of
/// the fewest bytes reserved, the fastest (p50, where timed); then what the others cost. The
/// C++ type comes first, the configuration's name after it.
inline std::string verdict(const std::vector<replay_result>& results) {
  const replay_result* lowest = lowest_reserved(results);
  if (lowest == nullptr) return "none: no allocator served every allocation from the device at this capacity";
  const replay_result* pick = lowest;
  for (const auto& r : results)
    if (r.error.empty() && r.ooms == 0 && r.peak_spilled_bytes == 0 && r.ns_per_op_p50 > 0 && pick->ns_per_op_p50 > 0 &&
        double(r.peak_reserved_bytes) <= 1.01 * double(lowest->peak_reserved_bytes) && r.ns_per_op_p50 < pick->ns_per_op_p50)
      pick = &r;
  char buf[256];
  std::string out = (pick->code.empty() ? pick->allocator : pick->code + " (" + pick->allocator + ")") + ": ";
  std::snprintf(buf, sizeof buf, "%.3f of peak live", pick->reserved_per_live());
  out += buf;
  out += pick == lowest ? ", the fewest bytes reserved" : ", within 1% of the fewest (" + lowest->allocator + ") and faster";
  if (pick->ns_per_op_p50 > 0) {
    std::snprintf(buf, sizeof buf, ", %.0f ns per operation (p50)", pick->ns_per_op_p50);
    out += buf;
  }
  std::string others;
  for (const auto& r : results) {
    if (&r == pick || !r.error.empty()) continue;
    if (r.ooms != 0) {
      std::snprintf(buf, sizeof buf, "%s ran out of memory", r.allocator.c_str());
    } else if (r.ns_per_op_p50 > 0) {
      std::snprintf(buf, sizeof buf, "%s %.3f at %.0f ns", r.allocator.c_str(), r.reserved_per_live(), r.ns_per_op_p50);
    } else {
      std::snprintf(buf, sizeof buf, "%s %.3f", r.allocator.c_str(), r.reserved_per_live());
    }
    others += (others.empty() ? "" : ", ") + std::string(buf);
    if (r.allocator == "arena" && r.ooms == 0 && r.reserved_per_live() > 1.5)
      others += " (a bump allocator: each chunk is held until every block in it is freed; for one step's activations)";
  }
  if (!others.empty()) out += "; the others: " + others;
  return out;
}

inline void print_table(std::ostream& out, const trace& t, const std::vector<replay_result>& results) {
  char line[512];
  out << "\n== " << t.name << " (" << t.format << "): " << t.allocs() << " allocs, " << t.frees() << " frees";
  if (t.initial_live != 0) out << ", " << t.initial_live << " blocks live at the start";
  out << ", " << t.streams << (t.streams == 1 ? " stream" : " streams");
  if (t.warnings != 0) out << ", " << t.warnings << " warnings";
  out << "\n";
  for (const auto& w : t.warning_examples) out << "   warning: " << w << "\n";
  if (t.step_starts.size() >= 2)
    out << "(replayed as " << t.step_starts.size()
        << " steps: the first is where a planning allocator learns; host times cover the later steps, and res/live 2+ "
           "is their peak reserved over their peak live)\n";
  int name_width = 16;  // the names' column: as wide as the longest name, 16 at least
  for (const auto& r : results) name_width = std::max(name_width, static_cast<int>(r.allocator.size()));
  std::snprintf(line, sizeof line, "%-*s %12s %12s %9s %6s %10s %9s %9s %12s %14s\n", name_width, "allocator", "peak live",
                "peak reserved", "res/live", "OOMs", "upstream", "p50 ns", "p99 ns", "spilled", "recorded res.");
  out << line;
  for (const auto& r : results) {
    if (!r.error.empty()) {
      out << r.allocator << ": " << r.error << "\n";
      continue;
    }
    char p50[32] = "-", p99[32] = "-";  // not timed (--no-timing): no figure rather than 0
    if (r.timed) {
      std::snprintf(p50, sizeof p50, "%.0f", r.ns_per_op_p50);
      std::snprintf(p99, sizeof p99, "%.0f", r.ns_per_op_p99);
    }
    std::snprintf(line, sizeof line, "%-*s %12s %12s %9.3f %6zu %10zu %9s %9s %12s %14s\n", name_width, r.allocator.c_str(),
                  format_bytes(double(r.peak_live_bytes)).c_str(), format_bytes(double(r.peak_reserved_bytes)).c_str(),
                  r.reserved_per_live(), r.ooms, r.upstream_allocations, p50, p99,
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
  for (const auto& r : results) {
    if (!r.error.empty() || r.steps.size() < 2) continue;
    std::snprintf(line, sizeof line, "%.4f", r.later_steps_reserved_per_live());
    out << "res/live 2+ " << r.allocator << ": " << line << "\n";
  }
  for (const auto& r : results)
    if (r.error.empty() && !r.note.empty()) out << "(" << r.allocator << ": " << r.note << ")\n";
  const replay_result* best = lowest_reserved(results);
  if (best != nullptr) {
    std::snprintf(line, sizeof line, "%.3f", best->reserved_per_live());
    out << "lowest reserved: " << best->allocator << ", " << line << " of peak live (" << format_bytes(double(best->peak_reserved_bytes))
        << " for " << format_bytes(double(best->peak_live_bytes)) << ")\n";
    out << "verdict: " << verdict(results) << "\n";
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
        << ", \"later_steps_reserved_per_live\": " << r.later_steps_reserved_per_live()
        << ", \"steps\": " << r.steps.size() << ", \"note\": " << json_quote(r.note)
        << ", \"recorded_reserved_bytes\": ";
    if (r.recorded_reserved_bytes) out << *r.recorded_reserved_bytes;
    else out << "null";
    // The free blocks at peak live by power-of-two size class (null: not captured).
    out << ", \"free_blocks_at_peak\": ";
    if (!r.free_blocks_at_peak.captured) {
      out << "null";
    } else {
      out << "[";
      bool first = true;
      for (int k = 0; k < 64; ++k) {
        if (r.free_blocks_at_peak.blocks[k] == 0) continue;
        out << (first ? "" : ", ") << "{\"min_bytes\": " << (std::uint64_t{1} << k)
            << ", \"blocks\": " << r.free_blocks_at_peak.blocks[k] << ", \"bytes\": " << r.free_blocks_at_peak.bytes[k]
            << "}";
        first = false;
      }
      out << "]";
    }
    out << ", \"error\": ";
    if (r.error.empty()) out << "null";
    else out << json_quote(r.error);
    out << "}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  out << "]\n";
}


}  // namespace vram::trace

namespace vram::detail::trace {

/// The page's one script: drag across a timeline to zoom every timeline of its trace into
/// that range of events, double-click to see them all again; `?zoom=A,B` (fractions of the
/// axis) opens the page zoomed. It moves each chart's <g class="zoom"> and rewrites its x
/// labels (vram/trace/detail/svg_chart.hpp draws both).
inline constexpr const char* zoom_script = R"(<script>
(function () {
  const left = 80, width = 620;
  function view(svg, a, b) {
    const k = 1 / (b - a);
    svg.querySelector('g.zoom').setAttribute('transform',
        'translate(' + (left - k * (left + a * width)) + ' 0) scale(' + k + ' 1)');
    const max = Number(svg.dataset.xMax);
    svg.querySelectorAll('text.xtick').forEach(function (t) {
      t.textContent = Math.round((a + Number(t.dataset.f) * (b - a)) * max).toLocaleString('en-US');
    });
    svg.dataset.view = a + ',' + b;
  }
  function zoom(section, a, b) {
    section.querySelectorAll('svg.timeline').forEach(function (svg) { view(svg, a, b); });
  }
  document.querySelectorAll('section.trace').forEach(function (section) {
    section.querySelectorAll('svg.timeline').forEach(function (svg) {
      let start = null;
      function at(e) {  // the event fraction under the pointer, in the current view
        const box = svg.getBoundingClientRect();
        const x = (e.clientX - box.left) * 900 / box.width;
        const ab = (svg.dataset.view || '0,1').split(',').map(Number);
        return ab[0] + Math.min(1, Math.max(0, (x - left) / width)) * (ab[1] - ab[0]);
      }
      svg.addEventListener('mousedown', function (e) { start = at(e); e.preventDefault(); });
      svg.addEventListener('mouseup', function (e) {
        if (start === null) return;
        const end = at(e);
        if (Math.abs(end - start) > 1e-6) zoom(section, Math.min(start, end), Math.max(start, end));
        start = null;
      });
      svg.addEventListener('dblclick', function () { zoom(section, 0, 1); });
    });
  });
  const asked = new URLSearchParams(location.search).get('zoom');
  if (asked) {
    const ab = asked.split(',').map(Number);
    if (ab.length === 2 && ab[0] >= 0 && ab[1] <= 1 && ab[0] < ab[1])
      document.querySelectorAll('section.trace').forEach(function (s) { zoom(s, ab[0], ab[1]); });
  }
})();
</script>
)";

/// "4 KiB", "1 MiB": the lower bound of free-block size class k.
inline std::string size_class_label(int k) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  return std::to_string(std::uint64_t{1} << (k % 10)) + " " + units[k / 10];
}

/// "live bytes by tenant": the trace's tenants stacked over time (the six that hold most at
/// the peak, the rest together), from the replay's series.
inline std::string tenant_chart(const std::string& id, const vram::trace::trace& t, const vram::trace::replay_result& r) {
  if (r.series.empty()) return {};
  std::size_t n = t.tenants.size(), peak_at = 0;
  for (std::size_t i = 0; i < r.series.size(); ++i)
    if (r.series[i].live_bytes > r.series[peak_at].live_bytes) peak_at = i;
  std::vector<std::size_t> order;  // the tenants that ever hold bytes
  for (std::size_t i = 0; i < n; ++i)
    if (std::any_of(r.series.begin(), r.series.end(),
                    [&](const auto& p) { return i < p.live_by_tenant.size() && p.live_by_tenant[i] != 0; }))
      order.push_back(i);
  n = order.size();
  const std::vector<std::uint64_t>& peak = r.series[peak_at].live_by_tenant;
  auto at_peak = [&](std::size_t tenant) { return tenant < peak.size() ? peak[tenant] : 0; };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return at_peak(a) > at_peak(b); });
  const std::size_t shown = std::min<std::size_t>(n, 6);
  std::vector<line> bands;
  double y_max = 0;
  for (std::size_t b = 0; b < shown + (n > shown ? 1 : 0); ++b) {
    std::string label = b < shown ? (t.tenants[order[b]].empty() ? "(no tenant)" : t.tenants[order[b]]) : "others";
    line band{label, colour(b), {}};
    for (const auto& p : r.series) {
      double below = bands.empty() ? 0.0 : bands.back().points[band.points.size()].second;
      double mine = 0;
      if (b < shown) mine = order[b] < p.live_by_tenant.size() ? double(p.live_by_tenant[order[b]]) : 0.0;
      else
        for (std::size_t o = shown; o < n; ++o) mine += order[o] < p.live_by_tenant.size() ? double(p.live_by_tenant[order[o]]) : 0.0;
      band.points.emplace_back(double(p.event), below + mine);
      y_max = std::max(y_max, below + mine);
    }
    bands.push_back(std::move(band));
  }
  return chart(id, "live bytes by tenant (" + r.allocator + "'s replay)", bands, y_max * 1.05, true, true);
}

/// "free blocks at peak live, by size": per size class, the bytes each allocator held free
/// in blocks of that class when live bytes first reached their peak.
inline std::string free_size_chart(const std::string& id, const std::vector<vram::trace::replay_result>& results) {
  int lo = 64, hi = -1;
  for (const auto& r : results)
    if (r.error.empty() && r.free_blocks_at_peak.captured)
      for (int k = 0; k < 64; ++k)
        if (r.free_blocks_at_peak.blocks[k] != 0) {
          lo = std::min(lo, k);
          hi = std::max(hi, k);
        }
  if (hi < 0) return "<p>No allocator held free blocks at the peak.</p>\n";
  std::vector<std::string> categories;
  for (int k = lo; k <= hi; ++k) categories.push_back(size_class_label(k));
  std::vector<bar_series> series;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (!r.error.empty() || !r.free_blocks_at_peak.captured) continue;
    bar_series b{r.allocator, colour(i), {}, {}};
    for (int k = lo; k <= hi; ++k) {
      b.values.push_back(double(r.free_blocks_at_peak.bytes[k]));
      b.notes.push_back(r.allocator + ": " + format_count(double(r.free_blocks_at_peak.blocks[k])) +
                        " free blocks of " + size_class_label(k) + " .. " + size_class_label(k + 1) + ", " +
                        format_bytes(double(r.free_blocks_at_peak.bytes[k])));
    }
    series.push_back(std::move(b));
  }
  return bar_chart(id, "free bytes at peak live, by the size of the block they are in", categories,
                                        series);
}

}  // namespace vram::detail::trace

namespace vram::trace {

/// One self-contained HTML page (nothing fetched from the network): per trace, the table,
/// then live vs reserved, the waste, and the largest free block over time (timelines that
/// zoom together), the free blocks at peak live by size, and live bytes by tenant where the
/// trace names tenants. Each figure has an id (t<trace>-<figure>); page.html#t0-free-sizes
/// shows that figure alone.
inline void write_html(std::ostream& out, const std::vector<std::pair<const trace*, std::vector<replay_result>>>& runs) {
  using vram::detail::trace::chart;
  using vram::detail::trace::colour;
  using vram::detail::trace::escape_html;
  using vram::detail::trace::format_count;
  using vram::detail::trace::line;
  out << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>vram-replay report</title>\n"
         "<style>body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td{white-space:nowrap}th{background:#eee}"
         "td:first-child{text-align:left}figure{margin:0.5em 0}svg.timeline{cursor:crosshair}"
         "body:has(figure:target) :is(h1,h2,p,table,figure:not(:target)){display:none}</style></head><body>\n"
         "<h1>vram-replay report</h1>\n"
         "<p>Peak live is the lower bound no allocator can beat; peak reserved is what each allocator held from "
         "the (simulated) device. Waste = 1 - live / reserved. Drag across a timeline to zoom into those events "
         "(every timeline of the trace follows); double-click to see them all.</p>\n";
  out << "<section id=\"verdicts\"><h2>Verdict</h2>\n";
  for (const auto& [t, results] : runs)
    out << "<p class=\"verdict\"><b>" << escape_html(t->name) << "</b>: " << escape_html(verdict(results)) << "</p>\n";
  out << "</section>\n";
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const auto& [t, results] = runs[k];
    const std::string id = "t" + std::to_string(k);
    out << "<section class=\"trace\" id=\"" << id << "\">\n<h2>" << escape_html(t->name) << "</h2>\n<p>"
        << escape_html(t->format) << ": " << format_count(double(t->allocs())) << " allocations, "
        << format_count(double(t->frees())) << " frees, " << format_count(double(t->initial_live))
        << " blocks live at the start, " << t->streams << " stream(s), " << format_count(double(t->warnings))
        << " warning(s)" << (t->tenants.size() > 1 ? ", " + format_count(double(t->tenants.size() - 1)) + " tenant(s)" : "")
        << ".</p>\n";
    out << "<table><tr><th>allocator</th><th>peak live</th><th>peak reserved</th><th>reserved/live</th><th>OOMs</th>"
           "<th>upstream calls</th><th>p50 ns</th><th>p99 ns</th><th>recorded reserved</th></tr>\n";
    char buf[256];
    for (const auto& r : results) {
      if (!r.error.empty()) {
        out << "<tr><td>" << escape_html(r.allocator) << "</td><td colspan=\"8\">" << escape_html(r.error) << "</td></tr>\n";
        continue;
      }
      // As in the text table: the ratio to three decimals, nanoseconds as whole numbers.
      std::snprintf(buf, sizeof buf, "%.3f</td><td>", r.reserved_per_live());
      out << "<tr><td>" << escape_html(r.allocator) << "</td><td>" << format_bytes(double(r.peak_live_bytes))
          << "</td><td>" << format_bytes(double(r.peak_reserved_bytes)) << "</td><td>" << buf
          << format_count(double(r.ooms)) << "</td><td>" << format_count(double(r.upstream_allocations)) << "</td><td>"
          << format_count(r.ns_per_op_p50) << "</td><td>" << format_count(r.ns_per_op_p99) << "</td><td>"
          << (r.recorded_reserved_bytes ? format_bytes(double(*r.recorded_reserved_bytes)) : "-") << "</td></tr>\n";
    }
    out << "</table>\n";
    if (t->step_starts.size() >= 2) {  // as the text table's "res/live 2+" lines
      out << "<p>Replayed as " << t->step_starts.size()
          << " steps; after the first (where a planning allocator learns), peak reserved / peak live:";
      const char* sep = " ";
      for (const auto& r : results) {
        if (!r.error.empty()) continue;
        std::snprintf(buf, sizeof buf, "%.4f", r.later_steps_reserved_per_live());
        out << sep << escape_html(r.allocator) << " " << buf;
        sep = ", ";
      }
      out << ".</p>\n";
    }
    for (const auto& r : results)
      if (r.error.empty() && !r.note.empty()) out << "<p>" << escape_html(r.allocator) << ": " << escape_html(r.note) << "</p>\n";
    std::vector<line> bytes_lines, waste_lines, largest_lines;
    double y_max = 0, largest_max = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      if (!r.error.empty()) continue;
      line reserved{r.allocator + " reserved", colour(i), {}}, waste{r.allocator, colour(i), {}},
          largest{r.allocator, colour(i), {}};
      bool reports_largest = false;
      for (const auto& p : r.series) {
        reserved.points.emplace_back(double(p.event), double(p.reserved_bytes));
        waste.points.emplace_back(double(p.event),
                                  p.reserved_bytes == 0 ? 0.0 : 1.0 - double(p.live_bytes) / double(p.reserved_bytes));
        largest.points.emplace_back(double(p.event), double(p.largest_free_block));
        reports_largest = reports_largest || p.largest_free_block != 0;
        y_max = std::max(y_max, double(p.reserved_bytes));
        largest_max = std::max(largest_max, double(p.largest_free_block));
      }
      bytes_lines.push_back(std::move(reserved));
      waste_lines.push_back(std::move(waste));
      if (reports_largest) largest_lines.push_back(std::move(largest));  // (a bare device reports none)
    }
    const replay_result* first = nullptr;
    for (const auto& r : results)
      if (r.error.empty() && first == nullptr) first = &r;
    if (first != nullptr) {
      line live{"live (all)", "#000000", {}, true};
      line recorded{"recorded reserved", "#7f7f7f", {}, true};
      for (const auto& p : first->series) {
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
    out << chart(id + "-bytes", "live vs reserved bytes", bytes_lines, y_max * 1.05, true);
    out << chart(id + "-waste", "waste: 1 - live / reserved", waste_lines, 1.0, false);
    if (!largest_lines.empty())
      out << chart(id + "-largest-free", "largest free block (the largest request it could serve without growing)",
                   largest_lines, largest_max * 1.05, true);
    out << vram::detail::trace::free_size_chart(id + "-free-sizes", results);
    if (t->tenants.size() > 1 && first != nullptr) out << vram::detail::trace::tenant_chart(id + "-tenants", *t, *first);
    out << "</section>\n";
  }
  out << vram::detail::trace::zoom_script << "</body></html>\n";
}

}  // namespace vram::trace

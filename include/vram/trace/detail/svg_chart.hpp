#pragma once
// The report's inline SVG charts (timelines, stacked bands, grouped bars; nothing from the
// network), and the number formatting its tables and axes share.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace vram::detail::trace {

/// "1.23 GiB", "512 B".
inline std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}


inline std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// Where the x labels sit: above the axis title.
inline constexpr double bottom_label_gap = 22;

inline const char* colour(std::size_t i) {
  static const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"};
  return palette[i % 7];
}

/// "12,345,678": whole numbers with thousands separators.
inline std::string format_count(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", v < 0 ? 0.0 : v);
  std::string digits = buf, out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

struct line {
  std::string label, colour;
  std::vector<std::pair<double, double>> points;  // x, y
  bool dashed = false;
};

/// The geometry every chart shares: the plot area is [left, w - right] x [top, h - bottom],
/// the legend to its right.
struct frame {
  static constexpr double w = 900, h = 300, left = 80, right = 200, top = 30, bottom = 40;
  static constexpr double plot_w = w - left - right, plot_h = h - top - bottom;
};

/// The opening of a chart's SVG: its title, and horizontal grid lines with y labels
/// (bytes, or a fraction as a percentage).
inline std::string chart_open(const std::string& id, const std::string& title, double y_max, bool bytes,
                              const std::string& attributes = "") {
  char buf[256];
  auto py = [&](double y) { return frame::top + (1 - y / y_max) * frame::plot_h; };
  std::string s = "<figure id=\"" + id + "\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"300\" "
                  "viewBox=\"0 0 900 300\"" + attributes + ">";
  s += "<text x=\"80\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" + escape_html(title) + "</text>";
  for (int k = 0; k <= 4; ++k) {
    double y = y_max * k / 4;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.0f\" y=\"%.1f\" "
                  "font-size=\"11\" text-anchor=\"end\">",
                  frame::left, py(y), frame::w - frame::right, py(y), frame::left - 5, py(y) + 4);
    s += buf;
    s += bytes ? format_bytes(y) : std::to_string(int(y * 100 + 0.5)) + "%";
    s += "</text>";
  }
  return s;
}

/// A legend entry: a swatch (a line, or a filled box) and its label, entry i from the top.
inline std::string legend_entry(std::size_t i, const std::string& colour, const std::string& label, bool dashed,
                                bool filled) {
  char buf[320];
  const double x = frame::w - frame::right + 10;
  const double y = 40 + 16 * static_cast<double>(i);
  if (filled)
    std::snprintf(buf, sizeof buf, "<rect x=\"%.0f\" y=\"%.0f\" width=\"20\" height=\"8\" fill=\"%s\"/>", x, y - 4,
                  colour.c_str());
  else
    std::snprintf(buf, sizeof buf, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/>",
                  x, y, x + 20, y, colour.c_str(), dashed ? " stroke-dasharray=\"5,3\"" : "");
  std::string s = buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">", x + 25, y + 4);
  return s + buf + escape_html(label) + "</text>";
}

/// A timeline: y over the event index, one polyline per line (or, `stacked`, filled bands:
/// line i is the running total up to it, filled down to line i - 1). The drawing is clipped
/// to the plot area inside a <g class="zoom">, and the x labels carry their fraction of the
/// axis, so the page's script can zoom all timelines of a trace together (report.hpp).
inline std::string chart(const std::string& id, const std::string& title, const std::vector<line>& lines, double y_max,
                         bool bytes, bool stacked = false) {
  double x_max = 1;
  for (const auto& l : lines)
    for (auto [x, y] : l.points) x_max = std::max(x_max, x);
  y_max = std::max(y_max, 1e-9);
  auto px = [&](double x) { return frame::left + x / x_max * frame::plot_w; };
  auto py = [&](double y) { return frame::top + (1 - std::min(y, y_max) / y_max) * frame::plot_h; };
  char buf[256];
  std::snprintf(buf, sizeof buf, " class=\"timeline\" data-x-max=\"%.0f\"", x_max);
  std::string s = chart_open(id, title, y_max, bytes, buf);
  for (int k = 0; k <= 4; ++k) {
    std::snprintf(buf, sizeof buf, "<text class=\"xtick\" data-f=\"%.2f\" x=\"%.1f\" y=\"%.0f\" font-size=\"11\" "
                  "text-anchor=\"middle\">", k / 4.0, px(x_max * k / 4), frame::h - bottom_label_gap);
    s += buf + format_count(x_max * k / 4) + "</text>";
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">event index</text>",
                frame::left + frame::plot_w / 2, frame::h - 4);
  s += buf;
  std::snprintf(buf, sizeof buf,
                "<clipPath id=\"%s-clip\"><rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\"/></clipPath>"
                "<g clip-path=\"url(#%s-clip)\"><g class=\"zoom\">",
                id.c_str(), frame::left, frame::top, frame::plot_w, frame::plot_h, id.c_str());
  s += buf;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    if (stacked) {
      s += "<polygon fill=\"" + l.colour + "\" stroke=\"none\" points=\"";
      for (auto [x, y] : l.points) {
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y));
        s += buf;
      }
      if (i == 0) {  // down to the axis
        std::snprintf(buf, sizeof buf, "%.1f,%.1f %.1f,%.1f", px(l.points.back().first), py(0), px(l.points.front().first), py(0));
        s += buf;
      } else {  // down to the band below, backwards
        for (auto it = lines[i - 1].points.rbegin(); it != lines[i - 1].points.rend(); ++it) {
          std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(it->first), py(it->second));
          s += buf;
        }
      }
      s += "\"/>";
      continue;
    }
    // The stroke keeps its width when the zoom stretches the drawing.
    s += "<polyline fill=\"none\" stroke=\"" + l.colour + "\" stroke-width=\"1.5\" vector-effect=\"non-scaling-stroke\"" +
         (l.dashed ? " stroke-dasharray=\"5,3\"" : "") + " points=\"";
    for (auto [x, y] : l.points) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y));
      s += buf;
    }
    s += "\"/>";
  }
  s += "</g></g>";
  for (std::size_t i = 0; i < lines.size(); ++i)
    s += legend_entry(i, lines[i].colour, lines[i].label, lines[i].dashed, stacked);
  return s + "</svg></figure>\n";
}

/// One group of bars (one per series) for each category along x.
struct bar_series {
  std::string label, colour;
  std::vector<double> values;      // per category
  std::vector<std::string> notes;  // per category: the bar's tooltip
};

/// A grouped bar chart: categories along x (their labels under them), a bar per series in
/// each, bytes on y.
inline std::string bar_chart(const std::string& id, const std::string& title, const std::vector<std::string>& categories,
                             const std::vector<bar_series>& series) {
  double y_max = 1e-9;
  for (const auto& b : series)
    for (double v : b.values) y_max = std::max(y_max, v);
  y_max *= 1.05;
  std::string s = chart_open(id, title, y_max, true);
  char buf[320];
  const double group = frame::plot_w / static_cast<double>(std::max<std::size_t>(1, categories.size()));
  const double bar = group * 0.8 / static_cast<double>(std::max<std::size_t>(1, series.size()));
  for (std::size_t c = 0; c < categories.size(); ++c) {
    const double x0 = frame::left + group * static_cast<double>(c) + group * 0.1;
    for (std::size_t i = 0; i < series.size(); ++i) {
      double v = c < series[i].values.size() ? series[i].values[c] : 0;
      if (v <= 0) continue;
      double top = frame::top + (1 - v / y_max) * frame::plot_h;
      std::snprintf(buf, sizeof buf, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>",
                    x0 + bar * static_cast<double>(i), top, std::max(1.0, bar - 1), frame::top + frame::plot_h - top,
                    series[i].colour.c_str());
      s += buf + escape_html(c < series[i].notes.size() ? series[i].notes[c] : "") + "</title></rect>";
    }
    if (categories.size() > 12 && c % 2 == 1) continue;  // every other label, where they would overlap
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"middle\">",
                  x0 + group * 0.4, frame::h - bottom_label_gap);
    s += buf + escape_html(categories[c]) + "</text>";
  }
  for (std::size_t i = 0; i < series.size(); ++i) s += legend_entry(i, series[i].colour, series[i].label, false, true);
  return s + "</svg></figure>\n";
}

}  // namespace vram::detail::trace

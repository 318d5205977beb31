#pragma once
// The report's inline SVG line charts (no scripts, nothing from the network), and the byte
// formatting its tables and axes share.

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

inline const char* colour(std::size_t i) {
  static const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"};
  return palette[i % 7];
}

struct line {
  std::string label, colour;
  std::vector<std::pair<double, double>> points;  // x, y
  bool dashed = false;
};

/// An SVG line chart, axes with a few labelled ticks.
inline std::string chart(const std::string& title, const std::vector<line>& lines, double y_max, bool bytes) {
  const double w = 900, h = 300, left = 80, right = 200, top = 30, bottom = 40;
  double x_max = 1;
  for (const auto& l : lines)
    for (auto [x, y] : l.points) x_max = std::max(x_max, x);
  y_max = std::max(y_max, 1e-9);
  auto px = [&](double x) { return left + x / x_max * (w - left - right); };
  auto py = [&](double y) { return top + (1 - y / y_max) * (h - top - bottom); };
  char buf[256];
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"300\" viewBox=\"0 0 900 300\">";
  s += "<text x=\"" + std::to_string(int(left)) + "\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" + escape_html(title) + "</text>";
  for (int k = 0; k <= 4; ++k) {
    double y = y_max * k / 4;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.0f\" y=\"%.1f\" "
                  "font-size=\"11\" text-anchor=\"end\">",
                  left, py(y), w - right, py(y), left - 5, py(y) + 4);
    s += buf;
    s += bytes ? format_bytes(y) : std::to_string(int(y * 100 + 0.5)) + "%";
    s += "</text>";
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" text-anchor=\"middle\">event index (0 .. %.0f)</text>",
                (left + w - right) / 2, h - 10, x_max);
  s += buf;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    s += "<polyline fill=\"none\" stroke=\"" + l.colour + "\" stroke-width=\"1.5\"" +
         (l.dashed ? " stroke-dasharray=\"5,3\"" : "") + " points=\"";
    for (auto [x, y] : l.points) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(std::min(y, y_max)));
      s += buf;
    }
    s += "\"/>";
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.0f\" y1=\"%zu\" x2=\"%.0f\" y2=\"%zu\" stroke=\"%s\" stroke-width=\"2\"%s/><text x=\"%.0f\" "
                  "y=\"%zu\" font-size=\"11\">",
                  w - right + 10, 40 + 16 * i, w - right + 30, 40 + 16 * i, l.colour.c_str(),
                  l.dashed ? " stroke-dasharray=\"5,3\"" : "", w - right + 35, 44 + 16 * i);
    s += buf + escape_html(l.label) + "</text>";
  }
  return s + "</svg>\n";
}

}  // namespace vram::detail::trace

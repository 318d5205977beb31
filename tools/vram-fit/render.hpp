#pragma once
// vram-fit's HTML page: per card, a stacked bar per allocator of what fills it at the peak
// (what the card holds outside the allocator first), and the remedies' table. A room of main.cpp, included by it alone.

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <vram-fit/flags.hpp>
#include <vram-fit/search.hpp>
#include <vram/trace/detail/json.hpp>
#include <vram/trace/step.hpp>

namespace {

using namespace vram::trace;
using vram_fit::remedy;
using vram_fit::remedies_for;

/// The self-contained HTML page: per card, one stacked bar per allocator of what fills it at
/// the peak (what the card holds outside the allocator, each category, then what the allocator
/// reserves beyond the live bytes), against the card's capacity.
class html_page {
 public:
  /// The categories' colours, then fragmentation's, then what is outside the allocator.
  static constexpr const char* colours[category_count + 2] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                              "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#17becf"};
  static_assert(colours[category_count + 1] != nullptr, "a colour for every category");

  html_page(const request& q, const category_peak& peak) : peak_(peak) {
    using vram::detail::trace::json_quote;
    body_ << "<h1>vram-fit: " << escape(q.model.name) << "</h1>\n<p>" << q.model.parameters() << " parameters; "
          << mode_name(q.run.mode) << ", batch " << q.run.batch << " &times; sequence " << q.run.sequence
          << ", weights " << format_name(q.run.weights) << ". Peak live " << gib(double(peak.peak_live))
          << " GiB.</p>\n<p>";
    for (std::size_t i = 0; i <= category_count + 1; ++i)
      body_ << "<span class=key style=\"background:" << colours[i] << "\"></span>"
            << (i < category_count    ? category_names[i]
                : i == category_count ? "reserved beyond live"
                                      : "outside the allocator (CUDA context, libraries, NCCL)")
            << " ";
    body_ << "</p>\n";
  }

  struct remedy_row {
    std::string name, cost;
    double saves;
    std::uint64_t needs;
    bool fits;
  };

  /// One card of `capacity` bytes, `outside` of them outside the allocator: `results` per
  /// allocator, whether it fits and what it reserves on the rest (or needs, when it does not
  /// fit): the figures the text prints, so a bar ends inside the card line exactly when the
  /// text says it fits.
  void card(double card_gib, std::size_t capacity, std::uint64_t outside, const std::string& verdict,
            const std::vector<outcome>& results,
            const std::vector<remedy_row>& remedies, const std::string& combination, bool combination_fits) {
    std::uint64_t widest = capacity;
    for (const outcome& n : results) widest = std::max<std::uint64_t>(widest, outside + n.peak_reserved);
    const double width = 900, scale = (width - 180) / (double(widest) * 1.05);
    const int row = 34;
    body_ << "<h2>" << card_gib << " GiB card</h2>\n";
    if (!verdict.empty()) body_ << "<p class=verdict>" << escape(verdict) << "</p>\n";
    body_ << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << row * results.size() + 30
          << "\">\n";
    for (std::size_t a = 0; a < results.size(); ++a) {
      const int y = int(a) * row + 6;
      double x = 170;
      body_ << "<text x=\"0\" y=\"" << y + 17 << "\">" << escape(results[a].allocator) << (results[a].fits ? "" : " (OOM)")
            << "</text>\n";
      auto bar = [&](std::uint64_t bytes, const char* colour, const std::string& what) {
        const double w = double(bytes) * scale;
        if (w <= 0) return;
        body_ << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"24\" fill=\"" << colour
              << "\"><title>" << escape(what) << " " << gib(double(bytes)) << " GiB</title></rect>\n";
        x += w;
      };
      bar(outside, colours[category_count + 1], "outside the allocator");
      for (std::size_t i = 0; i < category_count; ++i) bar(peak_.at_peak[i], colours[i], category_names[i]);
      const std::uint64_t reserved = results[a].peak_reserved;
      bar(reserved > peak_.peak_live ? reserved - peak_.peak_live : 0, colours[category_count], "reserved beyond live");
    }
    const double cx = 170 + double(capacity) * scale;
    body_ << "<line x1=\"" << cx << "\" y1=\"0\" x2=\"" << cx << "\" y2=\"" << row * results.size() + 4
          << "\" stroke=\"#000\" stroke-width=\"2\"/>\n<text text-anchor=\"end\" x=\"" << cx - 4 << "\" y=\""
          << row * results.size() + 20 << "\">the card: " << card_gib << " GiB</text>\n</svg>\n";
    if (!remedies.empty()) {
      body_ << "<table><tr><th>remedy, alone</th><th>saves GiB</th><th>needs GiB</th><th></th><th>costs</th></tr>\n";
      for (const remedy_row& r : remedies)
        body_ << "<tr><td>" << escape(r.name) << "</td><td>" << gib(r.saves) << "</td><td>" << gib(double(r.needs))
              << "</td><td>" << (r.fits ? "fits" : "OOM") << "</td><td>" << escape(r.cost) << "</td></tr>\n";
      body_ << "</table>\n";
    }
    if (combination.empty()) body_ << "<p>" << (combination_fits ? "It fits as asked." : "No remedy helps.") << "</p>\n";
    else
      body_ << "<p>" << (combination_fits ? "To fit: " : "Even with ") << escape(combination)
            << (combination_fits ? "." : ", it does not fit.") << "</p>\n";
  }

  [[nodiscard]] std::string finish() const {
    return "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>vram-fit</title><style>"
           "body{font:14px sans-serif;margin:2em}svg text{font:13px sans-serif}"
           ".key{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}.verdict{color:#b00}"
           "td,th{padding:2px 10px;text-align:left}"
           "</style></head><body>\n" +
           body_.str() + "</body></html>\n";
  }

 private:
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '<') out += "&lt;";
      else if (c == '>') out += "&gt;";
      else if (c == '&') out += "&amp;";
      else if (c == '"') out += "&quot;";
      else out += c;
    }
    return out;
  }
  const category_peak& peak_;
  std::ostringstream body_;
};

}  // namespace

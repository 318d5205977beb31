#pragma once
// How far vram-fit's model was from the measured runs of the kind asked (measured.hpp): the
// lines of the answer that say so, and their JSON. A room of main.cpp, included by it alone.

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <vram-fit/flags.hpp>
#include <vram-fit/measured.hpp>
#include <vram-fit/search.hpp>
#include <vram-replay/lineup.hpp>
#include <vram/trace/detail/json.hpp>

namespace {

/// The kind of run asked, in words, where no measured run is of it.
std::string kind_in_words(const request& q) {
  if (q.model.mixture()) return "a mixture of experts";
  if (q.model.encoder) return "an encoder";
  if (!q.run.parallel.single()) return "a sharded run";
  const int storage = vram_fit::storage_class(q.run.weights);
  const char* base = storage == 1 ? " over an int8 base" : storage == 2 ? " over a 4-bit base" : "";
  return std::string(mode_name(q.run.mode)) + base;
}

std::string gigabytes(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GB", bytes / 1e9);
  return b;
}
std::string percent(double error) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.1f%%", 100 * error);
  return b;
}

struct accuracy_answer {
  std::string text;  ///< lines ending in '\n'
  std::string json;  ///< the value of "measured_runs": an array
};

/// Each measured run of the kind asked: the generator's peak against the measured one and,
/// where the source gives what PyTorch reserved, PyTorch's caching allocator (modelled)
/// replayed on the generated run against it.
accuracy_answer accuracy_of(const request& q) {
  using vram::detail::trace::json_quote;
  const std::vector<vram_fit::checked_run> checks = vram_fit::checks_of_kind(q.model, q.run);
  std::ostringstream text, json;
  json << "[";
  if (checks.empty()) {
    text << "measured runs of this kind: none (" << kind_in_words(q)
         << "): the figures follow from the mechanisms alone (docs/fit.md)\n";
    return {text.str(), "[]"};
  }
  text << "measured runs of this kind (docs/fit.md), predicted against measured:\n";
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const vram_fit::checked_run& c = checks[i];
    text << "  " << c.run->what << ": peak allocated " << gigabytes(c.predicted) << " against "
         << gigabytes(c.run->peak_allocated) << " (" << percent(c.error()) << ")";
    json << (i ? ", " : "") << "{\"run\": " << json_quote(c.run->what) << ", \"peak_allocated\": {\"predicted\": "
         << std::llround(c.predicted) << ", \"measured\": " << std::llround(c.run->peak_allocated)
         << ", \"error\": " << c.error() << "}";
    if (c.run->reserved != 0) {
      const vram::trace::step_trace t = vram::trace::generate_step(*find_preset(c.run->preset), c.run->run);
      const auto peak = peak_by_category(t);
      const double reserved =
          double(replay_on(t, unbounded_for(peak), {vram_replay::torch_caching_model_config()})[0].peak_reserved);
      const double error = (reserved - c.run->reserved) / c.run->reserved;
      text << "; reserved by torch-caching-model " << gigabytes(reserved) << " against " << gigabytes(c.run->reserved)
           << " (" << percent(error) << ")";
      json << ", \"reserved\": {\"allocator\": \"torch-caching-model\", \"predicted\": " << std::llround(reserved)
           << ", \"measured\": " << std::llround(c.run->reserved) << ", \"error\": " << error << "}";
    }
    text << "\n";
    json << "}";
  }
  json << "]";
  return {text.str(), json.str()};
}

}  // namespace

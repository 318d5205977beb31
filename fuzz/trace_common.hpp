#pragma once
// Shared by the trace-reader harnesses: a reader given any bytes either throws
// vram::trace::trace_error (a clear "cannot read this") or returns a trace that keeps the
// model's invariants. Anything else — another exception type, a crash, a hang, a sanitizer
// report — is a finding.

#include <set>
#include <sstream>
#include <string_view>

#include <vram/trace/read_trace.hpp>

#include "fuzz_common.hpp"

namespace vram::fuzz {

inline void check_trace(const vram::trace::trace& t) {
  using op = vram::trace::event::op;
  VRAM_FUZZ_CHECK(t.initial_live <= t.events.size());
  VRAM_FUZZ_CHECK(t.streams >= 1);
  std::set<std::uint64_t> seen, live;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& e = t.events[i];
    VRAM_FUZZ_CHECK(e.stream < t.streams);
    if (i < t.initial_live) VRAM_FUZZ_CHECK(e.kind == op::alloc);
    if (e.kind == op::alloc) {
      VRAM_FUZZ_CHECK(seen.insert(e.id).second);  // ids are allocated once
      live.insert(e.id);
    } else {
      VRAM_FUZZ_CHECK(live.erase(e.id) == 1);  // a free names a live id
    }
  }
  for (const auto& r : t.recorded_reserved) VRAM_FUZZ_CHECK(r.event_index <= t.events.size());
}

/// Runs `read` on the input; checks the result, and that vram's own format round-trips it.
template <class Read>
int fuzz_reader(const std::uint8_t* data, std::size_t size, Read read) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  vram::trace::trace t;
  try {
    t = read(text, std::string("fuzz-input"));
  } catch (const vram::trace::trace_error&) {
    return 0;
  }
  check_trace(t);
  std::ostringstream out;
  vram::trace::write_vram_trace(out, t);
  auto back = vram::trace::read_vram_trace(out.str(), "round-trip");
  VRAM_FUZZ_CHECK(back.events.size() == t.events.size());
  check_trace(back);
  return 0;
}

}  // namespace vram::fuzz

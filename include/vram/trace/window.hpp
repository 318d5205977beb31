#pragma once
// vram::trace::window: a stretch of a trace as a recording made over it would see it (a
// PyTorch snapshot started in the middle of training): the blocks live at its start come first,
// as the trace's blocks live at the start, then its events.

#include <algorithm>
#include <cstddef>
#include <unordered_map>
#include <vector>

#include <vram/core/error.hpp>
#include <vram/trace/trace.hpp>

namespace vram::trace {

/// Events [from, to) of `t` (held in memory), the blocks live before `from` allocated first
/// (in the order they were allocated); what is still live at `to` stays live at the end.
/// Streams and tenants are kept, recorded reserved samples dropped. Throws
/// vram::invalid_argument where the stretch is not inside the trace.
inline trace window(const trace& t, std::size_t from, std::size_t to) {
  if (t.streamed || from > to || to > t.events.size())
    throw vram::invalid_argument("trace::window: the stretch must lie inside a trace held in memory");
  std::unordered_map<std::uint64_t, std::size_t> live;  // id -> its allocation's event index
  for (std::size_t i = 0; i < from; ++i) {
    const event& e = t.events[i];
    if (e.kind == event::op::alloc) live.emplace(e.id, i);
    else live.erase(e.id);
  }
  std::vector<std::size_t> initial;
  initial.reserve(live.size());
  for (const auto& [id, at] : live) initial.push_back(at);
  std::sort(initial.begin(), initial.end());
  trace out;
  out.name = t.name;
  out.format = t.format;
  out.streams = t.streams;
  out.tenants = t.tenants;
  out.initial_live = initial.size();
  out.events.reserve(initial.size() + (to - from));
  for (std::size_t at : initial) out.events.push_back(t.events[at]);
  out.events.insert(out.events.end(), t.events.begin() + static_cast<std::ptrdiff_t>(from),
                    t.events.begin() + static_cast<std::ptrdiff_t>(to));
  return out;
}

}  // namespace vram::trace

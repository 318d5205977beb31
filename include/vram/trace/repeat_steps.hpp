#pragma once
// vram::trace::repeat_steps: a trace replayed as several identical steps, the way training
// and batched inference repeat one iteration, with the step boundaries marked.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <vram/core/throw.hpp>
#include <vram/trace/trace.hpp>

namespace vram::trace {

/// `t` as `steps` steps. Each step is t's window (the events after the blocks live at the
/// start), so every step leaves the allocator as it found it:
///   - the blocks live at the start are allocated once, before the first step;
///   - at the end of a step, what the step allocated and did not free is freed, and the
///     blocks live at the start that the step freed are allocated again (new ids), for the
///     next step to free. Those re-allocations belong to the step that makes them: they
///     outlive it, like a training step's outputs the next one consumes.
/// trace::step_starts holds each step's first event. Ids are renumbered per step; streams,
/// tenants and sizes are kept; recorded reserved samples are dropped (they describe one
/// step). A streamed trace is read into memory. Throws vram::invalid_argument for steps < 1.
inline trace repeat_steps(const trace& t, int steps) {
  if (steps < 1) detail::throw_invalid_argument("repeat_steps", "steps must be at least 1");
  std::vector<event> window;
  std::vector<event> initial;
  window.reserve(t.size());
  std::size_t at = 0;
  std::uint64_t stride = 1;
  t.for_each_event([&](const event& e) {
    (at++ < t.initial_live ? initial : window).push_back(e);
    stride = std::max(stride, e.id + 1);
  });

  trace out;
  out.name = t.name + " (" + std::to_string(steps) + " steps)";
  out.format = t.format;
  out.streams = t.streams;
  out.tenants = t.tenants;
  out.initial_live = initial.size();
  out.events.reserve(initial.size() + window.size() * static_cast<std::size_t>(steps) + 2 * initial.size());
  out.events.insert(out.events.end(), initial.begin(), initial.end());

  std::unordered_map<std::uint64_t, event> initial_by_id;
  for (const event& e : initial) initial_by_id.emplace(e.id, e);
  std::unordered_map<std::uint64_t, event> live;  // ids (renumbered) allocated in this step, not yet freed
  for (int s = 0; s < steps; ++s) {
    const std::uint64_t base = stride * static_cast<std::uint64_t>(s);
    out.step_starts.push_back(out.events.size());
    std::vector<event> freed_initial;  // in the order the step freed them
    for (event e : window) {
      const std::uint64_t original = e.id;
      e.id += base;  // an initial block freed in step s was re-allocated with this id at the end of step s - 1
      if (e.kind == event::op::alloc) {
        live.emplace(e.id, e);
      } else if (live.erase(e.id) == 0) {
        if (auto it = initial_by_id.find(original); it != initial_by_id.end()) freed_initial.push_back(it->second);
      }
      out.events.push_back(e);
    }
    std::vector<event> left(live.size());
    std::transform(live.begin(), live.end(), left.begin(), [](const auto& kv) { return kv.second; });
    std::sort(left.begin(), left.end(), [](const event& a, const event& b) { return a.id < b.id; });
    for (event e : left) {
      e.kind = event::op::free;
      out.events.push_back(e);
    }
    live.clear();
    if (s + 1 == steps) break;
    for (event e : freed_initial) {
      e.id += stride * static_cast<std::uint64_t>(s + 1);
      out.events.push_back(e);
    }
  }
  return out;
}

}  // namespace vram::trace

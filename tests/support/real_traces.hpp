#pragma once
// The shared real traces (VRAM_SHARED_TRACES, never copied into the project) and the trace
// invariants, checked independently of the readers' own bookkeeping.

#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <unordered_map>

#include <vram/trace/read_trace.hpp>

namespace vram::test {

/// The path of a shared trace; fails the test where it is missing.
inline std::string shared(const std::string& file) {
  std::string path = std::string(VRAM_SHARED_TRACES) + "/" + file;
  std::ifstream probe(path);
  if (!probe) FAIL("the shared trace " << path << " is missing: every machine of this project has it");
  return path;
}

/// Each real trace is parsed once per test binary (keeps sanitizer runs fast).
inline const vram::trace::trace& real(const std::string& file) {
  static std::map<std::string, vram::trace::trace> cache;
  auto it = cache.find(file);
  if (it == cache.end()) it = cache.emplace(file, vram::trace::read_trace(shared(file))).first;
  return it->second;
}

/// The trace invariants, checked independently of the readers' own bookkeeping (one CHECK
/// per trace, not per event, so sanitizer runs stay fast).
inline void check_consistent(const vram::trace::trace& t) {
  std::unordered_map<std::uint64_t, std::uint64_t> live;
  std::unordered_map<std::uint64_t, bool> seen;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& e = t.events[i];
    bad += e.stream >= t.streams;
    if (e.kind == vram::trace::event::op::alloc) {
      bad += seen.count(e.id) != 0;
      seen[e.id] = true;
      live[e.id] = e.bytes;
    } else {
      bad += i < t.initial_live;
      auto it = live.find(e.id);
      if (it == live.end() || it->second != e.bytes) {
        ++bad;
        continue;
      }
      live.erase(it);
    }
  }
  for (std::size_t i = 0; i < t.initial_live; ++i) bad += t.events[i].kind != vram::trace::event::op::alloc;
  CHECK(bad == 0);
}

}  // namespace vram::test

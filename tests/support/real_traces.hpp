#pragma once
// The shared real traces (a folder outside the project, never copied into it) and the trace
// invariants, checked independently of the readers' own bookkeeping.
//
// A test case that reads a shared trace is tagged [traces] on its TEST_CASE line:
// tests/CMakeLists.txt runs those cases as the CTest test NAME.traces, reported skipped where
// the folder (CMake's VRAM_TRACES_DIR) is absent, and the other cases as NAME with the folder
// set empty, so an untagged case that reads a trace fails on every machine.

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <unordered_map>

#include <vram/trace/read_trace.hpp>

namespace vram::test {

/// The folder of the shared traces: the environment's VRAM_TRACES_DIR where it is set (CTest
/// sets it for every test of a [traces] executable), else the configured one.
inline std::string traces_dir() {
  if (const char* dir = std::getenv("VRAM_TRACES_DIR")) return dir;
  return VRAM_SHARED_TRACES;
}

/// The path of a shared trace; fails the test where it is missing.
inline std::string shared(const std::string& file) {
  const std::string dir = traces_dir();
  std::string path = dir + "/" + file;
  if (dir.empty()) FAIL("this case reads the shared trace " << file << ": tag it [traces] (support/real_traces.hpp)");
  if (!std::ifstream(path)) FAIL("the shared trace " << path << " is missing from VRAM_TRACES_DIR");
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

#pragma once
// Helpers of the step generator's tests (vram/trace/step.hpp): a preset that must exist, and
// the replay engine's contract on a generated trace.

#include <catch2/catch.hpp>

#include <vector>

#include <vram/trace/model.hpp>
#include <vram/trace/step.hpp>

namespace vram::test {

inline vram::trace::transformer_model preset(const char* name) {
  auto m = vram::trace::find_preset(name);
  REQUIRE(m.has_value());
  return *m;
}

/// Every allocation is freed once, after it was made (the replay engine's contract).
inline void check_balanced(const vram::trace::step_trace& s) {
  std::vector<int> state(s.category_of.size(), 0);
  for (const vram::trace::event& e : s.t.events) {
    REQUIRE(e.id < state.size());
    if (e.kind == vram::trace::event::op::alloc) {
      REQUIRE(state[e.id] == 0);
      state[e.id] = 1;
    } else {
      REQUIRE(state[e.id] == 1);
      state[e.id] = 2;
    }
  }
  for (int x : state) REQUIRE(x == 2);
}

}  // namespace vram::test

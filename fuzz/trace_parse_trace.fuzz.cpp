// Fuzzes vram::trace::parse_trace (see trace_common.hpp for what is checked).
#include "trace_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The known lifetime-CSV defect (see trace_lifetime_csv.fuzz.cpp) is filtered here too.
  if (vram::fuzz::lifetime_csv_with_duplicate_ids({reinterpret_cast<const char*>(data), size})) return 0;
  return vram::fuzz::fuzz_reader(data, size, [](std::string_view text, const std::string& source) {
    return vram::trace::parse_trace(text, source);
  });
}

// Fuzzes vram::trace::parse_trace (see trace_common.hpp for what is checked).
#include "trace_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return vram::fuzz::fuzz_reader(data, size, [](std::string_view text, const std::string& source) {
    return vram::trace::parse_trace(text, source);
  });
}

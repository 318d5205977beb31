#pragma once
// Throw helpers of the interop layer (STYLE rule 7: throws go through one detail function).

#include <vram/interop/wrong_device.hpp>

namespace vram::detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_wrong_device(const char* resource, int expected, int actual) {
  throw wrong_device(resource, expected, actual);
}

}  // namespace vram::detail

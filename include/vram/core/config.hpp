#pragma once
// Build configuration shared by every vram header.
//
// VRAM_HAS_CUDA: 1 when the CUDA runtime is available (the CMake target defines it);
// without CMake it is detected from the include path.
// VRAM_DEBUG: 1 enables check_invariants() bodies and the debug-only checks.

#ifndef VRAM_HAS_CUDA
#  if __has_include(<cuda_runtime_api.h>)
#    define VRAM_HAS_CUDA 1
#  else
#    define VRAM_HAS_CUDA 0
#  endif
#endif

#ifndef VRAM_DEBUG
#  define VRAM_DEBUG 0
#endif

#if VRAM_HAS_CUDA
#  include <cuda_runtime_api.h>
#endif

#pragma once
// Build configuration shared by every vram header.
//
// VRAM_HAS_CUDA: 1 turns on the CUDA parts (CUDA streams and events, the CUDA sources), which
// then need the CUDA runtime at link time. On when the consumer asks for it: the CMake target
// vram::vram defines it where vram was configured with the CUDA toolkit, nvcc defines
// __CUDACC__ (and links cudart itself), and anyone may pass -DVRAM_HAS_CUDA=1. Never because
// a CUDA header happens to be on the include path: host-only code builds with plain
// `g++ -std=c++20 -I<prefix>/include`. (docs/getting-started.md lists every macro.)
// VRAM_DEBUG: 1 enables check_invariants() bodies and the debug-only checks.

#ifndef VRAM_HAS_CUDA
#  if defined(__CUDACC__)
#    define VRAM_HAS_CUDA 1
#  else
#    define VRAM_HAS_CUDA 0
// Nobody chose: the CUDA-only headers refuse to compile rather than compile to nothing
// (source/detail/cuda_only.hpp). A build that defines VRAM_HAS_CUDA=0 itself (vram::vram
// configured without the toolkit) has chosen, and gets them empty.
#    define VRAM_DETAIL_CUDA_NOT_CHOSEN 1
#  endif
#endif

#ifndef VRAM_DEBUG
#  define VRAM_DEBUG 0
#endif

#if VRAM_HAS_CUDA
#  include <cuda_runtime_api.h>
#endif

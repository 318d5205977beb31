#pragma once
// Included first by every CUDA-only header (vram/source/cuda_*.hpp). Without CUDA such a
// header would compile to nothing, and the first use of its class would fail far from the
// cause ("'cuda_device_source' is not a member of 'vram'"): where nobody chose (VRAM_HAS_CUDA
// not defined, plain g++), it stops here and says what to do. A build that defines
// VRAM_HAS_CUDA=0 itself (vram::vram configured without the toolkit) gets the header empty,
// so code that includes it and guards its use with #if VRAM_HAS_CUDA builds either way.

#include <vram/core/config.hpp>

#if !VRAM_HAS_CUDA && defined(VRAM_DETAIL_CUDA_NOT_CHOSEN)
#  error "this vram header is CUDA only and VRAM_HAS_CUDA is not set: compile with nvcc, or with -DVRAM_HAS_CUDA=1 -I<CUDA>/include and link -lcudart (vram::vram does both where vram was configured with the CUDA toolkit). On a machine without CUDA use vram/source/host_source.hpp or vram/source/simulated_device_source.hpp instead (docs/getting-started.md)."
#endif

#pragma once
// vram's version, as the CMake project declares it (CMakeLists.txt checks at configure time
// that the two agree). Semantic versioning: the minor version may change the API while the
// major version is 0.

#define VRAM_VERSION_MAJOR 0
#define VRAM_VERSION_MINOR 1
#define VRAM_VERSION_PATCH 0
/// MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons.
#define VRAM_VERSION (VRAM_VERSION_MAJOR * 10000 + VRAM_VERSION_MINOR * 100 + VRAM_VERSION_PATCH)

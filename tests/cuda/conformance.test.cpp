// The conformance suite over the CUDA sources. Runs on a GPU; skipped (exit 77) without one.
#include "cuda/fixtures.hpp"
#define VRAM_CONFORMANCE_FIXTURES vram::test::cuda_fixtures
#include "support/conformance.hpp"

// Catch2 main for the CUDA tests: without a usable GPU the executable says so loudly and
// exits with 77, which CTest reports as "skipped" (SKIP_RETURN_CODE), never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <vram/core/config.hpp>

int main(int argc, char* argv[]) {
  int devices = 0;
  cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::fprintf(stderr,
                 "\n*** SKIPPED: no usable CUDA GPU (%s). These CUDA tests did NOT run. ***\n\n",
                 status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 77;
  }
  // Catch2 exits with the number of failed assertions: 77 of them must not read as "skipped".
  return Catch::Session().run(argc, argv) == 0 ? 0 : 1;
}

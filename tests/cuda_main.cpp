// The main of the CUDA tests: without a usable GPU the executable says so loudly and exits
// with 77, which CTest reports as "skipped" (SKIP_RETURN_CODE), never as passed.
#include <cstdio>

#include <vram/core/config.hpp>

#include "support/catch_session.hpp"

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
  return vram::test::run_catch(argc, argv) == 0 ? 0 : 1;
}

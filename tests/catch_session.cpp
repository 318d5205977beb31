// Catch2's implementation, compiled once and linked into every test executable: the host
// tests', the CUDA tests' and the stand-in's mains (main.cpp, cuda_main.cpp) only call
// run_catch. It includes no vram header, so one object serves every CUDA configuration.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_session.hpp"

int vram::test::run_catch(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }

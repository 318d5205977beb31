#pragma once
// The entry into Catch2 for the test mains (its implementation: tests/catch_session.cpp).

namespace vram::test {

/// Runs the executable's Catch2 tests; returns the number of failed assertions (0: all passed).
int run_catch(int argc, char* argv[]);

}  // namespace vram::test

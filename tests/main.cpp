// The one main shared by every host test executable (compiled once). Before Catch2 runs,
// the executable's declared prerequisites are checked (support/prerequisite.hpp): a missing
// one skips the executable with exit code 77 (CTest's SKIP_RETURN_CODE).
#include <cstdio>

#include "support/catch_session.hpp"
#include "support/prerequisite.hpp"

int main(int argc, char* argv[]) {
  for (const auto* p : vram::test::prerequisite::all())
    if (!p->available()) {
      std::fprintf(stderr, "\n*** SKIPPED: %s is missing. The tests of this executable did NOT run. ***\n\n",
                   p->what());
      return 77;
    }
  // Catch2 exits with the number of failed assertions: 77 of them must not read as "skipped".
  return vram::test::run_catch(argc, argv) == 0 ? 0 : 1;
}

// The conformance suite over every host-side resource (see tests/support/fixtures.hpp).
#include "support/fixtures.hpp"
#define VRAM_CONFORMANCE_FIXTURES vram::test::host_fixtures
#include "support/conformance.hpp"

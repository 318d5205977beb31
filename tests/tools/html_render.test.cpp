// The HTML report renders in headless Chromium (where `chromium` is installed): the page
// loads without network, and a screenshot is kept in the build folder as an artifact.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

#ifndef VRAM_REPLAY_EXE
#define VRAM_REPLAY_EXE ""
#endif

TEST_CASE("vram-replay --html renders in headless chromium") {
  if (std::string(VRAM_REPLAY_EXE).empty()) {
    WARN("SKIPPED: vram-replay was not built (VRAM_BUILD_TOOLS=OFF)");
    return;
  }
  std::string chromium;
  for (const char* c : {"chromium", "chromium-browser", "google-chrome"})
    if (std::system(("command -v " + std::string(c) + " > /dev/null 2>&1").c_str()) == 0) {
      chromium = c;
      break;
    }
  if (chromium.empty()) {
    WARN("SKIPPED: chromium is not installed (apt-get install chromium): the HTML report was not rendered");
    return;
  }
  namespace fs = std::filesystem;
  fs::path html = fs::absolute("vram_replay_render.html"), png = fs::absolute("vram_replay_report.png");
  fs::remove(png);
  REQUIRE(std::system((std::string("'") + VRAM_REPLAY_EXE + "' --html '" + html.string() + "' > /dev/null 2>&1").c_str()) == 0);
  std::string command = chromium + " --headless --no-sandbox --disable-gpu --window-size=1000,2400 --screenshot='" +
                        png.string() + "' 'file://" + html.string() + "' > /dev/null 2>&1";
  CHECK(std::system(command.c_str()) == 0);
  REQUIRE(fs::exists(png));
  CHECK(fs::file_size(png) > 10000);  // a blank page is a few kB; plots make it larger
  WARN("screenshot: " << png.string());
}

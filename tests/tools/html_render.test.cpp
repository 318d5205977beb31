// The HTML pages render in headless Chromium: vram-replay's report (each allocator drawn in
// every figure, each figure alone through its #id, the tenants' bands, the timelines zoomed
// by the page's script) and vram-fit's answer (each category's bar drawn). Each page loads without network,
// and what it draws is counted in the screenshot (its colour's pixels, beyond what the
// legends hold). The screenshot is kept in the build folder as an artifact. Chromium comes
// from scripts/setup (Debian's `chromium`), zlib (to read the PNG) too; where either is
// missing the executable reports itself skipped (exit 77).

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "support/prerequisite.hpp"

#if !defined(VRAM_REPLAY_EXE) || !defined(VRAM_FIT_EXE)
#error "VRAM_REPLAY_EXE, VRAM_FIT_EXE: tools/CMakeLists.txt defines them wherever the tools are built"
#endif

#if VRAM_WITH_ZLIB
#include <zlib.h>

namespace {

/// The first Chromium on PATH, or "".
const std::string& chromium() {
  static const std::string found = [] {
    for (const char* c : {"chromium", "chromium-browser", "google-chrome"})
      if (std::system(("command -v " + std::string(c) + " > /dev/null 2>&1").c_str()) == 0) return std::string(c);
    return std::string();
  }();
  return found;
}

const vram::test::prerequisite chromium_needed{"chromium (scripts/setup installs Debian's chromium)",
                                               [] { return !chromium().empty(); }};

std::uint32_t be32(const std::string& s, std::size_t at) {
  return std::uint32_t(std::uint8_t(s[at])) << 24 | std::uint32_t(std::uint8_t(s[at + 1])) << 16 |
         std::uint32_t(std::uint8_t(s[at + 2])) << 8 | std::uint32_t(std::uint8_t(s[at + 3]));
}

/// How many pixels of each RGB colour (0xRRGGBB) an 8-bit, non-interlaced RGB or RGBA PNG
/// holds (what Chromium's --screenshot writes).
std::map<std::uint32_t, std::size_t> colour_counts(const std::string& png) {
  REQUIRE(png.size() > 33);
  REQUIRE(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  std::uint32_t width = be32(png, 16), height = be32(png, 20);
  int depth = png[24], type = png[25], interlace = png[28];
  REQUIRE(depth == 8);
  REQUIRE((type == 2 || type == 6));
  REQUIRE(interlace == 0);
  std::string idat;
  for (std::size_t at = 8; at + 8 <= png.size();) {
    std::uint32_t n = be32(png, at);
    if (png.compare(at + 4, 4, "IDAT") == 0) idat += png.substr(at + 8, n);
    at += 12 + std::size_t{n};
  }
  const std::size_t bpp = type == 6 ? 4 : 3, stride = width * bpp;
  std::vector<unsigned char> raw(height * (stride + 1));
  uLongf size = raw.size();
  REQUIRE(uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) == Z_OK);
  REQUIRE(size == raw.size());
  std::vector<unsigned char> prev(stride, 0), row(stride);
  std::map<std::uint32_t, std::size_t> counts;
  for (std::uint32_t y = 0; y < height; ++y) {
    const unsigned char* in = raw.data() + y * (stride + 1);
    if (in[0] > 4) FAIL("PNG row " << y << " has an unknown filter " << int(in[0]));
    for (std::size_t x = 0; x < stride; ++x) {  // undo the row's filter (PNG spec, section 9)
      int a = x >= bpp ? row[x - bpp] : 0, b = prev[x], c = x >= bpp ? prev[x - bpp] : 0, p = a + b - c;
      int pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
      int predictor[] = {0, a, b, (a + b) / 2, pa <= pb && pa <= pc ? a : pb <= pc ? b : c};
      row[x] = static_cast<unsigned char>(in[1 + x] + predictor[in[0]]);
    }
    for (std::size_t x = 0; x < stride; x += bpp) ++counts[std::uint32_t(row[x]) << 16 | row[x + 1] << 8 | row[x + 2]];
    prev.swap(row);
  }
  return counts;
}

/// Renders `html` (with `suffix`: "#figure-id", "?query") in headless Chromium at `size`
/// ("1000,2400") and counts the screenshot's colours.
std::map<std::uint32_t, std::size_t> render(const std::filesystem::path& html, const std::filesystem::path& png,
                                            const char* size, const std::string& suffix = "") {
  std::filesystem::remove(png);
  std::string command = chromium() + " --headless --no-sandbox --disable-gpu --window-size=" + size + " --screenshot='" +
                        png.string() + "' 'file://" + html.string() + suffix + "' > /dev/null 2>&1";
  CHECK(std::system(command.c_str()) == 0);
  REQUIRE(std::filesystem::exists(png));
  std::ifstream in(png, std::ios::binary);
  return colour_counts({std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()});
}

}  // namespace

TEST_CASE("vram-replay --html renders in headless chromium, every allocator's line drawn") {
  namespace fs = std::filesystem;
  fs::path html = fs::absolute("vram_replay_render.html"), png = fs::absolute("vram_replay_report.png");
  REQUIRE(std::system((std::string("'") + VRAM_REPLAY_EXE + "' --html '" + html.string() + "' > /dev/null 2>&1").c_str()) == 0);
  auto counts = render(html, png, "1000,2400");
  // The first trace's five default allocators, in svg_chart's palette order. The legends'
  // swatches hold about 40 pixels of a colour per chart; a drawn line holds thousands.
  for (std::uint32_t colour : {0x1f77b4u, 0xd62728u, 0x2ca02cu, 0x9467bdu, 0xff7f0eu}) {
    INFO("colour " << std::hex << colour);
    CHECK(counts[colour] > 1000);
  }
  WARN("screenshot: " << png.string());
}

/// The DOM of `html` once its script has run, as headless Chromium prints it.
std::string rendered_dom(const std::filesystem::path& html, const std::string& suffix) {
  std::filesystem::path dom = html;
  dom += ".dom";
  std::string command = chromium() + " --headless --no-sandbox --disable-gpu --dump-dom 'file://" + html.string() + suffix +
                        "' > '" + dom.string() + "' 2> /dev/null";
  CHECK(std::system(command.c_str()) == 0);
  std::ifstream in(dom);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_CASE("vram-replay's report: each figure alone is drawn, the tenants stacked, the timelines zoomed by its script") {
  namespace fs = std::filesystem;
  // An RMM log as the tracker writes it: three tenants, each with its own churn, a long-lived
  // block per tenant, on two streams.
  fs::path log = fs::absolute("vram_replay_tenants.csv"), html = fs::absolute("vram_replay_tenants.html");
  {
    std::ofstream out(log);
    out << "Thread,Time,Action,Pointer,Size,Stream,Tenant\n";
    const char* tenants[] = {"serving/llama", "train", "\"batch, nightly\""};
    std::uint64_t address = 0x7f0000000000;
    for (int round = 0; round < 300; ++round)
      for (int t = 0; t < 3; ++t) {
        std::uint64_t size = std::uint64_t(1 + t) << (20 + round % 4), a = address += 64 << 20;
        out << "1,00:00:01.000000,allocate,0x" << std::hex << a << std::dec << "," << size << ",0x" << t % 2 << ","
            << tenants[t] << "\n";
        if (round % 5 != 0)  // every fifth block stays: each tenant's bytes grow
          out << "1,00:00:01.000000,free,0x" << std::hex << a << std::dec << "," << size << ",0x" << t % 2 << ","
              << tenants[t] << "\n";
      }
  }
  REQUIRE(std::system((std::string("'") + VRAM_REPLAY_EXE + "' --no-timing --html '" + html.string() + "' '" + log.string() +
                       "' > /dev/null 2>&1").c_str()) == 0);
  fs::path png = fs::absolute("vram_replay_figure.png");
  // Each figure alone is the page. The largest free block over time: a line for each
  // allocator that reports one (pool-contiguous, pool-segments, arena, rmm-pool-model; the
  // bare device, upstream, holds no free blocks); a legend's swatch is 40 pixels.
  auto largest = render(html, png, "1000,700", "#t0-largest-free");
  for (std::uint32_t colour : {0x1f77b4u, 0xd62728u, 0x2ca02cu, 0xff7f0eu}) {
    INFO("largest free block, colour " << std::hex << colour);
    CHECK(largest[colour] > 150);
  }
  CHECK(largest[0x9467bdu] == 0);
  // The free bytes at peak by block size: bars of the allocators that hold free bytes there
  // (pool-contiguous holds almost none: it reserves 1.000 of live); a legend's box is 160 pixels.
  auto sizes = render(html, png, "1000,700", "#t0-free-sizes");
  for (std::uint32_t colour : {0xd62728u, 0x2ca02cu, 0xff7f0eu}) {
    INFO("free sizes, colour " << std::hex << colour);
    CHECK(sizes[colour] > 400);
  }
  CHECK(sizes[0x9467bdu] == 0);
  // The three tenants, stacked bands of the first three colours, each many pixels; no fourth
  // band (no allocation without a tenant).
  auto tenants = render(html, png, "1000,700", "#t0-tenants");
  for (std::uint32_t colour : {0x1f77b4u, 0xd62728u, 0x2ca02cu}) {
    INFO("tenant colour " << std::hex << colour);
    CHECK(tenants[colour] > 2000);
  }
  CHECK(tenants[0x9467bdu] == 0);
  std::string page = rendered_dom(html, "");
  CHECK(page.find("batch, nightly") != std::string::npos);
  CHECK(page.find("serving/llama") != std::string::npos);
  // ?zoom=0.25,0.5: every timeline stretched four times, its x labels rewritten to the range.
  std::string zoomed = rendered_dom(html, "?zoom=0.25,0.5");
  CHECK(zoomed.find("scale(4 1)") != std::string::npos);
  CHECK(zoomed.find("data-view=\"0.25,0.5\"") != std::string::npos);
  CHECK(page.find("scale(4 1)") == std::string::npos);
  WARN("screenshot: " << png.string());
}

TEST_CASE("vram-replay's report opens with the verdict: the C++ type to write, per trace") {
  namespace fs = std::filesystem;
  fs::path html = fs::absolute("vram_replay_verdict.html");
  REQUIRE(std::system((std::string("'") + VRAM_REPLAY_EXE + "' --no-timing --html '" + html.string() + "' > /dev/null 2>&1").c_str()) == 0);
  const std::string dom = rendered_dom(html, "");
  const std::size_t verdict = dom.find("<h2>Verdict</h2>"), first_trace = dom.find("<section class=\"trace\"");
  REQUIRE(verdict != std::string::npos);
  CHECK(verdict < first_trace);  // at the top, before the first trace's table
  CHECK(dom.find("vram::stream_pool&lt;vram::cuda_vmm_source&gt; (pool-contiguous): ") < first_trace);
  CHECK(dom.find("kv-cache-inference") < first_trace);  // one verdict per trace
}

TEST_CASE("vram-fit --html renders in headless chromium, what fills the card drawn per allocator") {
  namespace fs = std::filesystem;
  fs::path html = fs::absolute("vram_fit_render.html"), png = fs::absolute("vram_fit_answer.png");
  REQUIRE(std::system((std::string("'") + VRAM_FIT_EXE + "' --preset gpt2-medium --batch 8 --gpu 24 --no-search --html '" +
                       html.string() + "' > /dev/null 2>&1")
                          .c_str()) == 0);
  auto counts = render(html, png, "1000,900");
  // weights, optimizer, activations, temporaries and what the allocators reserve beyond the
  // live bytes: four bars of each; a legend's key is 144 pixels.
  for (std::uint32_t colour : {0x1f77b4u, 0x2ca02cu, 0xd62728u, 0x9467bdu, 0x7f7f7fu}) {
    INFO("colour " << std::hex << colour);
    CHECK(counts[colour] > 1000);
  }
  WARN("screenshot: " << png.string());
}
#else
static const vram::test::prerequisite zlib_needed{"zlib, to read the screenshot (zlib1g-dev from scripts/setup)",
                                                  [] { return false; }};
#endif

// Gzip input (.json.gz), read through zlib: a Kineto trace compressed here, corrupt and
// truncated streams, and the shared df_index_resolver.json.gz. zlib (zlib1g-dev) comes from
// scripts/setup; a build without it (no VRAM_WITH_ZLIB) reports this executable skipped.

#include <catch2/catch.hpp>

#include <string>

#include <vram/trace/read_trace.hpp>

#include "support/prerequisite.hpp"
#include "support/real_traces.hpp"

#if VRAM_TRACE_HAS_ZLIB
using vram::test::check_consistent;
using vram::test::real;
using vram::trace::trace;

namespace {

/// `text` compressed as a gzip stream (what `gzip` and Kineto's .json.gz hold).
std::string gzip(const std::string& text) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string error_of(const std::string& data) {
  try {
    vram::trace::parse_trace(data, "t.json.gz");
  } catch (const vram::trace::trace_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("gzip: a Kineto trace reads the same compressed and plain") {
  std::string json = R"({"traceEvents":[
    {"name":"[memory]","ph":"i","ts":1,"args":{"Device Type":1,"Device Id":0,"Addr":4096,"Bytes":512,"Total Reserved":2097152}},
    {"name":"[memory]","ph":"i","ts":2,"args":{"Device Type":1,"Device Id":0,"Addr":4096,"Bytes":-512,"Total Reserved":2097152}}
  ]})";
  std::string packed = gzip(json);
  REQUIRE(static_cast<unsigned char>(packed[0]) == 0x1f);
  trace plain = vram::trace::parse_trace(json, "t.json");
  trace t = vram::trace::parse_trace(packed, "t.json.gz");
  CHECK(t.format == "kineto");
  CHECK(t.allocs() == 1);
  CHECK(t.frees() == 1);
  CHECK(t.events.size() == plain.events.size());
  CHECK(t.peak_live_bytes() == 512);
  CHECK(*t.recorded_peak_reserved == 2097152);
  check_consistent(t);

  CHECK(error_of(packed.substr(0, packed.size() / 2)).find("t.json.gz: gzip: truncated data") != std::string::npos);
  std::string corrupt = packed;  // the CRC-32 in the trailer no longer matches the data
  corrupt[packed.size() - 8] = static_cast<char>(corrupt[packed.size() - 8] ^ 0xff);
  CHECK(error_of(corrupt).find("t.json.gz: gzip: corrupt or truncated data at compressed byte") != std::string::npos);
}

TEST_CASE("real: df_index_resolver.json.gz (Kineto)", "[traces]") {
  const trace& t = real("df_index_resolver.json.gz");
  CHECK(t.format == "kineto");
  CHECK(t.allocs() == 13385);
  CHECK(t.frees() == 13385);
  check_consistent(t);
  REQUIRE(t.recorded_peak_reserved);
  CHECK(double(*t.recorded_peak_reserved) == Approx(12.78e9).epsilon(0.01));
  std::uint64_t start = 0;
  for (std::size_t i = 0; i < t.initial_live; ++i) start += t.events[i].bytes;
  // About 4.10 GB was allocated before the window (SOURCES.md); the net in-window peak is
  // about 2.53 GB above that.
  CHECK(double(start) == Approx(4.10e9).epsilon(0.01));
  CHECK(double(t.peak_live_bytes() - start) == Approx(2.53e9).epsilon(0.02));
}
#else
static const vram::test::prerequisite zlib_needed{
    "zlib (zlib1g-dev from scripts/setup; this build has no VRAM_WITH_ZLIB, so gzip traces are refused)",
    [] { return false; }};
#endif

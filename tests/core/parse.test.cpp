// vram::parse_bytes and vram::parse_count read strictly: each hostile value of
// support/hostile_values.hpp is refused, what people write is read exactly, and a refusal's
// message shows the text as given.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <vram/core/bytes.hpp>
#include <vram/core/parse.hpp>

#include "support/hostile_values.hpp"

using vram::test::hostile_value;

namespace {

std::string shown(const hostile_value& v) { return std::string(v.what) + ": " + vram::quoted(v.text); }

}  // namespace

TEST_CASE("parse_bytes and parse_count refuse every hostile value", "[core][parse]") {
  for (const auto& list : {std::span<const hostile_value>(vram::test::hostile_values),
                           std::span<const hostile_value>(vram::test::hostile_with_nul)})
    for (const hostile_value& v : list) {
      INFO(shown(v));
      CHECK_FALSE(vram::parse_bytes(v.text).has_value());
      CHECK_FALSE(vram::parse_count(v.text).has_value());
    }
  for (const hostile_value& v : vram::test::hostile_sizes) {
    INFO(shown(v));
    CHECK_FALSE(vram::parse_bytes(v.text).has_value());
  }
}

TEST_CASE("parse_bytes: whole numbers, units in powers of 1024, fractions that make whole bytes",
          "[core][parse]") {
  constexpr std::size_t K = 1024, M = K * K, G = M * K, T = G * K;
  struct row {
    std::string_view text;
    std::size_t bytes;
  };
  for (const row& r : {row{"0", 0}, row{"512", 512}, row{"007", 7}, row{"5B", 5}, row{"5b", 5}, row{"64K", 64 * K},
                       row{"64k", 64 * K}, row{"64KB", 64 * K}, row{"64KiB", 64 * K}, row{"64kib", 64 * K},
                       row{"512M", 512 * M}, row{"40G", 40 * G}, row{"40GB", 40 * G}, row{"24GiB", 24 * G},
                       row{"2T", 2 * T}, row{"1.5GiB", 3 * G / 2}, row{"0.5K", 512}, row{"1.25M", 5 * M / 4},
                       row{"24.000000G", 24 * G}, row{"0.0009765625K", 1}}) {
    INFO(r.text);
    CHECK(vram::parse_bytes(r.text) == std::optional<std::size_t>(r.bytes));
  }
  // The largest size, and one byte more.
  CHECK(vram::parse_bytes("72057594037927936") == std::optional<std::size_t>(vram::max_request_bytes));
  CHECK(vram::parse_bytes("65536T") == std::optional<std::size_t>(vram::max_request_bytes));
  CHECK(vram::parse_bytes("72057594037927937") == std::nullopt);
  CHECK(vram::parse_bytes("65535.999999999999999999T") == std::nullopt);  // not whole
  CHECK(vram::parse_bytes("64P") == std::nullopt);                        // no P unit
  // A fraction needs a unit, and the unit must make it whole.
  CHECK(vram::parse_bytes("1.0") == std::nullopt);
  CHECK(vram::parse_bytes("1.1K") == std::nullopt);
  CHECK(vram::parse_bytes("5.") == std::nullopt);
  CHECK(vram::parse_bytes("5.K") == std::nullopt);
  CHECK(vram::parse_bytes("5KiBB") == std::nullopt);
  CHECK(vram::parse_bytes("5Ki") == std::nullopt);
  CHECK(vram::parse_bytes("5iB") == std::nullopt);
  STATIC_REQUIRE(vram::parse_bytes("1.5GiB") == std::size_t{3} << 29);  // usable in constant expressions
}

TEST_CASE("parse_count: decimal digits only, every value of 64 bits and no more", "[core][parse]") {
  CHECK(vram::parse_count("0") == std::optional<std::uint64_t>(0));
  CHECK(vram::parse_count("8") == std::optional<std::uint64_t>(8));
  CHECK(vram::parse_count("0064") == std::optional<std::uint64_t>(64));
  CHECK(vram::parse_count("4294967297") == std::optional<std::uint64_t>(4294967297ull));
  CHECK(vram::parse_count("18446744073709551615") == std::optional<std::uint64_t>(UINT64_MAX));
  CHECK(vram::parse_count("18446744073709551616") == std::nullopt);
  CHECK(vram::parse_count("5K") == std::nullopt);  // a count has no unit
  CHECK(vram::parse_count("1.0") == std::nullopt);
  STATIC_REQUIRE(vram::parse_count("42") == std::uint64_t{42});
}

TEST_CASE("refusal: one line naming what refused, with the text as given", "[core][parse]") {
  CHECK(vram::quoted("40G") == "'40G'");
  CHECK(vram::quoted("") == "''");
  CHECK(vram::quoted("\t5\n") == "'\\t5\\n'");
  CHECK(vram::quoted(std::string_view("5\0x", 3)) == "'5\\0x'");
  CHECK(vram::quoted("it's") == "'it\\'s'");
  CHECK(vram::quoted("a\\b") == "'a\\\\b'");
  CHECK(vram::quoted("\x1b[2J\xff") == "'\\x1b[2J\\xff'");
  CHECK(vram::refusal("VRAM_POOL_MAX", "1.5", vram::size_grammar) ==
        std::string("bad VRAM_POOL_MAX '1.5': ") + vram::size_grammar);
  for (const hostile_value& v : vram::test::hostile_with_nul) {
    const std::string m = vram::refusal("--batch", v.text, vram::count_grammar);
    INFO(m);
    CHECK(m.find('\0') == std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
  for (const hostile_value& v : vram::test::hostile_values) {
    const std::string m = vram::refusal("--batch", v.text, vram::count_grammar);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.find('\t') == std::string::npos);
  }
}

#pragma once
// Sizes for people: vram::parse_bytes reads them as people write them in configuration
// ("512", "64K", "40G", "1.5GiB"; powers of 1024), strictly (whole bytes, nothing around
// them, overflow refused); vram::format_bytes writes them ("1.50 GiB").

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include <vram/core/alignment.hpp>
#include <vram/core/parse.hpp>

namespace vram {

/// What vram::parse_bytes reads, for refusals.
inline constexpr const char* size_grammar =
    "a whole number of bytes, optionally with a unit K, M, G or T (powers of 1024; also KiB or KB), "
    "e.g. 512, 64K, 40G, 1.5GiB; at most 64 PiB";

/// The bytes `text` stands for: decimal digits, then optionally a point and more digits,
/// then optionally a unit: K, M, G or T (powers of 1024, either case), each optionally
/// followed by "B" or "iB"; or "B" alone. A fraction needs a unit and must make a whole
/// number of bytes ("1.5GiB", "0.5K"; not "1.5", "0.1K"). Nothing before, between or after
/// (no blank, sign, "0x" or exponent); at most vram::max_request_bytes. Empty when `text` is
/// not such a size, or stands for more.
[[nodiscard]] constexpr std::optional<std::size_t> parse_bytes(std::string_view text) noexcept {
  using detail::parse::is_digit;
  std::size_t i = 0;
  while (i < text.size() && is_digit(text[i])) ++i;
  const std::string_view whole = text.substr(0, i);
  std::string_view fraction;
  if (i < text.size() && text[i] == '.') {
    const std::size_t first = ++i;
    while (i < text.size() && is_digit(text[i])) ++i;
    fraction = text.substr(first, i - first);
    if (fraction.empty()) return std::nullopt;  // "5."
  }
  if (whole.empty()) return std::nullopt;       // ".5", "", " 5"
  // The unit: its power of two.
  const std::string_view unit = text.substr(i);
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  unsigned shift = 0;
  if (!unit.empty()) {
    switch (lower(unit[0])) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      case 't': shift = 40; break;
      case 'b': shift = 0; break;
      default: return std::nullopt;
    }
    const std::string_view rest = unit.substr(1);
    const bool bytes_suffix = rest.empty() || (rest.size() == 1 && lower(rest[0]) == 'b') ||
                              (rest.size() == 2 && lower(rest[0]) == 'i' && lower(rest[1]) == 'b');
    if (!bytes_suffix || (shift == 0 && !rest.empty())) return std::nullopt;  // "5Bi", "5BB"
  }
  if (!fraction.empty() && shift == 0) return std::nullopt;  // a fraction of a byte
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  // value = n / 10^d, with n the digits of whole and fraction and d the fraction's length;
  // bytes = n * 2^shift / (2^d * 5^d): whole iff 5^d divides n and 2^d divides n * 2^shift.
  std::uint64_t n = 0;
  for (std::string_view part : {whole, fraction})
    for (char c : part) {
      const auto d = static_cast<std::uint64_t>(c - '0');
      if (n > (UINT64_MAX - d) / 10) return std::nullopt;
      n = n * 10 + d;
    }
  const unsigned d = static_cast<unsigned>(fraction.size());
  if (d > 27) return std::nullopt;  // 5^27 is the largest power of 5 below 2^64
  std::uint64_t five = 1;
  for (unsigned k = 0; k < d; ++k) five *= 5;
  if (n % five != 0) return std::nullopt;
  n /= five;
  if (d > shift) {
    const unsigned down = d - shift;
    if (n % (std::uint64_t{1} << down) != 0) return std::nullopt;
    n >>= down;
  } else {
    const unsigned up = shift - d;
    if (n > (std::uint64_t{max_request_bytes} >> up)) return std::nullopt;
    n <<= up;
  }
  if (n > max_request_bytes) return std::nullopt;
  return static_cast<std::size_t>(n);
}

/// "512 B", "1.50 GiB": bytes with a binary unit, two decimals past bytes.
[[nodiscard]] inline std::string format_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace vram

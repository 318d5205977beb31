#pragma once
// Sizes for people: vram::parse_bytes reads them as people write them in configuration
// ("512", "64K", "40G", "1.5GiB"; powers of 1024), vram::format_bytes writes them ("1.50 GiB").

#include <cerrno>
#include <cstdio>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <vram/core/alignment.hpp>

namespace vram {

/// The bytes `text` stands for: a non-negative number, then optionally K, M, G or T (powers
/// of 1024, either case), then optionally "i" and "B". Nothing else, nothing after; at most
/// vram::max_request_bytes. Empty when `text` is not such a size.
[[nodiscard]] inline std::optional<std::size_t> parse_bytes(std::string_view text) {
  const std::string s(text);  // strtod needs a terminated string
  if (s.empty() || s[0] == '-' || s[0] == '+' || s[0] == ' ') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || errno != 0 || !(value >= 0)) return std::nullopt;
  double scale = 1;
  switch (*end) {
    case 'k': case 'K': scale = 1024.0; ++end; break;
    case 'm': case 'M': scale = 1024.0 * 1024; ++end; break;
    case 'g': case 'G': scale = 1024.0 * 1024 * 1024; ++end; break;
    case 't': case 'T': scale = 1024.0 * 1024 * 1024 * 1024; ++end; break;
    default: break;
  }
  if (scale != 1 && (*end == 'i' || *end == 'I')) ++end;  // "GiB"
  if (*end == 'b' || *end == 'B') ++end;
  if (*end != '\0') return std::nullopt;
  const double bytes = value * scale;
  if (bytes > static_cast<double>(max_request_bytes)) return std::nullopt;
  return static_cast<std::size_t>(bytes);
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

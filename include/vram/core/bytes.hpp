#pragma once
// vram::parse_bytes: sizes as people write them in configuration ("512", "64K", "40G",
// "1.5GiB"; powers of 1024), for environment variables and command lines.

#include <cerrno>
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

}  // namespace vram

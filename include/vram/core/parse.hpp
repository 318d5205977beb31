#pragma once
// Counts as people type them in an environment variable or on a command line, read strictly:
// vram::parse_count ("8", "4096"), and vram::refusal, the one message for a value refused,
// with the text as given (quoted, control characters escaped). Sizes ("512M", "1.5GiB") are
// vram::parse_bytes (bytes.hpp), which reads its digits with the same reader.
//
// Strict means: decimal digits only, nothing before or after them (no blank, sign, "0x",
// point or exponent), and a value beyond the type refused rather than saturated or wrapped.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace vram {

namespace detail::parse {

[[nodiscard]] constexpr bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

/// The value of `digits`, which must be decimal digits only; empty when it is empty, holds
/// anything else, or stands for more than `max`.
template <class Unsigned>
[[nodiscard]] constexpr std::optional<Unsigned> decimal(std::string_view digits, Unsigned max) noexcept {
  if (digits.empty()) return std::nullopt;
  Unsigned value = 0;
  for (char c : digits) {
    if (!is_digit(c)) return std::nullopt;
    const auto d = static_cast<Unsigned>(c - '0');
    if (value > (max - d) / 10) return std::nullopt;  // value * 10 + d > max
    value = value * 10 + d;
  }
  return value;
}

}  // namespace detail::parse

/// The count `text` stands for: one or more decimal digits and nothing else (leading zeros
/// allowed). Empty for anything else, and for a number beyond 2^64 - 1.
[[nodiscard]] constexpr std::optional<std::uint64_t> parse_count(std::string_view text) noexcept {
  return detail::parse::decimal<std::uint64_t>(text, UINT64_MAX);
}

/// `text` between single quotes as it can be printed on one line: a backslash, a quote, a
/// control character (NUL included) and any byte above 0x7e are escaped (\\, \', \t, \n,
/// \r, \0, \xNN), so a refused value shows what was given, blanks and all.
[[nodiscard]] inline std::string quoted(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "'";
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\'': out += "\\'"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\0': out += "\\0"; break;
      default:
        if (c < 0x20 || c > 0x7e) {
          out += "\\x";
          out += hex[c >> 4];
          out += hex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  return out + "'";
}

/// The one-line message for a value refused: "bad NAME 'TEXT': EXPECTED", where NAME is the
/// variable or flag, TEXT the value as given (vram::quoted) and EXPECTED what it must be.
[[nodiscard]] inline std::string refusal(std::string_view name, std::string_view text, std::string_view expected) {
  std::string out = "bad ";
  out += name;
  out += ' ';
  out += quoted(text);
  out += ": ";
  out += expected;
  return out;
}

/// What vram::parse_count reads, for refusals.
inline constexpr const char* count_grammar = "a whole decimal number (digits only)";

}  // namespace vram

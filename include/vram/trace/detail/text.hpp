#pragma once
// Line-oriented text helpers the CSV and vram-trace readers share: trimming, splitting,
// strict integer parsing, and iteration over lines with their numbers.

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <system_error>
#include <vector>

namespace vram::detail::trace {

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

inline std::vector<std::string_view> split(std::string_view line, char sep = ',') {
  std::vector<std::string_view> out;
  for (;;) {
    auto p = line.find(sep);
    out.push_back(trim(line.substr(0, p)));
    if (p == std::string_view::npos) return out;
    line.remove_prefix(p + 1);
  }
}

/// Unsigned integer in decimal, or hex with a 0x prefix; false when malformed.
inline bool parse_u64(std::string_view s, std::uint64_t& out) {
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc{} && p == s.data() + s.size();
}

inline bool parse_i64(std::string_view s, std::int64_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}

/// Iterates the lines of `text` (without the line break), with 1-based numbers.
template <class F>
void for_each_line(std::string_view text, F&& f) {
  std::size_t number = 0;
  while (!text.empty()) {
    auto p = text.find('\n');
    std::string_view line = text.substr(0, p);
    ++number;
    f(trim(line), number);
    if (p == std::string_view::npos) break;
    text.remove_prefix(p + 1);
  }
}

inline std::string_view first_line(std::string_view text) { return trim(text.substr(0, text.find('\n'))); }

}  // namespace vram::detail::trace

#pragma once
// Line-oriented text helpers the CSV and vram-trace readers share: trimming, splitting,
// strict integer parsing, iteration over lines with their numbers (after a UTF-8 byte order
// mark, which editors on Windows write), and the tally of rows that could not be read.

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace vram::detail::trace {

/// `text` without a leading UTF-8 byte order mark (EF BB BF).
inline std::string_view strip_bom(std::string_view text) {
  return text.starts_with("\xEF\xBB\xBF") ? text.substr(3) : text;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

/// The fields of `line` into `out` (its storage reused: no allocation per line once warm).
inline void split_into(std::string_view line, std::vector<std::string_view>& out, char sep = ',') {
  out.clear();
  for (;;) {
    auto p = line.find(sep);
    out.push_back(trim(line.substr(0, p)));
    if (p == std::string_view::npos) return;
    line.remove_prefix(p + 1);
  }
}

inline std::vector<std::string_view> split(std::string_view line, char sep = ',') {
  std::vector<std::string_view> out;
  split_into(line, out, sep);
  return out;
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

/// Iterates the lines of `text` (without the line break and a leading byte order mark), with
/// 1-based numbers.
template <class F>
void for_each_line(std::string_view text, F&& f) {
  text = strip_bom(text);
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

inline std::string_view first_line(std::string_view text) {
  text = strip_bom(text);
  return trim(text.substr(0, text.find('\n')));
}

/// A line-based trace's data rows and the first of them that could not be read: a file none
/// of whose rows can be read is an error naming that line, not an empty trace with warnings.
/// Invariant: unreadable <= rows; first_unreadable is set iff unreadable != 0.
struct row_tally {
  std::size_t rows = 0;        // data rows (not the header, blank or comment lines)
  std::size_t unreadable = 0;  // rows that did not parse (malformed fields, unknown operation)
  std::string first_unreadable;

  /// Records an unreadable row; returns `message` (its warning: "file: line N: why").
  std::string bad(std::string message) {
    if (unreadable++ == 0) first_unreadable = message;
    return message;
  }
  [[nodiscard]] bool none_readable() const noexcept { return rows != 0 && unreadable == rows; }
  /// The error: the first bad line (its warning without ": skipped") and that no row was better.
  [[nodiscard]] std::string error() const {
    std::string_view first = first_unreadable;
    if (first.ends_with(": skipped")) first.remove_suffix(9);
    return std::string(first) + "; no row of the file could be read (" + std::to_string(unreadable) +
           (unreadable == 1 ? " row)" : " rows)");
  }
};

}  // namespace vram::detail::trace

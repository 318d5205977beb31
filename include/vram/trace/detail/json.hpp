#pragma once
// A small JSON reader and writer for vram's tools (trace readers, reports). Not a general
// library: numbers are kept as double and (when integral) as int64; strings are UTF-8 with
// \u escapes decoded; depth is limited; every error names the byte offset.
//
// The reader is a pull parser over a string_view: parse_value() builds a small DOM for one
// value, skip_value() passes over one without building anything, and begin_object() /
// next_key() / begin_array() / next_element() let a caller stream through a large
// top-level document (a 50 MB Kineto trace) holding one event at a time.

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vram::detail::trace {

/// A JSON syntax error; what() names the source and byte offset.
class json_error : public std::runtime_error {
 public:
  json_error(const std::string& what, std::size_t offset) : std::runtime_error(what), offset_(offset) {}
  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }

 private:
  std::size_t offset_;
};

/// One JSON value. Objects keep their members in a sorted map (duplicate keys: last wins).
/// `v` as int64, saturated at the type's limits (NaN gives 0): casting a double outside the
/// range is undefined behaviour, and trace files may hold any number (found by fuzzing).
[[nodiscard]] inline std::int64_t saturate_to_int64(double v) noexcept {
  constexpr double limit = 9.2e18;  // just inside +-2^63
  if (v != v) return 0;
  if (v >= limit) return INT64_MAX;
  if (v <= -limit) return INT64_MIN;
  return static_cast<std::int64_t>(v);
}

struct json_value {
  enum class kind : std::uint8_t { null, boolean, number, string, array, object };
  kind type = kind::null;
  bool boolean = false;
  double number = 0;
  bool integral = false;  // the literal had no fraction/exponent and fits in int64
  std::int64_t integer = 0;
  std::string string;
  std::vector<json_value> array;
  std::map<std::string, json_value, std::less<>> object;

  [[nodiscard]] bool is_null() const noexcept { return type == kind::null; }
  [[nodiscard]] bool is_number() const noexcept { return type == kind::number; }
  [[nodiscard]] bool is_string() const noexcept { return type == kind::string; }
  [[nodiscard]] bool is_object() const noexcept { return type == kind::object; }
  [[nodiscard]] bool is_array() const noexcept { return type == kind::array; }
  /// The member `key` of an object, or nullptr.
  [[nodiscard]] const json_value* find(std::string_view key) const {
    if (type != kind::object) return nullptr;
    auto it = object.find(key);
    return it == object.end() ? nullptr : &it->second;
  }
  /// The number as int64 (integral literals exactly; others truncated).
  [[nodiscard]] std::int64_t as_int() const noexcept { return integral ? integer : saturate_to_int64(number); }
};

class json_reader {
 public:
  static constexpr int max_depth = 256;

  /// `base`: the offset of `text` in the whole input, so errors in a slice name the right byte.
  json_reader(std::string_view text, std::string source, std::size_t base = 0)
      : text_(text), source_(std::move(source)), base_(base) {}

  [[nodiscard]] std::size_t offset() const noexcept { return pos_; }
  [[nodiscard]] bool at_end() {
    skip_ws();
    return pos_ >= text_.size();
  }

  /// Parses one value into a DOM.
  json_value parse_value(int depth = 0) {
    json_value v;
    parse_into(v, depth);
    return v;
  }

  /// Passes over one value without building it.
  void skip_value(int depth = 0) {
    if (depth > max_depth) fail("nesting too deep");
    skip_ws();
    char c = peek();
    if (c == '{') {
      begin_object();
      std::string key;
      bool first = true;
      while (next_key(key, first)) skip_value(depth + 1);
    } else if (c == '[') {
      begin_array();
      bool first = true;
      while (next_element(first)) skip_value(depth + 1);
    } else if (c == '"') {
      skip_string();
    } else {
      json_value scratch;
      parse_into(scratch, depth);
    }
  }

  /// Passes over one value fast, for skimming large documents: strings, bracket nesting and
  /// depth are checked (so truncation and mismatches are errors), commas and colons are not.
  void skim_value() {
    skip_ws();
    char c = peek();
    if (c != '{' && c != '[') return skip_value();
    char closers[max_depth + 1];
    int depth = 0;
    // Characters that matter while skimming; the rest are passed in a tight loop (this runs
    // over tens of MB, also in sanitizer builds).
    static constexpr auto special = [] {
      std::array<bool, 256> t{};
      for (unsigned char x : {'"', '{', '}', '[', ']'}) t[x] = true;
      return t;
    }();
    for (;;) {
      const char* p = text_.data() + pos_;
      const char* end = text_.data() + text_.size();
      while (p < end && !special[static_cast<unsigned char>(*p)]) ++p;
      pos_ = static_cast<std::size_t>(p - text_.data());
      c = peek();
      if (c == '"') {
        ++pos_;
        for (;;) {
          std::size_t q = text_.find_first_of("\"\\", pos_);
          if (q == std::string_view::npos) {
            pos_ = text_.size();
            fail("unterminated string");
          }
          pos_ = q + 1;
          if (text_[q] == '"') break;
          if (pos_ >= text_.size()) fail("unterminated string");
          ++pos_;  // the escaped character
        }
        continue;
      }
      ++pos_;
      if (c == '{' || c == '[') {
        if (depth == max_depth) fail("nesting too deep");
        closers[depth++] = c == '{' ? '}' : ']';
      } else if (c == '}' || c == ']') {
        if (closers[depth - 1] != c) {
          --pos_;
          fail("mismatched bracket");
        }
        if (--depth == 0) return;
      }
    }
  }

  /// Streaming objects: `begin_object(); bool first = true; while (next_key(k, first)) { consume one value }`.
  void begin_object() { expect('{'); }
  bool next_key(std::string& key, bool& first) {
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return false;
    }
    if (!first) {
      expect(',');
      skip_ws();
    }
    first = false;
    key.clear();
    parse_string(key);
    skip_ws();
    expect(':');
    return true;
  }
  /// Streaming arrays: `begin_array(); bool first = true; while (next_element(first)) { consume one value }`.
  void begin_array() { expect('['); }
  bool next_element(bool& first) {
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return false;
    }
    if (!first) expect(',');
    first = false;
    return true;
  }

  [[noreturn]] void fail(const char* what) const {
    throw json_error(source_ + ": invalid JSON at byte " + std::to_string(base_ + pos_) + ": " + what, base_ + pos_);
  }

 private:
  char peek() const {
    if (pos_ >= text_.size()) fail("unexpected end of input");
    return text_[pos_];
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) {
      char msg[32];
      std::snprintf(msg, sizeof msg, "expected '%c'", c);
      fail(msg);
    }
    ++pos_;
  }
  void skip_ws() noexcept {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' || text_[pos_] == '\t'))
      ++pos_;
  }
  bool match(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void parse_into(json_value& v, int depth) {
    if (depth > max_depth) fail("nesting too deep");
    skip_ws();
    char c = peek();
    switch (c) {
      case '{': {
        v.type = json_value::kind::object;
        ++pos_;
        skip_ws();
        if (peek() == '}') {
          ++pos_;
          return;
        }
        for (;;) {
          skip_ws();
          std::string key;
          parse_string(key);
          expect(':');
          parse_into(v.object[key], depth + 1);
          skip_ws();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          expect('}');
          return;
        }
      }
      case '[': {
        v.type = json_value::kind::array;
        ++pos_;
        skip_ws();
        if (peek() == ']') {
          ++pos_;
          return;
        }
        for (;;) {
          v.array.emplace_back();
          parse_into(v.array.back(), depth + 1);
          skip_ws();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          expect(']');
          return;
        }
      }
      case '"':
        v.type = json_value::kind::string;
        parse_string(v.string);
        return;
      case 't':
        if (!match("true")) fail("invalid literal");
        v.type = json_value::kind::boolean;
        v.boolean = true;
        return;
      case 'f':
        if (!match("false")) fail("invalid literal");
        v.type = json_value::kind::boolean;
        return;
      case 'n':
        if (!match("null")) fail("invalid literal");
        return;
      default:
        parse_number(v);
    }
  }

  void parse_number(json_value& v) {
    std::size_t start = pos_;
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    std::size_t digits = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    if (pos_ == digits) fail("invalid value");
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      std::size_t frac = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == frac) fail("digits expected after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      std::size_t exp = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == exp) fail("digits expected in exponent");
    }
    std::string literal(text_.substr(start, pos_ - start));  // strtod needs a terminator
    v.type = json_value::kind::number;
    v.number = std::strtod(literal.c_str(), nullptr);
    if (integral && pos_ - digits <= 18) {  // at most 18 digits always fit in int64
      v.integral = true;
      v.integer = std::strtoll(literal.c_str(), nullptr, 10);
    } else if (integral) {
      errno = 0;
      long long x = std::strtoll(literal.c_str(), nullptr, 10);
      if (errno == 0) {
        v.integral = true;
        v.integer = x;
      }
    }
  }

  void skip_string() {
    expect('"');
    for (;;) {
      char c = peek();
      ++pos_;
      if (c == '"') return;
      if (c == '\\') {
        peek();
        ++pos_;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        fail("control character in string");
      }
    }
  }

  void parse_string(std::string& out) {
    if (peek() != '"') fail("expected a string");
    ++pos_;
    for (;;) {
      char c = peek();
      ++pos_;
      if (c == '"') return;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        fail("control character in string");
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_utf8(out, parse_hex4()); break;
        default: --pos_; fail("invalid escape");
      }
    }
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else fail("invalid \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    // Lone surrogates are kept as their 3-byte encodings; this reader only needs ASCII keys.
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view text_;
  std::string source_;
  std::size_t base_ = 0;
  std::size_t pos_ = 0;
};

/// `s` as a JSON string literal, quotes included.
inline std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace vram::detail::trace

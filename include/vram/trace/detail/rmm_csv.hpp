#pragma once
// RMM's CSV log (rmm::mr::logging_resource_adaptor: Thread,Time,Action,Pointer,Size,Stream),
// both ways. Written (by the tracker and logging_adaptor) the way RMM writes it, plus vram's
// Tenant column: local time HH:MM:SS.ffffff, pointers as 0x... or "(nil)", the stream as a
// hex handle. Read (by vram::trace::read_rmm_csv) with the columns in any order.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <ostream>
#include <system_error>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <vram/trace/detail/json.hpp>
#include <vram/trace/detail/text.hpp>
#include <vram/trace/detail/trace_builder.hpp>
#include <vram/trace/trace.hpp>

namespace vram::detail::trace {

inline constexpr const char* rmm_csv_header = "Thread,Time,Action,Pointer,Size,Stream,Tenant\n";

/// Appends one line to `out`. `action` is "allocate", "allocate failure" or "free". The local
/// time of the last second seen is kept per thread: localtime_r once a second, not per line.
inline void append_rmm_csv_line(std::string& out, std::uint64_t thread, std::int64_t time_us, const char* action,
                                std::uint64_t address, std::size_t bytes, std::uint64_t stream,
                                std::string_view tenant_path) {
  thread_local std::time_t cached_secs = -1;
  thread_local std::tm cached{};
  std::time_t secs = static_cast<std::time_t>(time_us / 1000000);
  if (secs != cached_secs) {
    localtime_r(&secs, &cached);
    cached_secs = secs;
  }
  // Formatted by hand (to_chars, no printf) in place: a tracker's event log writes a line per
  // event. The fields take at most 20 + 15 + 16 + 18 + 20 + 18 + 6 separators: 113 bytes.
  const std::size_t at = out.size();
  out.resize(at + 128);
  char* p = out.data() + at;
  char* const end = p + 128;
  auto number = [&](std::uint64_t v, int base = 10) { p = std::to_chars(p, end, v, base).ptr; };
  auto padded = [&](unsigned v, int width) {  // zero-padded
    for (int i = width - 1; i >= 0; --i, v /= 10) p[i] = static_cast<char>('0' + v % 10);
    p += width;
  };
  auto text = [&](std::string_view t) { p = std::copy(t.begin(), t.end(), p); };
  number(thread);
  *p++ = ',';
  padded(static_cast<unsigned>(cached.tm_hour), 2);
  *p++ = ':';
  padded(static_cast<unsigned>(cached.tm_min), 2);
  *p++ = ':';
  padded(static_cast<unsigned>(cached.tm_sec), 2);
  *p++ = '.';
  padded(static_cast<unsigned>(((time_us % 1000000) + 1000000) % 1000000), 6);
  *p++ = ',';
  text(action);  // "allocate failure" at most
  *p++ = ',';
  if (address == 0) {
    text("(nil)");
  } else {
    text("0x");
    number(address, 16);
  }
  *p++ = ',';
  number(bytes);
  text(",0x");
  number(stream, 16);
  *p++ = ',';
  out.resize(static_cast<std::size_t>(p - out.data()));
  // Tenant names are free text: quote them when they hold a comma or a quote.
  if (tenant_path.find_first_of(",\"\n") == std::string_view::npos) {
    out.append(tenant_path).push_back('\n');
  } else {
    out.push_back('"');
    for (char c : tenant_path) {
      if (c == '"') out.push_back('"');
      out.push_back(c);
    }
    out.append("\"\n");
  }
}

inline void write_rmm_csv_line(std::ostream& out, std::uint64_t thread, std::int64_t time_us, const char* action,
                               std::uint64_t address, std::size_t bytes, std::uint64_t stream,
                               std::string_view tenant_path) {
  std::string line;
  append_rmm_csv_line(line, thread, time_us, action, address, bytes, stream, tenant_path);
  out << line;
}

/// An RMM log, a line at a time: a header naming at least Action, Pointer and Size, and
/// optionally Tenant (vram's column: the allocations' tenants, trace::tenants); `allocate
/// failure` rows are skipped. The window's
/// events go to the trace or, for a trace read as a stream, to `sink`. Throws
/// vram::trace::trace_error.
class rmm_csv_parser {
 public:
  explicit rmm_csv_parser(const std::string& source, std::function<void(const vram::trace::event&)> sink = {})
      : source_(source), b_(source, "rmm-csv", std::move(sink)) {}

  void line(std::string_view line, std::size_t number) {
    if (line.empty()) return;
    split_into(line, fields_);
    const auto& f = fields_;
    if (columns_ == 0) {
      columns_ = f.size();
      for (std::size_t i = 0; i < f.size(); ++i) {
        if (f[i] == "Time") c_time_ = int(i);
        if (f[i] == "Action") c_action_ = int(i);
        if (f[i] == "Pointer") c_ptr_ = int(i);
        if (f[i] == "Size") c_size_ = int(i);
        if (f[i] == "Stream") c_stream_ = int(i);
        if (f[i] == "Tenant") c_tenant_ = int(i);
      }
      if (c_action_ < 0 || c_ptr_ < 0 || c_size_ < 0)
        throw vram::trace::trace_error(source_ + ": line 1: an RMM log needs Action, Pointer and Size columns");
      return;
    }
    auto where = [&] { return source_ + ": line " + std::to_string(number); };
    ++tally_.rows;
    if (f.size() < columns_) return b_.warn(tally_.bad(where() + ": too few fields: skipped"));
    std::uint64_t ptr = 0, size = 0, stream = 0;
    if (!parse_u64(f[std::size_t(c_ptr_)], ptr) || !parse_u64(f[std::size_t(c_size_)], size) ||
        size > vram::trace::max_trace_bytes)
      return b_.warn(tally_.bad(where() + ": invalid Pointer or Size: skipped"));
    if (c_stream_ >= 0 && !parse_u64(f[std::size_t(c_stream_)], stream)) stream = 0;
    // Time: "HH:MM:SS.ffffff" (or seconds); ordering comes from the line order anyway.
    std::int64_t t = c_time_ >= 0 ? parse_time(f[std::size_t(c_time_)]) : 0;
    auto action = f[std::size_t(c_action_)];
    if (action == "allocate") b_.alloc(ptr, size, stream, t, tenant_of(line, f));
    else if (action == "free") b_.free(ptr, size, stream, t);
    else if (action != "allocate failure") b_.warn(tally_.bad(where() + ": unknown action: skipped"));
  }

  vram::trace::trace finish() && {
    if (columns_ == 0) throw vram::trace::trace_error(source_ + ": empty RMM log");
    if (tally_.none_readable()) throw vram::trace::trace_error(tally_.error());
    return std::move(b_).finish();
  }

 private:
  /// "HH:MM:SS.ffffff" or seconds, in nanoseconds; the number ends where it stops parsing
  /// (events are ordered by their lines, not by their times).
  static std::int64_t parse_time(std::string_view field) {
    double seconds = 0;
    for (;;) {
      double part = 0;
      auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), part);
      if (ec != std::errc{}) break;
      seconds = seconds * 60 + part;
      field.remove_prefix(static_cast<std::size_t>(end - field.data()));
      if (field.empty() || field.front() != ':') break;
      field.remove_prefix(1);
    }
    return saturate_to_int64(seconds * 1e9);
  }

  std::string source_;
  trace_builder b_;
  /// The Tenant field; as the last column (as vram writes it) it is the rest of the line,
  /// which may hold commas inside its quotes.
  std::string tenant_of(std::string_view line, const std::vector<std::string_view>& f) const {
    if (c_tenant_ < 0) return {};
    auto at = std::size_t(c_tenant_);
    if (at + 1 != columns_ || f.size() == columns_) return unquote(f[at]);
    std::size_t from = 0;
    for (std::size_t i = 0; i < at; ++i) from = line.find(',', from) + 1;
    return unquote(trim(line.substr(from)));
  }

  /// A field as write_rmm_csv_line quotes it: "a,b" and "say ""x""" read back as written.
  static std::string unquote(std::string_view field) {
    if (field.size() < 2 || field.front() != '"' || field.back() != '"') return std::string(field);
    std::string out;
    for (std::size_t i = 1; i + 1 < field.size(); ++i) {
      out += field[i];
      if (field[i] == '"' && field[i + 1] == '"') ++i;
    }
    return out;
  }

  std::vector<std::string_view> fields_;  // of the current line
  int c_time_ = -1, c_action_ = -1, c_ptr_ = -1, c_size_ = -1, c_stream_ = -1, c_tenant_ = -1;
  std::size_t columns_ = 0;
  row_tally tally_;
};

/// Reads an RMM log held in memory (rmm_csv_parser).
inline vram::trace::trace read_rmm_csv(std::string_view text, const std::string& source) {
  rmm_csv_parser parser(source);
  for_each_line(text, [&](std::string_view line, std::size_t number) { parser.line(line, number); });
  return std::move(parser).finish();
}

}  // namespace vram::detail::trace

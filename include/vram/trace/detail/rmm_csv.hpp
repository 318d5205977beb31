#pragma once
// RMM's CSV log (rmm::mr::logging_resource_adaptor: Thread,Time,Action,Pointer,Size,Stream),
// both ways. Written (by the tracker and logging_adaptor) the way RMM writes it, plus vram's
// Tenant column: local time HH:MM:SS.ffffff, pointers as 0x... or "(nil)", the stream as a
// hex handle. Read (by vram::trace::read_rmm_csv) with the columns in any order.

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <ostream>
#include <sstream>
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

/// `action` is "allocate", "allocate failure" or "free".
inline void write_rmm_csv_line(std::ostream& out, std::uint64_t thread, std::int64_t time_us, const char* action,
                               std::uint64_t address, std::size_t bytes, std::uint64_t stream,
                               std::string_view tenant_path) {
  std::time_t secs = static_cast<std::time_t>(time_us / 1000000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char pointer[24];
  if (address == 0) std::snprintf(pointer, sizeof pointer, "(nil)");
  else std::snprintf(pointer, sizeof pointer, "0x%llx", static_cast<unsigned long long>(address));
  char line[160];
  std::snprintf(line, sizeof line, "%llu,%02d:%02d:%02d.%06lld,%s,%s,%zu,0x%llx,", static_cast<unsigned long long>(thread),
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(time_us % 1000000), action, pointer, bytes,
                static_cast<unsigned long long>(stream));
  out << line;
  // Tenant names are free text: quote them when they hold a comma or a quote.
  if (tenant_path.find_first_of(",\"\n") == std::string_view::npos) {
    out << tenant_path << '\n';
  } else {
    out << '"';
    for (char c : tenant_path) out << (c == '"' ? "\"\"" : std::string_view(&c, 1));
    out << "\"\n";
  }
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
    auto f = split(line);
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
  /// "HH:MM:SS.ffffff" or seconds, in nanoseconds.
  static std::int64_t parse_time(std::string_view field) {
    double seconds = 0, part = 0;
    std::istringstream in{std::string(field)};
    char colon = 0;
    while (in >> part) {
      seconds = seconds * 60 + part;
      if (!(in >> colon) || colon != ':') break;
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

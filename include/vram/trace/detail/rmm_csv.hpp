#pragma once
// RMM's CSV log (rmm::mr::logging_resource_adaptor: Thread,Time,Action,Pointer,Size,Stream),
// both ways. Written (by the tracker and logging_adaptor) the way RMM writes it, plus vram's
// Tenant column: local time HH:MM:SS.ffffff, pointers as 0x... or "(nil)", the stream as a
// hex handle. Read (by vram::trace::read_rmm_csv) with the columns in any order.

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

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

/// Reads an RMM log: a header naming at least Action, Pointer and Size (an optional Tenant
/// column is ignored); `allocate failure` rows are skipped. Throws vram::trace::trace_error.
inline vram::trace::trace read_rmm_csv(std::string_view text, const std::string& source) {
  trace_builder b(source, "rmm-csv");
  int c_time = -1, c_action = -1, c_ptr = -1, c_size = -1, c_stream = -1;
  std::size_t columns = 0;
  row_tally tally;
  for_each_line(text, [&](std::string_view line, std::size_t number) {
    if (line.empty()) return;
    auto f = split(line);
    if (columns == 0) {
      columns = f.size();
      for (std::size_t i = 0; i < f.size(); ++i) {
        if (f[i] == "Time") c_time = int(i);
        if (f[i] == "Action") c_action = int(i);
        if (f[i] == "Pointer") c_ptr = int(i);
        if (f[i] == "Size") c_size = int(i);
        if (f[i] == "Stream") c_stream = int(i);
      }
      if (c_action < 0 || c_ptr < 0 || c_size < 0)
        throw vram::trace::trace_error(source + ": line 1: an RMM log needs Action, Pointer and Size columns");
      return;
    }
    auto where = [&] { return source + ": line " + std::to_string(number); };
    ++tally.rows;
    if (f.size() < columns) return b.warn(tally.bad(where() + ": too few fields: skipped"));
    std::uint64_t ptr = 0, size = 0, stream = 0;
    if (!parse_u64(f[std::size_t(c_ptr)], ptr) || !parse_u64(f[std::size_t(c_size)], size) ||
        size > vram::trace::max_trace_bytes)
      return b.warn(tally.bad(where() + ": invalid Pointer or Size: skipped"));
    if (c_stream >= 0 && !parse_u64(f[std::size_t(c_stream)], stream)) stream = 0;
    // Time: "HH:MM:SS.ffffff" (or seconds); ordering comes from the line order anyway.
    std::int64_t t = 0;
    if (c_time >= 0) {
      double seconds = 0, part = 0;
      std::string field(f[std::size_t(c_time)]);
      std::istringstream in(field);
      char colon = 0;
      while (in >> part) {
        seconds = seconds * 60 + part;
        if (!(in >> colon) || colon != ':') break;
      }
      t = saturate_to_int64(seconds * 1e9);
    }
    auto action = f[std::size_t(c_action)];
    if (action == "allocate") b.alloc(ptr, size, stream, t);
    else if (action == "free") b.free(ptr, size, stream, t);
    else if (action != "allocate failure") b.warn(tally.bad(where() + ": unknown action: skipped"));
  });
  if (columns == 0) throw vram::trace::trace_error(source + ": empty RMM log");
  if (tally.none_readable()) throw vram::trace::trace_error(tally.error());
  return std::move(b).finish();
}

}  // namespace vram::detail::trace

#pragma once
// One line of RMM's CSV log (Thread,Time,Action,Pointer,Size,Stream) plus vram's Tenant
// column, written the way RMM writes it: local time HH:MM:SS.ffffff, pointers as 0x... or
// "(nil)", the stream as a hex handle.

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <ostream>
#include <string_view>

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

}  // namespace vram::detail::trace

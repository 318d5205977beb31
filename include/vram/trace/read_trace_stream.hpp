#pragma once
// vram::trace::read_trace_stream: a trace too large to hold, replayed from its file.
//
// A first reading counts the events and keeps what a replay needs up front (the blocks live
// at the start, the streams, the recorded reserved samples, the warnings); every replay then
// reads the events again, a line at a time. Memory is bounded by the blocks live at once and
// a read buffer, whatever the number of events. The line-based formats stream
// (vram's own and RMM logs, as the tracker writes them); the others are read into memory.

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include <vram/trace/detail/rmm_csv.hpp>
#include <vram/trace/detail/text.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/trace.hpp>

namespace vram::detail::trace {

/// Calls f(line, number) on every line of the file at `path`, as read_trace's readers see
/// them (trimmed, without a leading byte order mark), reading 1 MiB at a time.
template <class F>
void for_each_file_line(const std::string& path, F&& f) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw vram::trace::trace_error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::string buffer(std::size_t{1} << 20, '\0'), partial;
  std::size_t number = 0;
  auto emit = [&](std::string_view line) {
    if (number == 0) line = strip_bom(line);
    f(trim(line), ++number);
  };
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    std::string_view chunk(buffer.data(), static_cast<std::size_t>(in.gcount()));
    for (auto p = chunk.find('\n'); p != std::string_view::npos; p = chunk.find('\n')) {
      if (partial.empty()) {
        emit(chunk.substr(0, p));
      } else {
        partial.append(chunk.substr(0, p));
        emit(partial);
        partial.clear();
      }
      chunk.remove_prefix(p + 1);
    }
    partial.append(chunk);
  }
  if (in.bad()) throw vram::trace::trace_error(path + ": read error (" + std::strerror(errno) + ")");
  if (!partial.empty()) emit(partial);
}

/// Parses the file at `path` with a Parser (vram_trace_parser, rmm_csv_parser) whose window's
/// events go to `sink`; returns what the parser kept.
template <class Parser>
vram::trace::trace parse_file(const std::string& path, std::function<void(const vram::trace::event&)> sink) {
  Parser parser(path, std::move(sink));
  for_each_file_line(path, [&](std::string_view line, std::size_t number) { parser.line(line, number); });
  return std::move(parser).finish();
}

/// The first reading of a streamed trace: the trace without its window's events, and the
/// window counted.
template <class Parser>
vram::trace::trace first_reading(const std::string& path) {
  vram::trace::streamed_window w;
  std::int64_t running = 0, highest = 0;  // the window's own live bytes (its frees of initial blocks make it negative)
  vram::trace::trace t = parse_file<Parser>(path, [&](const vram::trace::event& e) {
    ++w.events;
    if (e.kind == vram::trace::event::op::alloc) {
      ++w.allocs;
      running += static_cast<std::int64_t>(e.bytes);
      highest = std::max(highest, running);
    } else {
      ++w.frees;
      running -= static_cast<std::int64_t>(e.bytes);
    }
  });
  std::uint64_t initial = 0;
  for (const vram::trace::event& e : t.events) initial += e.bytes;
  w.peak_live = initial + static_cast<std::uint64_t>(highest);
  const std::size_t expected = w.events;
  w.feed = [path, expected](const std::function<void(const vram::trace::event&)>& each) {
    std::size_t seen = 0;
    parse_file<Parser>(path, [&](const vram::trace::event& e) {
      if (++seen <= expected) each(e);
    });
    if (seen != expected)
      throw vram::trace::trace_error(path + ": changed while it was replayed (" + std::to_string(seen) + " events, " +
                        std::to_string(expected) + " when first read)");
  };
  t.streamed = std::move(w);
  return t;
}

}  // namespace vram::detail::trace

namespace vram::trace {

/// Reads the trace at `path` as a stream where its format allows (vram's format, an RMM log),
/// into memory otherwise (read_trace). Errors are read_trace's.
inline trace read_trace_stream(const std::string& path) {
  std::string first;
  {
    std::ifstream in(path, std::ios::binary);
    if (in) std::getline(in, first);
  }
  namespace dt = vram::detail::trace;
  std::string_view line = dt::trim(dt::strip_bom(first));
  trace t;
  if (line.starts_with("# vram-trace"))
    t = dt::first_reading<dt::vram_trace_parser>(path);
  else if (line.find("Action") != std::string_view::npos && line.find("Pointer") != std::string_view::npos)
    t = dt::first_reading<dt::rmm_csv_parser>(path);
  else
    return read_trace(path);
  t.name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  return t;
}

}  // namespace vram::trace

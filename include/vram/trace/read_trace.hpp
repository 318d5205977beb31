#pragma once
// Trace readers: PyTorch memory snapshots (pickle), Kineto profiler traces (Chrome-trace JSON,
// optionally gzipped), RMM CSV logs, lifetime CSVs (id,lower,upper,size) and vram's own
// format (docs/replay.md). `read_trace(path)` detects the format from the content.
//
// Every reader turns malformed input into a vram::trace::trace_error naming the source (and,
// for binary or JSON input, the byte offset), and tolerable inconsistencies (frees of unknown
// addresses, fields of the wrong type in one event) into counted warnings on the trace. A
// line-based file none of whose rows can be read is an error naming its first bad line. Text
// traces may start with a UTF-8 byte order mark.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

// Gzip input (.json.gz) needs zlib at link time, so it is on only when asked for:
// -DVRAM_WITH_ZLIB=1 (and link ZLIB::ZLIB / -lz). Without it a gzip file is refused with a
// trace_error that says so.
#if defined(VRAM_WITH_ZLIB) && VRAM_WITH_ZLIB
#include <zlib.h>
#define VRAM_TRACE_HAS_ZLIB 1
#else
#define VRAM_TRACE_HAS_ZLIB 0
#endif

#include <vram/trace/detail/json.hpp>
#include <vram/trace/detail/text.hpp>
#include <vram/trace/detail/pickle.hpp>
#include <vram/trace/detail/rmm_csv.hpp>
#include <vram/trace/detail/trace_builder.hpp>
#include <vram/trace/trace.hpp>

namespace vram::trace {


/// Decompresses gzip data (at most `limit` bytes of output, against decompression bombs).
inline std::string gunzip(std::string_view data, const std::string& source,
                          std::size_t limit = std::size_t{8} << 30) {
#if VRAM_TRACE_HAS_ZLIB
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw trace_error(source + ": gzip: cannot initialise zlib");
  std::string out;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(std::min<std::size_t>(data.size(), UINT32_MAX));
  std::size_t fed = z.avail_in;
  int rc = Z_OK;
  char buf[1 << 16];
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      std::size_t at = z.total_in;
      inflateEnd(&z);
      throw trace_error(source + ": gzip: corrupt or truncated data at compressed byte " + std::to_string(at));
    }
    out.append(buf, sizeof buf - z.avail_out);
    if (out.size() > limit) {
      inflateEnd(&z);
      throw trace_error(source + ": gzip: decompressed data larger than the limit");
    }
    if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
      if (fed < data.size()) {  // inputs beyond 4 GiB: feed the next piece
        std::size_t n = std::min<std::size_t>(data.size() - fed, UINT32_MAX);
        z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data() + fed));
        z.avail_in = static_cast<uInt>(n);
        fed += n;
        continue;
      }
      inflateEnd(&z);
      throw trace_error(source + ": gzip: truncated data (stream ends after " + std::to_string(out.size()) +
                        " decompressed bytes)");
    }
  }
  inflateEnd(&z);
  return out;
#else
  (void)data;
  (void)limit;
  throw trace_error(source + ": gzip-compressed, but vram was built without zlib (gunzip the file first)");
#endif
}

/// A PyTorch memory snapshot (`torch.cuda.memory._snapshot()` pickled): `device_traces` of
/// the device with the most events; blocks live at the start come from `segments` and from
/// frees of addresses never allocated in the window; recorded reserved bytes come from
/// `segment_*` events, anchored at the segments' total at the end.
inline trace read_pytorch_snapshot(std::string_view data, const std::string& source) {
  using vram::detail::trace::pickle_node;
  using kind = pickle_node::kind;
  vram::detail::trace::pickle_document doc;
  try {
    doc = vram::detail::trace::parse_pickle(data, source);
  } catch (const vram::detail::trace::pickle_error& e) {
    throw trace_error(e.what());
  }
  const pickle_node& root = doc.at(doc.root);
  if (root.type != kind::dict) throw trace_error(source + ": not a PyTorch memory snapshot (the pickle is no dict)");
  const pickle_node* traces = doc.find(root, "device_traces");
  if (traces == nullptr || traces->type != kind::list)
    throw trace_error(source + ": not a PyTorch memory snapshot (no 'device_traces' list; record with "
                      "torch.cuda.memory._record_memory_history() before _snapshot())");
  const pickle_node* events = nullptr;
  std::size_t nonempty = 0;
  for (auto i : traces->items) {
    const pickle_node& t = doc.at(i);
    if (t.type != kind::list) continue;
    nonempty += !t.items.empty();
    if (events == nullptr || t.items.size() > events->items.size()) events = &t;
  }
  detail::trace::trace_builder b(source, "pytorch-snapshot");
  if (nonempty > 1) b.warn("several devices recorded: replaying the one with the most events");

  auto get_int = [&](const pickle_node& d, std::string_view key, std::int64_t& out) {
    const pickle_node* v = doc.find(d, key);
    if (v == nullptr || (v->type != kind::integer && v->type != kind::boolean)) return false;
    out = v->integer;
    return true;
  };
  auto get_str = [&](const pickle_node& d, std::string_view key) -> std::string_view {
    const pickle_node* v = doc.find(d, key);
    return v != nullptr && v->type == kind::string ? std::string_view(v->text) : std::string_view{};
  };

  // Frees: free_requested (when the program freed) where present, else free_completed/free.
  bool has_requested = false;
  std::int64_t segment_net = 0;  // reserved bytes gained in the window
  if (events != nullptr) {
    for (auto i : events->items) {
      const pickle_node& e = doc.at(i);
      auto action = get_str(e, "action");
      std::int64_t size = 0;
      has_requested |= action == "free_requested";
      if (!get_int(e, "size", size) || size < 0) continue;
      if (action == "segment_alloc" || action == "segment_map") segment_net += size;
      if (action == "segment_free" || action == "segment_unmap") segment_net -= size;
    }
  }
  std::int64_t end_reserved = 0;
  const pickle_node* segments = doc.find(root, "segments");
  if (segments != nullptr && segments->type == kind::list)
    for (auto i : segments->items) {
      std::int64_t total = 0;
      if (get_int(doc.at(i), "total_size", total) && total > 0) end_reserved += total;
    }
  std::int64_t reserved = end_reserved - segment_net;
  if (reserved < 0) {
    b.warn("segments and segment events disagree: recorded reserved bytes start at 0");
    reserved = 0;
  }
  b.recorded_reserved(static_cast<std::uint64_t>(reserved));

  if (events != nullptr) {
    std::size_t index = 0;
    for (auto i : events->items) {
      ++index;
      const pickle_node& e = doc.at(i);
      if (e.type != kind::dict) {
        b.warn("event " + std::to_string(index) + " is not a dict: skipped");
        continue;
      }
      auto action = get_str(e, "action");
      std::int64_t addr = 0, size = 0, stream = 0, time_us = 0;
      get_int(e, "stream", stream);
      get_int(e, "time_us", time_us);
      bool ok = get_int(e, "addr", addr) && get_int(e, "size", size) && addr >= 0 && size >= 0 &&
                static_cast<std::uint64_t>(size) <= max_trace_bytes;
      bool is_free = action == (has_requested ? "free_requested" : "free_completed") || action == "free";
      bool is_segment = action.starts_with("segment_");
      if (action != "alloc" && !is_free && !is_segment) continue;  // snapshot, oom, free_completed, ...
      if (!ok) {
        b.warn("event " + std::to_string(index) + " (" + std::string(action) + ") has a missing or invalid addr/size: skipped");
        continue;
      }
      std::int64_t t = time_us * 1000;
      if (action == "alloc") {
        b.alloc(static_cast<std::uint64_t>(addr), static_cast<std::uint64_t>(size), static_cast<std::uint64_t>(stream), t);
      } else if (is_free) {
        b.free(static_cast<std::uint64_t>(addr), static_cast<std::uint64_t>(size), static_cast<std::uint64_t>(stream), t);
      } else {
        reserved += (action == "segment_alloc" || action == "segment_map") ? size : -size;
        b.recorded_reserved(static_cast<std::uint64_t>(std::max<std::int64_t>(reserved, 0)));
      }
    }
  }
  // Blocks still allocated at the end that no allocation in the window explains.
  if (segments != nullptr && segments->type == kind::list)
    for (auto i : segments->items) {
      const pickle_node& seg = doc.at(i);
      std::int64_t stream = 0;
      get_int(seg, "stream", stream);
      const pickle_node* blocks = doc.find(seg, "blocks");
      if (blocks == nullptr || blocks->type != kind::list) continue;
      for (auto j : blocks->items) {
        const pickle_node& blk = doc.at(j);
        if (get_str(blk, "state") != "active_allocated") continue;
        std::int64_t addr = 0, size = 0;
        if (!get_int(blk, "address", addr) || addr < 0) continue;
        if (!get_int(blk, "requested_size", size) && !get_int(blk, "size", size)) continue;
        if (size <= 0 || static_cast<std::uint64_t>(size) > max_trace_bytes) continue;
        b.live_at_end(static_cast<std::uint64_t>(addr), static_cast<std::uint64_t>(size), static_cast<std::uint64_t>(stream));
      }
    }
  return std::move(b).finish();
}

/// A PyTorch profiler (Kineto) Chrome trace: `[memory]` instant events of one CUDA device
/// (`Device Type` 1); `Bytes` > 0 allocates, < 0 frees; `Total Reserved` is recorded.
inline trace read_kineto(std::string_view text, const std::string& source) {
  detail::trace::trace_builder b(source, "kineto");
  // After a byte order mark, offsets in errors still count from the start of the file.
  const std::size_t bom = text.size() - detail::trace::strip_bom(text).size();
  text.remove_prefix(bom);
  vram::detail::trace::json_reader r(text, source, bom);
  std::int64_t device = -1;
  std::size_t other_devices = 0;
  // Events of several host threads are not in time order in the file: collect, then sort.
  struct record {
    std::int64_t time_ns, index;
    std::uint64_t addr;
    std::int64_t bytes, reserved;  // bytes < 0: a free; reserved < 0: not recorded
    std::int64_t allocated;        // "Total Allocated" after the event, < 0: not recorded
  };
  std::vector<record> records;
  auto on_event = [&](const vram::detail::trace::json_value& e) {
    const auto* name = e.find("name");
    if (name == nullptr || !name->is_string() || name->string != "[memory]") return;
    const auto* args = e.find("args");
    if (args == nullptr) return b.warn("[memory] event without args: skipped");
    const auto* type = args->find("Device Type");
    if (type == nullptr || !type->is_number() || type->as_int() != 1) return;  // CPU memory
    const auto* id = args->find("Device Id");
    std::int64_t dev = id != nullptr && id->is_number() ? id->as_int() : 0;
    if (device < 0) device = dev;
    if (dev != device) {
      ++other_devices;
      return;
    }
    const auto* addr = args->find("Addr");
    const auto* bytes = args->find("Bytes");
    if (addr == nullptr || bytes == nullptr || !addr->is_number() || !bytes->is_number() || !addr->integral ||
        !bytes->integral)
      return b.warn("[memory] event without integral Addr/Bytes: skipped");
    std::int64_t n = bytes->integer;
    std::uint64_t size = n < 0 ? 0 - static_cast<std::uint64_t>(n) : static_cast<std::uint64_t>(n);
    if (size > max_trace_bytes) return b.warn("[memory] event with an absurd size: skipped");
    const auto* ts = e.find("ts");
    const auto* index = args->find("Ev Idx");
    const auto* reserved = args->find("Total Reserved");
    const auto* allocated = args->find("Total Allocated");
    records.push_back({vram::detail::trace::saturate_to_int64(ts != nullptr && ts->is_number() ? ts->number * 1000.0 : 0.0),
                       index != nullptr && index->is_number() ? index->as_int() : 0,
                       static_cast<std::uint64_t>(addr->integer), n,
                       reserved != nullptr && reserved->is_number() && reserved->number >= 0
                           ? vram::detail::trace::saturate_to_int64(reserved->number)
                           : -1,
                       allocated != nullptr && allocated->is_number() && allocated->number >= 0
                           ? vram::detail::trace::saturate_to_int64(allocated->number)
                           : -1});
  };
  auto events_array = [&] {
    r.begin_array();
    bool first = true;
    while (r.next_element(first)) {
      // Skim each event; build a DOM only for the few that are memory events.
      std::size_t start = r.offset();
      r.skim_value();
      std::string_view slice = text.substr(start, r.offset() - start);
      if (slice.find("\"[memory]\"") == std::string_view::npos) continue;
      vram::detail::trace::json_reader event_reader(slice, source, bom + start);
      on_event(event_reader.parse_value(1));
    }
  };
  try {
    if (text.find_first_not_of(" \t\r\n") != std::string_view::npos &&
        text[text.find_first_not_of(" \t\r\n")] == '[') {
      events_array();
    } else {
      r.begin_object();
      std::string key;
      bool first = true;
      bool found = false;
      while (r.next_key(key, first)) {
        if (key == "traceEvents") {
          found = true;
          events_array();
        } else {
          r.skip_value(1);
        }
      }
      if (!found) throw trace_error(source + ": a JSON file without 'traceEvents' (not a Chrome/Kineto trace)");
    }
    if (!r.at_end()) r.fail("trailing data after the JSON value");
  } catch (const vram::detail::trace::json_error& e) {
    throw trace_error(e.what());
  }
  std::stable_sort(records.begin(), records.end(), [](const record& a, const record& c) {
    return a.time_ns != c.time_ns ? a.time_ns < c.time_ns : a.index < c.index;
  });
  // Memory allocated before the window and not freed in it: one block live throughout, so
  // peaks compare with the recorded "Total Reserved" (which includes it). "Total Allocated"
  // after the first event, less what that event added: unsigned, it cannot overflow (the
  // total is below 2^63, saturated; an event's size at most max_trace_bytes).
  std::uint64_t before = 0;
  if (!records.empty() && records.front().allocated >= 0) {
    auto allocated = static_cast<std::uint64_t>(records.front().allocated);
    std::int64_t n = records.front().bytes;
    std::uint64_t size = n < 0 ? 0 - static_cast<std::uint64_t>(n) : static_cast<std::uint64_t>(n);
    before = n < 0 ? allocated + size : (allocated > size ? allocated - size : 0);
  }
  for (const auto& r : records) {
    auto size = r.bytes < 0 ? 0 - static_cast<std::uint64_t>(r.bytes) : static_cast<std::uint64_t>(r.bytes);
    if (r.bytes > 0) b.alloc(r.addr, size, 0, r.time_ns);
    else if (r.bytes < 0) b.free(r.addr, size, 0, r.time_ns);
    if (r.reserved >= 0) b.recorded_reserved(static_cast<std::uint64_t>(r.reserved));
  }
  if (before > 0) b.live_before_window(before);
  if (other_devices != 0)
    b.warn(std::to_string(other_devices) + " memory events of other CUDA devices skipped (device " +
           std::to_string(device) + " replayed)");
  if (b.events() == 0 && device < 0)
    b.warn("no CUDA [memory] events: record with torch.profiler.profile(profile_memory=True)");
  return std::move(b).finish();
}

/// An RMM log (`rmm::mr::logging_resource_adaptor`): header `Thread,Time,Action,Pointer,Size,Stream`
/// (column order free, an optional `Tenant` column ignored); `allocate failure` rows are skipped.
inline trace read_rmm_csv(std::string_view text, const std::string& source) {
  return detail::trace::read_rmm_csv(text, source);
}

/// A lifetime CSV (`id,lower,upper,size`): buffer `id` is live over steps [lower, upper).
inline trace read_lifetime_csv(std::string_view text, const std::string& source) {
  trace t;
  t.name = source;
  t.format = "lifetime-csv";
  struct row {
    std::int64_t time;
    bool alloc;
    std::uint64_t id, bytes;
  };
  std::vector<row> rows;
  std::unordered_set<std::uint64_t> csv_ids;
  bool header = false;
  detail::trace::row_tally tally;
  detail::trace::for_each_line(text, [&](std::string_view line, std::size_t number) {
    if (line.empty()) return;
    if (!header) {
      if (line != "id,lower,upper,size") throw trace_error(source + ": line 1: expected the header id,lower,upper,size");
      header = true;
      return;
    }
    auto f = detail::trace::split(line);
    std::uint64_t id = 0, size = 0;
    std::int64_t lower = 0, upper = 0;
    ++tally.rows;
    if (f.size() != 4 || !detail::trace::parse_u64(f[0], id) || !detail::trace::parse_i64(f[1], lower) ||
        !detail::trace::parse_i64(f[2], upper) || !detail::trace::parse_u64(f[3], size) || size > max_trace_bytes)
      return t.warn(tally.bad(source + ": line " + std::to_string(number) + ": malformed row: skipped"));
    if (upper <= lower) return t.warn(source + ": line " + std::to_string(number) + ": empty lifetime: skipped");
    // Events are keyed by the row, not by the CSV id: a planner's ids need not be unique.
    if (!csv_ids.insert(id).second) t.warn(source + ": duplicate buffer id " + std::to_string(id));
    std::uint64_t buffer = rows.size() / 2;
    rows.push_back({lower, true, buffer, size});
    rows.push_back({upper, false, buffer, size});
  });
  if (!header) throw trace_error(source + ": empty lifetime CSV");
  if (tally.none_readable()) throw trace_error(tally.error());
  // Frees before allocations at the same step ([lower, upper) is half-open).
  std::stable_sort(rows.begin(), rows.end(), [](const row& a, const row& b) {
    return a.time != b.time ? a.time < b.time : (!a.alloc && b.alloc);
  });
  t.events.reserve(rows.size());
  for (const auto& r : rows)
    t.events.push_back({r.alloc ? event::op::alloc : event::op::free, 0, 0, r.id, r.bytes, r.time});
  // Renumber the buffers densely, in allocation order (each buffer's free follows its alloc).
  std::vector<std::uint64_t> ids(rows.size() / 2);
  std::uint64_t next = 0;
  for (auto& e : t.events) {
    if (e.kind == event::op::alloc) ids[e.id] = next++;
    e.id = ids[e.id];
  }
  return t;
}

}  // namespace vram::trace

namespace vram::detail::trace {

/// vram's own format, a line at a time. Ids are renumbered in allocation order, so that only
/// the live ones are remembered: a file id may be used again once freed. The window's events
/// go to the trace or, for a trace read as a stream, to `sink`.
class vram_trace_parser {
 public:
  explicit vram_trace_parser(const std::string& source, std::function<void(const vram::trace::event&)> sink = {})
      : sink_(std::move(sink)) {
    t_.name = source;
    t_.format = "vram-trace";
  }

  void line(std::string_view line, std::size_t number) {
    auto where = [&] { return t_.name + ": line " + std::to_string(number); };
    if (number == 1) {
      if (line != "# vram-trace 1") throw vram::trace::trace_error(where() + ": expected '# vram-trace 1'");
      return;
    }
    if (line.empty() || line.front() == '#' || line.starts_with("op,")) return;
    split_into(line, fields_);
    const auto& f = fields_;
    std::uint64_t id = 0, bytes = 0, stream = 0;
    std::int64_t time = 0;
    ++tally_.rows;
    if (f.size() != 5 || f[0].size() != 1 || !parse_u64(f[2], bytes) || bytes > vram::trace::max_trace_bytes ||
        (!f[1].empty() && !parse_u64(f[1], id)) ||
        (!f[3].empty() && (!parse_u64(f[3], stream) || stream > 65535)) || (!f[4].empty() && !parse_i64(f[4], time)))
      return t_.warn(tally_.bad(where() + ": malformed row: skipped"));
    char op = f[0][0];
    auto s = static_cast<std::uint32_t>(stream);
    max_stream_ = std::max(max_stream_, s);
    switch (op) {
      case 'L':
        if (window_) return t_.warn(where() + ": L row after the first A/F row: skipped");
        [[fallthrough]];
      case 'A': {
        auto [it, fresh] = live_.try_emplace(id, block{next_id_, bytes});
        if (!fresh) return t_.warn(where() + ": id allocated again while live: skipped");
        vram::trace::event e{vram::trace::event::op::alloc, 0, s, next_id_++, bytes, time};
        if (op == 'L') {
          t_.events.push_back(e);
          ++t_.initial_live;
        } else {
          window_ = true;
          emit(e);
        }
        return;
      }
      case 'F': {
        window_ = true;
        auto it = live_.find(id);
        if (it == live_.end()) return t_.warn(where() + ": free of an id that is not live: skipped");
        emit({vram::trace::event::op::free, 0, s, it->second.id, it->second.bytes, time});
        live_.erase(it);
        return;
      }
      case 'R':
        t_.recorded_reserved.push_back({t_.initial_live + window_events_, bytes});
        if (!t_.recorded_peak_reserved || bytes > *t_.recorded_peak_reserved) t_.recorded_peak_reserved = bytes;
        return;
      default: return t_.warn(tally_.bad(where() + ": unknown op: skipped"));
    }
  }

  /// The trace (without the window's events where a sink took them). Throws trace_error when
  /// no row could be read.
  vram::trace::trace finish() && {
    if (tally_.none_readable()) throw vram::trace::trace_error(tally_.error());
    t_.streams = max_stream_ + 1;
    return std::move(t_);
  }

 private:
  struct block {
    std::uint64_t id;  // renumbered
    std::uint64_t bytes;
  };
  void emit(const vram::trace::event& e) {
    ++window_events_;
    if (sink_) sink_(e);
    else t_.events.push_back(e);
  }

  vram::trace::trace t_;
  std::function<void(const vram::trace::event&)> sink_;
  std::unordered_map<std::uint64_t, block> live_;  // file id -> live block
  std::vector<std::string_view> fields_;           // of the current line
  std::uint64_t next_id_ = 0;
  std::size_t window_events_ = 0;
  std::uint32_t max_stream_ = 0;
  bool window_ = false;
  row_tally tally_;
};

}  // namespace vram::detail::trace

namespace vram::trace {

/// vram's own format (see docs/replay.md): a first line `# vram-trace 1`, then rows
/// `op,id,bytes,stream,time_ns` with op L (live at start), A (alloc), F (free) or
/// R (recorded reserved: bytes = reserved bytes after the previous event).
inline trace read_vram_trace(std::string_view text, const std::string& source) {
  detail::trace::vram_trace_parser parser(source);
  detail::trace::for_each_line(text, [&](std::string_view line, std::size_t number) { parser.line(line, number); });
  return std::move(parser).finish();
}

/// Writes `t` in vram's own format (read back by read_vram_trace).
inline void write_vram_trace(std::ostream& out, const trace& t) {
  out << "# vram-trace 1\n# " << t.name << " (" << t.format << ")\nop,id,bytes,stream,time_ns\n";
  std::size_t sample = 0, i = 0;
  auto samples_before = [&](std::size_t index) {
    while (sample < t.recorded_reserved.size() && t.recorded_reserved[sample].event_index == index)
      out << "R,," << t.recorded_reserved[sample++].reserved_bytes << ",,\n";
  };
  t.for_each_event([&](const event& e) {
    samples_before(i);
    char op = e.kind == event::op::free ? 'F' : (i < t.initial_live ? 'L' : 'A');
    out << op << ',' << e.id << ',' << e.bytes << ',' << e.stream << ',' << e.time_ns << '\n';
    ++i;
  });
  samples_before(i);
}

/// Reads a trace held in memory, detecting its format from the content.
inline trace parse_trace(std::string_view data, const std::string& source) {
  if (data.size() >= 2 && static_cast<unsigned char>(data[0]) == 0x1f && static_cast<unsigned char>(data[1]) == 0x8b) {
    std::string text = gunzip(data, source);
    return parse_trace(text, source);
  }
  if (!data.empty() && static_cast<unsigned char>(data[0]) == 0x80) return read_pytorch_snapshot(data, source);
  std::string_view text = detail::trace::strip_bom(data);  // the readers skip it too
  auto start = text.find_first_not_of(" \t\r\n");
  if (start != std::string_view::npos && (text[start] == '{' || text[start] == '[')) return read_kineto(data, source);
  auto line = detail::trace::first_line(data);
  if (line.starts_with("# vram-trace")) return read_vram_trace(data, source);
  if (line == "id,lower,upper,size") return read_lifetime_csv(data, source);
  if (line.find("Action") != std::string_view::npos && line.find("Pointer") != std::string_view::npos)
    return read_rmm_csv(data, source);
  throw trace_error(source + ": unknown trace format (expected a PyTorch snapshot pickle, a Kineto JSON trace, "
                             "an RMM CSV log, a lifetime CSV or a vram trace)");
}

/// Reads the file at `path`, detecting its format from the content.
/// Errors name the file and the reason: missing, a directory, unreadable (with the system's
/// reason), empty, or what the format reader found.
inline trace read_trace(const std::string& path) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) throw trace_error(path + ": no such file");
  if (status.type() == std::filesystem::file_type::directory)
    throw trace_error(path + ": is a directory, not a trace file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw trace_error(path + ": cannot open (" + std::strerror(errno) + ")");
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw trace_error(path + ": read error (" + std::strerror(errno) + ")");
  if (data.empty()) throw trace_error(path + ": empty file (a trace has at least a header or one event)");
  trace t = parse_trace(data, path);  // errors name the path
  t.name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  return t;
}

}  // namespace vram::trace

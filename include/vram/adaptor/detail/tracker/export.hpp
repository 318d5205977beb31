#pragma once
// The tracker's exporters: PyTorch memory snapshot (pickle), RMM CSV log (+ Tenant column),
// JSON, and a plain-text "who holds VRAM" report. They read copies taken under the tracker's
// lock, so they run without holding it.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if __has_include(<execinfo.h>)
#  include <execinfo.h>
#  define VRAM_TRACKER_HAS_BACKTRACE 1
#else
#  define VRAM_TRACKER_HAS_BACKTRACE 0
#endif

#include <vram/trace/detail/rmm_csv.hpp>
#include <vram/trace/detail/pickle.hpp>
#include <vram/adaptor/detail/tracker/records.hpp>

namespace vram::detail::tracker {

/// Symbol strings for return addresses ("binary(function+0x1c) [0x...]"), or hex addresses.
inline std::vector<std::string> tracker_symbolize(const std::vector<void*>& frames) {
  std::vector<std::string> out;
  if (frames.empty()) return out;
#if VRAM_TRACKER_HAS_BACKTRACE
  char** names = backtrace_symbols(frames.data(), static_cast<int>(frames.size()));
  if (names != nullptr) {
    for (std::size_t i = 0; i < frames.size(); ++i) out.emplace_back(names[i]);
    std::free(names);  // NOLINT: backtrace_symbols allocates with malloc
    return out;
  }
#endif
  for (void* f : frames) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", f);
    out.emplace_back(buf);
  }
  return out;
}

/// What the exporters need, copied out of the tracker.
struct tracker_export_data {
  const tenant_registry* registry;
  int device = 0;
  std::vector<tracked_allocation> live;     // sorted by address
  std::vector<tracked_allocation> pending;  // frees requested, not completed; sorted by address
  std::vector<tracker_event> events;        // oldest first
  std::size_t dropped_events = 0;
  std::vector<std::pair<std::uint64_t, std::size_t>> segments;  // address order; empty: one per allocation
};

/// PyTorch memory snapshot, with the keys and value types PyTorch writes.
///
/// Blocks: live allocations (state active_allocated) and frees still pending on their
/// streams (active_pending_free), in address order. With known upstream segments (an
/// allocator's observer hooks), each segment lists its blocks in address order covering it,
/// the gaps between them inactive. Blocks outside every known segment (and all of them for
/// tracker_adaptor, which sees allocations, not a pool's segments) are each a segment
/// holding one block, as PyTorch records with caching disabled. Per segment, as PyTorch
/// computes them: allocated_size = sizes of active_allocated blocks, active_size = sizes of
/// active (allocated or pending) blocks, requested_size = their requested sizes.
/// Trace entries: action, addr (device_free instead for oom), size, stream, time_us, frames.
/// The tenant and tag are the first frame of each block and trace entry (filename
/// "tenant:<path>", name "<tag>"), so the viewer shows who allocated what.
inline std::string tracker_write_pytorch_snapshot(const tracker_export_data& d) {
  trace::pickle_writer w;
  auto frames = [&](tenant t, std::string_view tag, const std::vector<void*>* native) {
    w.list_begin();
    w.dict_begin();
    w.string("name");
    w.string(tag.empty() ? std::string_view("(untagged)") : tag);
    w.string("filename");
    w.string("tenant:" + tenant_path(*d.registry, t));
    w.string("line");
    w.integer(std::int64_t{0});
    w.dict_end();
    if (native != nullptr)
      for (auto& s : tracker_symbolize(*native)) {
        w.dict_begin();
        w.string("name");
        w.string(s);
        w.string("filename");
        w.string("??");
        w.string("line");
        w.integer(std::int64_t{0});
        w.dict_end();
      }
    w.list_end();
  };
  auto sz = [&](std::size_t v) { w.integer(static_cast<std::uint64_t>(v)); };

  // Live and pending blocks in one address order (their ranges are disjoint).
  struct block_ref {
    const tracked_allocation* a;
    bool pending;
    [[nodiscard]] std::uint64_t address() const { return reinterpret_cast<std::uintptr_t>(a->address); }
  };
  std::vector<block_ref> blocks;
  blocks.reserve(d.live.size() + d.pending.size());
  for (const auto& a : d.live) blocks.push_back({&a, false});
  for (const auto& a : d.pending) blocks.push_back({&a, true});
  std::sort(blocks.begin(), blocks.end(), [](const block_ref& x, const block_ref& y) { return x.address() < y.address(); });

  auto segment = [&](std::uint64_t base, std::size_t size, std::size_t first, std::size_t last) {
    // blocks[first, last) lie inside [base, base + size), in address order.
    std::size_t allocated = 0, active = 0;
    for (std::size_t i = first; i < last; ++i) {
      active += blocks[i].a->bytes;
      if (!blocks[i].pending) allocated += blocks[i].a->bytes;
    }
    w.dict_begin();
    w.string("device"); w.integer(std::int64_t{d.device});
    w.string("address"); w.integer(base);
    w.string("total_size"); sz(size);
    w.string("allocated_size"); sz(allocated);
    w.string("active_size"); sz(active);
    w.string("requested_size"); sz(active);  // a block's size is its requested size here
    w.string("stream"); w.integer(first < last ? blocks[first].a->stream : std::uint64_t{0});
    w.string("segment_type"); w.string("large");
    w.string("segment_pool_id"); w.integer(std::int64_t{0}); w.integer(std::int64_t{0}); w.tuple2_end();
    w.string("is_expandable"); w.boolean(false);
    w.string("frames"); w.list_begin(); w.list_end();
    w.string("blocks");
    w.list_begin();
    std::uint64_t at = base;
    auto gap = [&](std::uint64_t to) {
      if (to <= at) return;
      w.dict_begin();
      w.string("address"); w.integer(at);
      w.string("size"); sz(static_cast<std::size_t>(to - at));
      w.string("requested_size"); sz(0);
      w.string("state"); w.string("inactive");
      w.string("frames"); w.list_begin(); w.list_end();
      w.dict_end();
      at = to;
    };
    for (std::size_t i = first; i < last; ++i) {
      const auto& a = *blocks[i].a;
      gap(blocks[i].address());
      w.dict_begin();
      w.string("address"); w.integer(blocks[i].address());
      w.string("size"); sz(a.bytes);
      w.string("requested_size"); sz(a.bytes);
      w.string("state"); w.string(blocks[i].pending ? "active_pending_free" : "active_allocated");
      w.string("frames"); frames(a.owner, a.tag, &a.frames);
      w.dict_end();
      at = blocks[i].address() + a.bytes;
    }
    gap(base + size);
    w.list_end();
    w.dict_end();
  };

  w.dict_begin();
  w.string("segments");
  w.list_begin();
  {
    // Merge the known segments and the blocks (both in address order).
    std::size_t i = 0, k = 0;
    const std::size_t n = blocks.size();
    while (i < n || k < d.segments.size()) {
      if (k < d.segments.size() && (i == n || d.segments[k].first <= blocks[i].address())) {
        auto [base, size] = d.segments[k++];
        std::size_t first = i;
        while (i < n && blocks[i].address() + blocks[i].a->bytes <= base + size) ++i;
        segment(base, size, first, i);
      } else {
        segment(blocks[i].address(), blocks[i].a->bytes, i, i + 1);  // outside every known segment
        ++i;
      }
    }
  }
  w.list_end();

  w.string("device_traces");
  w.list_begin();
  for (int dev = 0; dev <= d.device; ++dev) {
    w.list_begin();
    if (dev == d.device)
      for (const auto& e : d.events) {
        w.dict_begin();
        w.string("action"); w.string(to_string(e.action));
        if (e.action == tracker_action::oom) {
          w.string("device_free"); w.integer(e.device_free);
        } else {
          w.string("addr"); w.integer(e.address);
        }
        w.string("size"); sz(e.bytes);
        w.string("stream"); w.integer(e.stream);
        w.string("time_us"); w.integer(e.time_us);
        w.string("frames"); frames(e.owner, e.tag.data(), nullptr);
        w.dict_end();
      }
    w.list_end();
  }
  w.list_end();

  w.string("allocator_settings");
  w.dict_begin();
  w.dict_end();
  w.dict_end();
  return std::move(w).finish();
}

/// RMM's CSV log: Thread,Time,Action,Pointer,Size,Stream plus a Tenant column (the tenant's
/// path). Time is local HH:MM:SS.ffffff as RMM writes it. Frees are logged when requested.
inline void tracker_write_rmm_csv(std::ostream& out, const tracker_export_data& d) {
  out << trace::rmm_csv_header;
  for (const auto& e : d.events) {
    const char* action = nullptr;
    if (e.action == tracker_action::alloc) action = "allocate";
    else if (e.action == tracker_action::free_requested) action = "free";
    else if (e.action == tracker_action::oom) action = "allocate failure";
    if (action != nullptr)
      trace::write_rmm_csv_line(out, e.thread, e.time_us, action, e.address, e.bytes, e.stream, tenant_path(*d.registry, e.owner));
  }
}

inline void tracker_json_string(std::ostream& out, std::string_view s) {
  out << '"';
  for (char c : s) {
    if (c == '"' || c == '\\') out << '\\' << c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out << buf;
    } else out << c;
  }
  out << '"';
}

inline void tracker_write_holders(std::ostream& out, const std::vector<tracker_holder>& hs, std::string_view key) {
  out << '[';
  for (std::size_t i = 0; i < hs.size(); ++i) {
    out << (i ? "," : "") << "{\"" << key << "\":";
    tracker_json_string(out, hs[i].name);
    out << ",\"bytes\":" << hs[i].bytes << ",\"allocations\":" << hs[i].allocations << '}';
  }
  out << ']';
}

/// JSON: totals, holders by tenant and tag, live allocations (address order) and events.
inline void tracker_write_json(std::ostream& out, const tracker_export_data& d, const tracker_snapshot& s) {
  out << "{\"live_bytes\":" << s.live_bytes << ",\"live_allocations\":" << s.live_allocations << ",\"by_tenant\":";
  tracker_write_holders(out, s.by_tenant, "tenant");
  out << ",\"by_tag\":";
  tracker_write_holders(out, s.by_tag, "tag");
  out << ",\"allocations\":[";
  for (std::size_t i = 0; i < d.live.size(); ++i) {
    const auto& a = d.live[i];
    out << (i ? "," : "") << "{\"address\":" << reinterpret_cast<std::uintptr_t>(a.address) << ",\"size\":" << a.bytes
        << ",\"tenant\":";
    tracker_json_string(out, tenant_path(*d.registry, a.owner));
    out << ",\"tag\":";
    tracker_json_string(out, a.tag);
    out << ",\"stream\":" << a.stream << ",\"time_us\":" << a.time_us;
    if (!a.frames.empty()) {
      out << ",\"frames\":[";
      auto names = tracker_symbolize(a.frames);
      for (std::size_t k = 0; k < names.size(); ++k) {
        out << (k ? "," : "");
        tracker_json_string(out, names[k]);
      }
      out << ']';
    }
    out << '}';
  }
  out << "],\"events\":[";
  for (std::size_t i = 0; i < d.events.size(); ++i) {
    const auto& e = d.events[i];
    out << (i ? "," : "") << "{\"action\":\"" << to_string(e.action) << "\",\"addr\":" << e.address;
    if (e.action == tracker_action::oom) out << ",\"device_free\":" << e.device_free;
    out << ",\"size\":" << e.bytes << ",\"stream\":" << e.stream << ",\"time_us\":" << e.time_us << ",\"tenant\":";
    tracker_json_string(out, tenant_path(*d.registry, e.owner));
    out << ",\"tag\":";
    tracker_json_string(out, e.tag.data());
    out << '}';
  }
  out << "],\"dropped_events\":" << d.dropped_events << "}\n";
}

/// A plain-text report: totals, then the biggest holders by tenant, by tag, and allocations.
inline void tracker_write_report(std::ostream& out, const tracker_snapshot& s, const tenant_registry& reg,
                                 std::size_t top = 10) {
  out << "vram: who holds memory: " << s.live_bytes << " bytes in " << s.live_allocations << " allocations\n";
  auto section = [&](const char* title, const std::vector<tracker_holder>& hs) {
    out << "  by " << title << ":\n";
    for (std::size_t i = 0; i < hs.size() && i < top; ++i)
      out << "    " << hs[i].bytes << " bytes in " << hs[i].allocations << " allocations: "
          << (hs[i].name.empty() ? "(untagged)" : hs[i].name) << '\n';
  };
  section("tenant", s.by_tenant);
  section("tag", s.by_tag);
  out << "  largest allocations:\n";
  for (std::size_t i = 0; i < s.largest.size() && i < top; ++i) {
    const auto& a = s.largest[i];
    out << "    " << a.bytes << " bytes at " << a.address << " tenant " << tenant_path(reg, a.owner) << " tag "
        << (a.tag.empty() ? "(untagged)" : a.tag) << '\n';
    for (auto& f : tracker_symbolize(a.frames)) out << "      " << f << '\n';
  }
}

}  // namespace vram::detail::tracker

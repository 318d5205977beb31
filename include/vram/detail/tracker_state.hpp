#pragma once
// The tracker's shared state: live allocations, upstream segments (when fed by an allocator's
// observer hooks), the event ring, and the exporters' entry points. Used by tracker_adaptor
// and tracker_observer; copies of either share one tracker_state.

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/core/error_handler.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/core/tenant.hpp>
#include <vram/detail/throw.hpp>
#include <vram/detail/tracker_export.hpp>
#include <vram/detail/tracker_records.hpp>

namespace vram::detail {

struct tracker_state {
  tracker_state(tracker_options o, const char* resource_name)
      : options(std::move(o)), ring(options.event_capacity), resource(resource_name) {
    if (!options.registry) throw_invalid_argument(resource, "null tenant registry");
  }

  tracker_options options;
  mutable std::mutex mutex;
  // Invariants: live_bytes == sum of live[p].bytes;
  //             live.size() == allocations - deallocations
  std::unordered_map<const void*, tracked_allocation> live;
  tracker_ring ring;
  std::size_t live_bytes = 0, peak_live_bytes = 0;
  std::size_t allocations = 0, deallocations = 0, ooms = 0;
  const char* resource;  // for misuse reports
  // Upstream segments [address, address + size) an allocator reported through its observer
  // hooks (on_grow / on_release). Empty for tracker_adaptor: each allocation is its own segment.
  std::map<std::uintptr_t, std::size_t> segments;

  static std::uint64_t thread_hash() noexcept { return std::hash<std::thread::id>{}(std::this_thread::get_id()); }

  void push(tracker_action a, const void* p, std::size_t bytes, stream_ref s, tenant t, std::string_view tag,
            std::int64_t now) noexcept {
    tracker_event e{a, reinterpret_cast<std::uintptr_t>(p), bytes, s.key(), now, thread_hash(), t, {}};
    e.set_tag(tag);
    ring.push(e);
  }

  /// `own_segment`: the allocation is reported as a segment of its own (adaptor mode).
  void record_allocate(const void* p, std::size_t bytes, stream_ref s, tenant t, bool own_segment = true) {
    tracked_allocation a{p, bytes, t, current_tag(), s.key(), tracker_now_us(), {}};
#if VRAM_TRACKER_HAS_BACKTRACE
    if (options.capture_stacks) {
      a.frames.resize(options.max_frames);
      int n = backtrace(a.frames.data(), static_cast<int>(a.frames.size()));
      a.frames.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    }
#endif
    std::lock_guard lock(mutex);
    auto [it, inserted] = live.emplace(p, std::move(a));
    const auto& r = it->second;
    if (!inserted) return;  // an observer told twice: keep the first record
    live_bytes += bytes;
    peak_live_bytes = std::max(peak_live_bytes, live_bytes);
    ++allocations;  // an observer told twice: keep the first record
    if (own_segment) push(tracker_action::segment_alloc, p, bytes, s, t, r.tag, r.time_us);
    push(tracker_action::alloc, p, bytes, s, t, r.tag, r.time_us);
  }

  /// `report`: report misuse (adaptor mode); an observer leaves that to the allocator.
  bool record_free_requested(const void* p, std::size_t bytes, stream_ref s, tenant& owner, bool report = true) noexcept {
    std::lock_guard lock(mutex);
    auto it = live.find(p);
    if (it == live.end()) {
      if (report) report_misuse({misuse::foreign_pointer, resource, p, bytes, 0});
      return false;
    }
    if (it->second.bytes != bytes) {
      if (report) report_misuse({misuse::wrong_size, resource, p, bytes, it->second.bytes});
      return false;
    }
    owner = it->second.owner;
    push(tracker_action::free_requested, p, bytes, s, owner, it->second.tag, tracker_now_us());
    live_bytes -= bytes;
    ++deallocations;
    live.erase(it);
    return true;
  }

  void record_free_completed(const void* p, std::size_t bytes, stream_ref s, tenant owner,
                             bool own_segment = true) noexcept {
    std::lock_guard lock(mutex);
    auto now = tracker_now_us();
    push(tracker_action::free_completed, p, bytes, s, owner, "", now);
    if (own_segment) push(tracker_action::segment_free, p, bytes, s, owner, "", now);
  }

  /// An allocator took [p, p + bytes) from its upstream (grow) or gave it back (release).
  void record_segment(const void* p, std::size_t bytes, bool grow) noexcept {
    std::lock_guard lock(mutex);
    auto a = reinterpret_cast<std::uintptr_t>(p);
    try {
      if (grow) segments[a] = bytes;
      else segments.erase(a);
    } catch (...) {  // out of host memory for the map: the segment goes unrecorded
    }
    push(grow ? tracker_action::segment_alloc : tracker_action::segment_free, p, bytes, stream_ref{}, tenant{}, "",
         tracker_now_us());
  }

  void record_oom(std::size_t bytes, stream_ref s, tenant t) noexcept {
    {
      std::lock_guard lock(mutex);
      ++ooms;
      push(tracker_action::oom, nullptr, bytes, s, t, current_tag(), tracker_now_us());
    }
    if (!options.oom_dump_path.empty()) {
      try {
        (void)dump(options.oom_dump_path);
      } catch (...) {  // a failed dump must not replace the out_of_memory being thrown
      }
    }
  }

  std::vector<tracked_allocation> live_copy() const {
    std::vector<tracked_allocation> v;
    {
      std::lock_guard lock(mutex);
      v.reserve(live.size());
      for (auto& [p, a] : live) v.push_back(a);
    }
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.address < b.address; });
    return v;
  }
  std::vector<tracker_event> events_copy() const {
    std::vector<tracker_event> v;
    std::lock_guard lock(mutex);
    v.reserve(ring.size());
    ring.for_each([&](const tracker_event& e) { v.push_back(e); });
    return v;
  }

  tracker_export_data export_data() const {
    tracker_export_data d{options.registry.get(), options.device, live_copy(), events_copy(), 0, {}};
    std::lock_guard lock(mutex);
    d.dropped_events = ring.dropped();
    d.segments.assign(segments.begin(), segments.end());
    return d;
  }
  void write_memory_snapshot(std::ostream& out) const {
    auto bytes = tracker_write_pytorch_snapshot(export_data());
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  void write_json(std::ostream& out) const {
    auto d = export_data();
    tracker_write_json(out, d, summarize(d.live, *options.registry, 16));
  }
  void write_report(std::ostream& out, std::size_t top) const {
    tracker_write_report(out, summarize(live_copy(), *options.registry, top), *options.registry, top);
  }

  bool dump(const std::string& path) const {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    auto ends_with = [&](std::string_view ext) {
      return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
    };
    if (ends_with(".pickle") || ends_with(".pkl")) write_memory_snapshot(out);
    else if (ends_with(".json")) write_json(out);
    else if (ends_with(".csv")) tracker_write_rmm_csv(out, export_data());
    else write_report(out, 10);
    return static_cast<bool>(out);
  }

static tracker_snapshot summarize(const std::vector<tracked_allocation>& live, const tenant_registry& reg,
                                  std::size_t top) {
  tracker_snapshot s;
  std::map<std::uint32_t, tracker_holder> tenants;
  std::map<std::string, tracker_holder> tags;
  for (const auto& a : live) {
    s.live_bytes += a.bytes;
    ++s.live_allocations;
    auto& th = tenants[a.owner.id];
    th.bytes += a.bytes;
    ++th.allocations;
    auto& gh = tags[a.tag];
    gh.bytes += a.bytes;
    ++gh.allocations;
  }
  auto by_bytes = [](const tracker_holder& a, const tracker_holder& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  };
  for (auto& [id, h] : tenants) {
    h.name = tenant_path(reg, tenant{id});
    s.by_tenant.push_back(std::move(h));
  }
  for (auto& [tag, h] : tags) {
    h.name = tag;
    s.by_tag.push_back(std::move(h));
  }
  std::sort(s.by_tenant.begin(), s.by_tenant.end(), by_bytes);
  std::sort(s.by_tag.begin(), s.by_tag.end(), by_bytes);
  s.largest = live;
  std::sort(s.largest.begin(), s.largest.end(), [](auto& a, auto& b) { return a.bytes > b.bytes; });
  if (s.largest.size() > top) s.largest.resize(top);
  return s;
}
};

}  // namespace vram::detail

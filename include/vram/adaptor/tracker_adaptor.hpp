#pragma once
// vram::tracker_adaptor<Upstream>: who holds memory. Records every live allocation (tenant,
// tag, stream, size, time, optionally a native call stack) and a bounded history of events,
// and exports them as a PyTorch memory snapshot, an RMM CSV log, JSON or a text report.

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/event.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/core/tenant.hpp>
#include <vram/detail/throw.hpp>
#include <vram/detail/tracker_export.hpp>
#include <vram/detail/tracker_records.hpp>

namespace vram {

struct tracker_options {
  /// Events kept in the history ring (the newest win); 0 keeps none.
  std::size_t event_capacity = 16384;
  /// Record a native call stack (backtrace()) per allocation: ~1-2 µs each, off by default.
  bool capture_stacks = false;
  std::size_t max_frames = 32;
  /// When an allocation fails with out_of_memory, write a dump here (format from the
  /// extension: .pickle PyTorch snapshot, .json, .csv RMM log, anything else a text report).
  /// Empty: no dump.
  std::string oom_dump_path;
  /// The device number written into the PyTorch snapshot.
  int device = 0;
  /// Where tenant names and parents come from.
  std::shared_ptr<const tenant_registry> registry = tenant_registry::global();
};

/// Records who holds memory, for debugging and for production dumps.
///
/// Per live allocation: tenant (explicit argument, else vram::current_tenant()), tag
/// (vram::current_tag()), stream, requested size, time, and with capture_stacks a call stack.
/// Events (alloc, free_requested, free_completed, segment_alloc, segment_free, oom) go to a
/// bounded ring. Every allocation is reported as its own segment: the tracker sees the
/// upstream's allocations, not a pool's internal segments.
/// Thread safety: thread-safe; one mutex guards the records (this is a debugging and
/// accounting tool, not a hot-path counter: use statistics_adaptor for that).
/// Streams: deallocate(s, ...) records free_requested at once and free_completed when the
/// stream reaches the free (a host task, or cudaLaunchHostFunc on CUDA streams).
/// Alignment: that of the upstream. Upstream: held by value; copies share the records.
/// Misuse: freeing a pointer not live here, or with another size, is reported and changes
/// nothing (the upstream is not called).
/// OOM: an out_of_memory from the upstream is recorded (oom event), dumped to
/// oom_dump_path when set, and rethrown unchanged.
/// Complexity: O(1) expected per operation (hash map); snapshot() O(n log n).
template <class Upstream>
class tracker_adaptor : public forward_properties<tracker_adaptor<Upstream>, Upstream> {
 public:
  explicit tracker_adaptor(Upstream upstream = Upstream{}, tracker_options options = {})
      : upstream_(std::move(upstream)), state_(std::make_shared<state>(std::move(options))) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "tracker_adaptor"; }

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(s, bytes, align, current_tenant());
  }
  /// Allocates for tenant `t` (overriding the current tenant_scope).
  void* allocate(stream_ref s, std::size_t bytes, std::size_t align, tenant t) {
    void* p;
    try {
      p = upstream_.allocate(s, bytes, align);
    } catch (const out_of_memory&) {
      state_->record_oom(bytes, s, t);
      throw;
    }
    if (p == nullptr) return p;
    try {
      state_->record_allocate(p, bytes, s, t);
    } catch (...) {
      upstream_.deallocate(s, p, bytes, align);
      throw;
    }
    return p;
  }

  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    tenant owner;
    if (!state_->record_free_requested(p, bytes, s, owner)) return;
    upstream_.deallocate(s, p, bytes, align);
    if (s.is_synchronous()) {
      state_->record_free_completed(p, bytes, s, owner);
      return;
    }
    try {
      after_pending_work(s, [st = state_, p, bytes, s, owner] { st->record_free_completed(p, bytes, s, owner); });
    } catch (...) {
      state_->record_free_completed(p, bytes, s, owner);
    }
  }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align, current_tenant());
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align);
  }

  /// Who holds memory now, grouped by tenant and by tag, largest first; `largest` holds up to
  /// `top` allocations.
  [[nodiscard]] tracker_snapshot snapshot(std::size_t top = 16) const {
    return summarize(state_->live_copy(), *state_->options.registry, top);
  }

  /// Live allocations in address order.
  [[nodiscard]] std::vector<tracked_allocation> live_allocations() const { return state_->live_copy(); }
  /// The event history, oldest first (at most options.event_capacity events).
  [[nodiscard]] std::vector<tracker_event> events() const { return state_->events_copy(); }
  /// Events that fell out of the ring.
  [[nodiscard]] std::size_t dropped_events() const {
    std::lock_guard lock(state_->mutex);
    return state_->ring.dropped();
  }

  /// PyTorch memory snapshot pickle (opens in pytorch.org/memory_viz).
  void write_memory_snapshot(std::ostream& out) const { state_->write_memory_snapshot(out); }
  /// RMM CSV log of the event history, with a Tenant column.
  void write_csv(std::ostream& out) const { detail::tracker_write_rmm_csv(out, state_->export_data()); }
  /// JSON: totals, holders, live allocations, events.
  void write_json(std::ostream& out) const { state_->write_json(out); }
  /// A text report naming the biggest holders.
  void write_report(std::ostream& out, std::size_t top = 10) const { state_->write_report(out, top); }
  /// Writes to `path` in the format its extension names (see tracker_options::oom_dump_path).
  /// Returns false when the file cannot be written.
  bool dump(const std::string& path) const { return state_->dump(path); }

  [[nodiscard]] vram::stats stats() const {
    vram::stats s;
    if constexpr (has_stats<Upstream>) s = upstream_.stats();
    std::lock_guard lock(state_->mutex);
    s.requested_bytes = state_->live_bytes;
    s.peak_requested_bytes = state_->peak_live_bytes;
    if constexpr (!has_stats<Upstream>) {
      s.live_bytes = s.requested_bytes;
      s.peak_live_bytes = s.peak_requested_bytes;
    }
    s.live_allocations = state_->live.size();
    s.total_allocations = state_->allocations;
    s.total_deallocations = state_->deallocations;
    s.ooms = state_->ooms;
    return s;
  }

  std::size_t release()
    requires has_release<Upstream>
  { return upstream_.release(); }

  void check_invariants() const {
#if VRAM_DEBUG
    std::lock_guard lock(state_->mutex);
    std::size_t sum = 0;
    for (auto& [p, a] : state_->live) sum += a.bytes;
    if (sum != state_->live_bytes) throw std::logic_error("tracker_adaptor: live bytes != sum of records");
    if (state_->live.size() != state_->allocations - state_->deallocations)
      throw std::logic_error("tracker_adaptor: live records != allocations - deallocations");
#endif
  }

  [[nodiscard]] Upstream& upstream() noexcept { return upstream_; }
  [[nodiscard]] const Upstream& upstream() const noexcept { return upstream_; }
  [[nodiscard]] const tracker_options& options() const noexcept { return state_->options; }

  friend bool operator==(const tracker_adaptor& a, const tracker_adaptor& b) {
    return a.state_ == b.state_ && a.upstream_ == b.upstream_;
  }

 private:
  struct state {
    explicit state(tracker_options o) : options(std::move(o)), ring(options.event_capacity) {
      if (!options.registry) detail::throw_invalid_argument("tracker_adaptor", "null tenant registry");
    }

    tracker_options options;
    mutable std::mutex mutex;
    // Invariants: live_bytes == sum of live[p].bytes;
    //             live.size() == allocations - deallocations
    std::unordered_map<const void*, tracked_allocation> live;
    detail::tracker_ring ring;
    std::size_t live_bytes = 0, peak_live_bytes = 0;
    std::size_t allocations = 0, deallocations = 0, ooms = 0;

    static std::uint64_t thread_hash() noexcept { return std::hash<std::thread::id>{}(std::this_thread::get_id()); }

    void push(tracker_action a, const void* p, std::size_t bytes, stream_ref s, tenant t, std::string_view tag,
              std::int64_t now) noexcept {
      tracker_event e{a, reinterpret_cast<std::uintptr_t>(p), bytes, s.key(), now, thread_hash(), t, {}};
      e.set_tag(tag);
      ring.push(e);
    }

    void record_allocate(void* p, std::size_t bytes, stream_ref s, tenant t) {
      tracked_allocation a{p, bytes, t, current_tag(), s.key(), detail::tracker_now_us(), {}};
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
      live_bytes += bytes;
      peak_live_bytes = std::max(peak_live_bytes, live_bytes);
      ++allocations;
      push(tracker_action::segment_alloc, p, bytes, s, t, r.tag, r.time_us);
      push(tracker_action::alloc, p, bytes, s, t, r.tag, r.time_us);
    }

    bool record_free_requested(void* p, std::size_t bytes, stream_ref s, tenant& owner) noexcept {
      std::lock_guard lock(mutex);
      auto it = live.find(p);
      if (it == live.end()) {
        report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
        return false;
      }
      if (it->second.bytes != bytes) {
        report_misuse({misuse::wrong_size, name(), p, bytes, it->second.bytes});
        return false;
      }
      owner = it->second.owner;
      push(tracker_action::free_requested, p, bytes, s, owner, it->second.tag, detail::tracker_now_us());
      live_bytes -= bytes;
      ++deallocations;
      live.erase(it);
      return true;
    }

    void record_free_completed(void* p, std::size_t bytes, stream_ref s, tenant owner) noexcept {
      std::lock_guard lock(mutex);
      auto now = detail::tracker_now_us();
      push(tracker_action::free_completed, p, bytes, s, owner, "", now);
      push(tracker_action::segment_free, p, bytes, s, owner, "", now);
    }

    void record_oom(std::size_t bytes, stream_ref s, tenant t) noexcept {
      {
        std::lock_guard lock(mutex);
        ++ooms;
        push(tracker_action::oom, nullptr, bytes, s, t, current_tag(), detail::tracker_now_us());
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

    detail::tracker_export_data export_data() const {
      detail::tracker_export_data d{options.registry.get(), options.device, live_copy(), events_copy(), 0};
      std::lock_guard lock(mutex);
      d.dropped_events = ring.dropped();
      return d;
    }
    void write_memory_snapshot(std::ostream& out) const {
      auto bytes = detail::tracker_write_pytorch_snapshot(export_data());
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    void write_json(std::ostream& out) const {
      auto d = export_data();
      detail::tracker_write_json(out, d, summarize(d.live, *options.registry, 16));
    }
    void write_report(std::ostream& out, std::size_t top) const {
      detail::tracker_write_report(out, summarize(live_copy(), *options.registry, top), *options.registry, top);
    }

    bool dump(const std::string& path) const {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      if (!out) return false;
      auto ends_with = [&](std::string_view ext) {
        return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
      };
      if (ends_with(".pickle") || ends_with(".pkl")) write_memory_snapshot(out);
      else if (ends_with(".json")) write_json(out);
      else if (ends_with(".csv")) detail::tracker_write_rmm_csv(out, export_data());
      else write_report(out, 10);
      return static_cast<bool>(out);
    }
  };

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
      h.name = detail::tenant_path(reg, tenant{id});
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

  [[no_unique_address]] Upstream upstream_;
  std::shared_ptr<state> state_;
};

}  // namespace vram

#include <vram/source/host_source.hpp>
static_assert(vram::resource<vram::tracker_adaptor<vram::host_source>>);

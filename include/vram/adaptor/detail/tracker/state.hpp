#pragma once
// The tracker's shared state: live allocations, frees pending on their streams, upstream
// segments (when fed by an allocator's observer hooks), the event ring, and the exporters'
// entry points. Used by tracker_adaptor
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
#include <utility>
#include <vector>

#include <vram/core/error_handler.hpp>
#include <vram/core/event.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/tag_scope.hpp>
#include <vram/core/tenant.hpp>
#include <vram/core/throw.hpp>
#include <vram/detail/biased_lock.hpp>
#include <vram/adaptor/detail/tracker/clock.hpp>
#include <vram/adaptor/detail/tracker/event_log.hpp>
#include <vram/adaptor/detail/tracker/export.hpp>
#include <vram/adaptor/detail/tracker/holders.hpp>
#include <vram/adaptor/detail/tracker/live_table.hpp>
#include <vram/adaptor/detail/tracker/pending.hpp>
#include <vram/adaptor/detail/tracker/records.hpp>
#include <vram/adaptor/detail/tracker/steps.hpp>
#include <vram/adaptor/detail/tracker/tag_table.hpp>

namespace vram::detail::tracker {

/// The records behind tracker_adaptor and tracker_observer.
///
/// What is recorded when (the PyTorch snapshot's order, per block):
///   alloc           when the block is handed out;
///   free_requested  when the caller frees it (the block leaves `live` for `pending`);
///   free_completed  when its stream has reached the free (a host-stream task; on a CUDA
///                   stream a marker polled at the next call), at once on the synchronous
///                   stream -- or, whichever comes first, when an allocation or a released
///                   segment overlaps the block: the allocator handing the memory out again
///                   is when it knows the old use is over, and PyTorch never shows an alloc
///                   inside a block whose free is still pending.
/// In adaptor mode (`own_segment`) each block is also its own segment: segment_alloc before
/// its alloc, segment_free right after its free_completed.
struct tracker_state {
  tracker_state(tracker_options o, const char* resource_name)
      : options(std::move(o)), ring(options.event_capacity), resource(resource_name) {
    if (!options.registry) throw_invalid_argument(resource, "null tenant registry");
    if (!options.event_log.empty()) log = std::make_unique<tracker_event_log>(options.event_log, *options.registry);
  }

  /// A free requested and not yet completed.
  struct pending_free {
    // A constructor, for try_emplace: nvcc's front end has no parenthesized aggregate init.
    pending_free(live_record&& b, std::uint64_t i, std::uint64_t on, bool own) noexcept
        : block(std::move(b)), id(i), stream(on), own_segment(own) {}
    live_record block;  // as it was live; block.stream is the allocating stream
    std::uint64_t id;          // tells this free from a later one at the same address
    std::uint64_t stream;      // the stream the free is ordered on
    bool own_segment;
  };

  /// What record_free_requested decided.
  struct free_ticket {
    bool accepted = false;  // false: misuse (reported) or ignored; the upstream must not be called
    std::uint64_t id = 0;   // != 0: pending until complete(address, id)
  };

  tracker_options options;
  mutable vram::detail::biased_lock mutex;  // held for a few dozen instructions per call; copies for readers
  // Invariants: live_bytes == sum of live[p].bytes;
  //             live.size() == allocations - deallocations;
  //             the ranges [a, a + bytes) of live and pending records are pairwise disjoint.
  live_table live;
  tag_table tags;  // the tags that live and pending records and ring entries name
  tracker_clock clock;  // every time recorded, read under the mutex
  std::map<std::uintptr_t, pending_free> pending;  // by address
  tracker_pending_markers markers;                 // the pending frees on CUDA streams
  std::uint64_t last_free_id = 0;
  // Observer mode: (address, bytes) of uses the allocator handed out again before their free
  // reached the observer (observers are called outside the allocator's locks); that late
  // free is then ignored. Rare, hence a vector.
  std::vector<std::pair<const void*, std::size_t>> superseded;
  tracker_ring ring;
  std::unique_ptr<tracker_event_log> log;  // options.event_log, or none
  ring_entry log_entry;                    // where a ring of capacity 0 builds what the log writes
  std::size_t live_bytes = 0;
  // The peak of live_bytes since the last step mark, and before it: one maximum to keep per
  // allocation for both the step's summary and the tracker's peak (peak_live_bytes()).
  std::size_t step_peak_live_bytes = 0, marked_peak_live_bytes = 0;
  std::size_t allocations = 0, deallocations = 0, ooms = 0;
  const char* resource;  // for misuse reports
  // Upstream segments [address, address + size) an allocator reported through its observer
  // hooks (on_grow / on_release). Empty for tracker_adaptor: each allocation is its own segment.
  std::map<std::uintptr_t, std::size_t> segments;
  step_book steps{options};  // step summaries and suspected leaks, at each mark_step

  [[nodiscard]] std::size_t peak_live_bytes() const noexcept {
    return std::max(step_peak_live_bytes, marked_peak_live_bytes);
  }

  /// The calling thread's id hashed once per thread (hashing it per event cost more than the
  /// rest of an event's record).
  [[gnu::always_inline]] static std::uint64_t thread_hash() noexcept {
    thread_local constinit std::uint64_t hash = 0;  // constant-initialized: no guard to test
    if (hash == 0) [[unlikely]]
      hash = hash_this_thread();  // again only in the unlikely case that the hash is 0
    return hash;
  }
  [[gnu::noinline]] static std::uint64_t hash_this_thread() noexcept {
    return std::hash<std::thread::id>{}(std::this_thread::get_id());
  }

  /// Records one call's events (inlined: on the allocation path the call and its ten
  /// arguments cost a tenth of a tracked pair): `a` and, as ring_entry says, the free_completed
  /// (`completed`) and the segment event (`segment`); `other` as ring_entry::other.
  [[gnu::always_inline]] void push(tracker_action a, std::uintptr_t p, std::size_t bytes, std::uint64_t stream, tenant t,
                                   const std::string* tag, std::int64_t now, bool completed = false,
                                   bool segment = false, std::uint64_t other = 0) noexcept {
    // Filled in place: a temporary would be zeroed (its tag array) and copied, per event.
    ring_entry* r = ring.push(completed, segment);
    if (r == nullptr) [[unlikely]] {
      if (!log) return;
      r = &log_entry;
      r->completed = completed;
      r->segment = segment;
    }
    r->action = a;
    r->address = p;
    r->bytes = bytes;
    r->stream = stream;
    r->time_us = now;
    r->thread = thread_hash();
    r->owner = t;
    r->tag = tag;
    r->other = other;
    if (log) [[unlikely]]
      r->expand([&](const tracker_event& x) { log->write(x); });
  }
  bool flush_log() {
    std::lock_guard lock(mutex);
    return log && log->flush();
  }
  /// flush_log() unless another thread holds the tracker (at exit: never wait on a thread
  /// that may never return).
  bool try_flush_log() {
    std::unique_lock lock(mutex, std::try_to_lock);
    return lock.owns_lock() && log && log->flush();
  }
  std::size_t log_failures() const {
    std::lock_guard lock(mutex);
    return log ? log->failures() : 0;
  }

  static std::uintptr_t address_of(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  /// Drops the tags no record names any more. Pre: mutex held.
  [[gnu::noinline]] void collect_tags() noexcept {
    tags.collect([&](auto&& used) {
      live.for_each([&](const live_record& r) { used(r.tag); });
      for (const auto& [a, f] : pending) used(f.block.tag);
      ring.for_each_entry([&](const ring_entry& e) { used(e.tag); });
    });
  }

  /// `own_segment`: the allocation is reported as a segment of its own (adaptor mode).
  /// Throws bad_alloc (no host memory for the record), having recorded nothing of `p`.
  /// Always inlined, as record_free_requested: out of line, the calls, their arguments and
  /// the registers saved around them cost a tracked pair over the pool about 3 ns of its 40
  /// (bench.adaptor_overhead, pool/tracker_adaptor).
  [[gnu::always_inline]] void record_allocate(const void* p, std::size_t bytes, stream_ref s, tenant t,
                                              bool own_segment = true) {
    if (options.capture_stacks) [[unlikely]]
      record_allocate_with_stack(p, bytes, s, t, own_segment);
    else
      record_allocate(p, bytes, s, t, own_segment, nullptr);
  }
  /// With the caller's native call stack (options.max_frames at most), taken before the lock.
  [[gnu::noinline]] void record_allocate_with_stack(const void* p, std::size_t bytes, stream_ref s, tenant t,
                                                    bool own_segment) {
    std::vector<void*> frames;
#if VRAM_TRACKER_HAS_BACKTRACE
    frames.resize(options.max_frames);
    int n = backtrace(frames.data(), static_cast<int>(frames.size()));
    frames.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
#endif
    record_allocate(p, bytes, s, t, own_segment, &frames);
  }
  /// record_allocate with the caller's stack (`frames`, taken by the record), or none: the
  /// path without stacks has no vector to construct and destroy.
  [[gnu::always_inline]] void record_allocate(const void* p, std::size_t bytes, stream_ref s, tenant t, bool own_segment,
                                              std::vector<void*>* frames) {
    const std::uint64_t ticks = clock.ticks();  // outside the lock (see tracker_clock::ticks)
    vram::detail::biased_guard lock(mutex);
    poll_locked();
    const std::int64_t now = clock.at(ticks);
    const std::string* tag = tags.current([&] { collect_tags(); });  // throws bad_alloc having kept nothing new
    auto [record, added] = live.find_or_insert(p);  // throws bad_alloc having changed nothing
    live_record& r = *record;
    if (!added) {
      if (own_segment) return;  // an upstream handing out a live pointer twice: keep the first record
      // The allocator handed p out again before the old use's free reached us: the old use
      // ends here, and its record takes the new one.
      superseded.emplace_back(p, r.bytes);
      push(tracker_action::free_requested, address_of(p), r.bytes, r.stream, r.owner, r.tag, now, true);
      live_bytes -= r.bytes;
      ++deallocations;
      r.frames.clear();
    }
    complete_overlapping_locked(address_of(p), bytes, now);
    r.tag = tag;
    r.bytes = bytes;
    r.owner = t;
    r.stream = s.key();
    r.time_us = now;
    if (frames != nullptr) [[unlikely]]
      r.frames = std::move(*frames);  // a free slot's frames are empty
    live_bytes += bytes;
    step_peak_live_bytes = std::max(step_peak_live_bytes, live_bytes);
    ++allocations;
    push(tracker_action::alloc, address_of(p), bytes, r.stream, t, r.tag, now, false, own_segment);
  }

  /// Records free_requested and moves the record to `pending`. `report`: report misuse
  /// (adaptor mode); an observer leaves that to the allocator.
  [[gnu::always_inline]] free_ticket record_free_requested(const void* p, std::size_t bytes, stream_ref s,
                                                           bool report = true, bool own_segment = true) noexcept {
    const std::uint64_t ticks = clock.ticks();  // outside the lock (see tracker_clock::ticks)
    vram::detail::biased_guard lock(mutex);
    poll_locked();
    if (!report) {
      auto late = std::find(superseded.begin(), superseded.end(), std::pair<const void*, std::size_t>(p, bytes));
      if (late != superseded.end()) {  // recorded already, when p was handed out again
        superseded.erase(late);
        return {};
      }
    }
    const std::size_t bucket = live.bucket_of(p);
    if (bucket == live_table::npos) {
      if (report) report_misuse({misuse::foreign_pointer, resource, p, bytes, 0});
      return {};
    }
    live_record* it = &live.record(bucket);
    if (it->bytes != bytes) {
      if (report) report_misuse({misuse::wrong_size, resource, p, bytes, it->bytes});
      return {};
    }
    const std::int64_t now = clock.at(ticks);
    const live_record* a = it;  // the record, in `live` or moved to `pending`
    live_bytes -= bytes;
    ++deallocations;
    free_ticket ticket{true, 0};
    if (!s.is_synchronous()) {
      try {  // try_emplace moves the record only once the node is allocated
        auto [at, added] = pending.try_emplace(address_of(p), std::move(*it), last_free_id + 1, s.key(), own_segment);
        if (added) {
          a = &at->second.block;
          ticket.id = ++last_free_id;
        }
      } catch (...) {  // no host memory to keep it pending: complete it now
      }
    }
    // Completed now (ticket.id == 0): free_requested, free_completed and segment_free in one entry.
    const bool completed = ticket.id == 0;
    push(tracker_action::free_requested, address_of(p), bytes, s.key(), a->owner, a->tag, now, completed,
         completed && own_segment, a->stream);
    live.erase_bucket(bucket);
    return ticket;
  }

  /// Arranges free_completed for `ticket` once `s` reaches the free, without blocking:
  /// a task on a host stream, a polled marker on a CUDA stream (at once while the stream is
  /// captured into a graph, whose work runs only at launch). `self` keeps the records alive
  /// for the task. Where that cannot be arranged, the free is completed now.
  void complete_after(const std::shared_ptr<tracker_state>& self, stream_ref s, const void* p,
                      free_ticket ticket) noexcept {
    if (ticket.id == 0) return;
    auto a = address_of(p);
    if (s.is_host()) {
      try {
        s.host().enqueue([self, a, id = ticket.id] { self->complete(a, id); });
        return;
      } catch (...) {  // no memory for the task
      }
    } else if (s.is_cuda()) {
#if VRAM_HAS_CUDA
      if (!cuda_stream_capturing(s.cuda())) {
        std::lock_guard lock(mutex);
        try {
          markers.add(s, a, ticket.id);
          return;
        } catch (...) {  // the event call failed: the stream is broken, its work runs no more
        }
      }
#endif
    }
    complete(a, ticket.id);
  }

  /// Records free_completed of the free `id` at `a`, unless an allocation completed it first.
  void complete(std::uintptr_t a, std::uint64_t id) noexcept {
    std::lock_guard lock(mutex);
    complete_locked(a, id, clock.now_us());
  }

  /// Looks at the markers of pending frees on CUDA streams (never waits). Pre: mutex held.
  void poll_locked() noexcept {
    if (markers.size() == 0) return;
    auto now = clock.now_us();
    markers.poll([&](std::uintptr_t a, std::uint64_t id) { complete_locked(a, id, now); });
  }

  void complete_locked(std::uintptr_t a, std::uint64_t id, std::int64_t now) noexcept {
    auto it = pending.find(a);
    if (it == pending.end() || it->second.id != id) return;  // completed already
    finish(a, it->second.block, it->second.stream, it->second.own_segment, now);
    pending.erase(it);
  }

  /// Completes every pending free overlapping [a, a + bytes). Pre: mutex held.
  void complete_overlapping_locked(std::uintptr_t a, std::size_t bytes, std::int64_t now) noexcept {
    // Pending ranges are disjoint, so in address order their ends ascend too: the overlapping
    // ones are those just below a + bytes whose end lies above a.
    if (pending.empty()) return;
    auto it = pending.lower_bound(a + bytes);
    while (it != pending.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.block.bytes <= a) break;
      finish(prev->first, prev->second.block, prev->second.stream, prev->second.own_segment, now);
      pending.erase(prev);
    }
  }

  void finish(std::uintptr_t a, const live_record& b, std::uint64_t stream, bool own_segment,
              std::int64_t now) noexcept {
    push(tracker_action::free_completed, a, b.bytes, stream, b.owner, b.tag, now, false, own_segment, b.stream);
  }

  /// An allocator took [p, p + bytes) from its upstream (grow) or gave it back (release).
  void record_segment(const void* p, std::size_t bytes, bool grow) noexcept {
    std::lock_guard lock(mutex);
    poll_locked();
    auto a = address_of(p);
    auto now = clock.now_us();
    if (!grow) complete_overlapping_locked(a, bytes, now);  // memory going back upstream is free
    try {
      if (grow) segments[a] = bytes;
      else segments.erase(a);
    } catch (...) {  // out of host memory for the map: the segment goes unrecorded
    }
    push(grow ? tracker_action::segment_alloc : tracker_action::segment_free, a, bytes, 0, tenant{}, nullptr, now);
  }

  /// `device_free`: the bytes the failing allocator had free (written as PyTorch's device_free).
  void record_oom(std::size_t bytes, stream_ref s, tenant t, std::size_t device_free) noexcept {
    {
      std::lock_guard lock(mutex);
      poll_locked();
      ++ooms;
      const std::string* tag = nullptr;
      try {
        tag = tags.current([&] { collect_tags(); });
      } catch (...) {  // no host memory for the tag's copy: the oom is recorded untagged
      }
      push(tracker_action::oom, 0, bytes, s.key(), t, tag, clock.now_us(), false, false, device_free);
    }
    if (!options.oom_dump_path.empty()) {
      try {
        (void)dump(options.oom_dump_path);
      } catch (...) {  // a failed dump must not replace the out_of_memory being thrown
      }
    }
  }

  /// Attaches to `e` the tenants and tags holding the most live bytes now. Without host memory
  /// for the summary `e` stays as it was: the error being thrown must not become another.
  void attach_holders(out_of_memory& e) noexcept {
    try {
      tracker_snapshot now = summarize(live_copy(), *options.registry, 0);
      e.attach_holders(top_holders(now.by_tenant, now.by_tag));
    } catch (...) {
    }
  }

  // The readers poll first, so a snapshot shows every completion the streams have reached.
  /// Closes a step (see step_book); `reserved`: the upstream's reserved bytes now.
  step_summary mark_step(std::size_t reserved) {
    std::vector<tracked_allocation> v = live_copy();
    tracker_snapshot now = summarize(v, *options.registry, 0);
    std::lock_guard lock(mutex);
    const step_summary& s = steps.mark(now, v, reserved, std::max(step_peak_live_bytes, now.live_bytes), allocations,
                                       clock.now_us(), [&](tenant t) { return tenant_path(*options.registry, t); });
    marked_peak_live_bytes = peak_live_bytes();
    step_peak_live_bytes = live_bytes;
    return s;
  }
  std::vector<step_summary> steps_copy() const {
    std::lock_guard lock(mutex);
    return {steps.steps().begin(), steps.steps().end()};
  }
  std::vector<leak_report> leaks_copy() const {
    std::lock_guard lock(mutex);
    return steps.leaks();
  }

  std::vector<tracked_allocation> live_copy() {
    std::vector<tracked_allocation> v;
    {
      std::lock_guard lock(mutex);
      poll_locked();
      v.reserve(live.size());
      live.for_each([&](const live_record& a) { v.push_back(a.copy()); });
    }
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.address < b.address; });
    return v;
  }
  std::vector<tracker_event> events_copy() {
    std::vector<tracker_event> v;
    std::lock_guard lock(mutex);
    poll_locked();
    v.reserve(ring.size());
    ring.for_each([&](const tracker_event& e) { v.push_back(e); });
    return v;
  }
  std::size_t pending_frees() {
    std::lock_guard lock(mutex);
    poll_locked();
    return pending.size();
  }

  /// One consistent copy (one lock): the final state and the history must agree, as the
  /// viewer replays the history backwards from the final segments.
  tracker_export_data export_data() {
    tracker_export_data d{options.registry.get(), options.device, {}, {}, {}, 0, {}};
    {
      std::lock_guard lock(mutex);
      poll_locked();
      d.live.reserve(live.size());
      live.for_each([&](const live_record& a) { d.live.push_back(a.copy()); });
      d.pending.reserve(pending.size());
      for (auto& [p, f] : pending) d.pending.push_back(f.block.copy());  // address order already
      d.events.reserve(ring.size());
      ring.for_each([&](const tracker_event& e) { d.events.push_back(e); });
      d.dropped_events = ring.dropped();
      d.segments.assign(segments.begin(), segments.end());
    }
    std::sort(d.live.begin(), d.live.end(), [](auto& a, auto& b) { return a.address < b.address; });
    return d;
  }
  void write_memory_snapshot(std::ostream& out) {
    auto bytes = tracker_write_pytorch_snapshot(export_data());
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  void write_json(std::ostream& out) {
    auto d = export_data();
    tracker_write_json(out, d, summarize(d.live, *options.registry, 16));
  }
  void write_report(std::ostream& out, std::size_t top) {
    tracker_write_report(out, summarize(live_copy(), *options.registry, top), *options.registry, top);
    for (const leak_report& l : leaks_copy())
      out << "suspected leak: " << (l.what == leak_report::kind::tenant ? "tenant '" : "tag '") << l.name << "' grew from "
          << l.from_bytes << " to " << l.to_bytes << " bytes over " << l.steps << " step marks (since step "
          << l.first_step << ")\n";
  }

  bool dump(const std::string& path) {
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
  if (top == 0) return s;  // no copy of every record for an empty list
  s.largest = live;
  std::sort(s.largest.begin(), s.largest.end(), [](auto& a, auto& b) { return a.bytes > b.bytes; });
  if (s.largest.size() > top) s.largest.resize(top);
  return s;
}
};

}  // namespace vram::detail::tracker

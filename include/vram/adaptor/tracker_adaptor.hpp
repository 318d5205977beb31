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
#include <vram/core/throw.hpp>
#include <vram/adaptor/detail/adaptor_base.hpp>
#include <vram/adaptor/detail/tracker/export.hpp>
#include <vram/adaptor/detail/tracker/records.hpp>
#include <vram/adaptor/detail/tracker/state.hpp>

namespace vram {


/// Records who holds memory, for debugging and for production dumps.
///
/// Per live allocation: tenant (explicit argument, else vram::current_tenant()), tag
/// (vram::current_tag()), stream, requested size, time, and with capture_stacks a call stack.
/// Events (alloc, free_requested, free_completed, segment_alloc, segment_free, oom) go to a
/// bounded ring. Every allocation is reported as its own segment: the tracker sees the
/// upstream's allocations, not a pool's internal segments.
/// Thread safety: thread-safe; one spin lock guards the records, held for a few dozen
/// instructions per call (readers copy under it; use statistics_adaptor for a counter that
/// threads do not share).
/// Streams: nothing here blocks the calling thread. deallocate(s, ...) records
/// free_requested at once and free_completed when the stream reaches the free: at once on
/// the synchronous stream, by a task on a host stream, and on a CUDA stream by an event
/// recorded at the free and polled (cudaEventQuery, never waited for) at the tracker's next
/// call and at snapshot time -- or earlier, when the upstream hands an overlapping block out
/// again (then the old use is over). Until then the block shows as active_pending_free.
/// Alignment: that of the upstream. Upstream: held by value; copies share the records.
/// Misuse: freeing a pointer not live here, or with another size, is reported and changes
/// nothing (the upstream is not called).
/// OOM: an out_of_memory from the upstream is recorded (oom event), dumped to
/// oom_dump_path when set, given the top tenants and tags by live bytes (holders(), the last
/// line of explain()), and rethrown: the same object, so its type and numbers are kept.
/// Capabilities: owns() from its records; release, try_allocate and the upstream's
/// check_invariants pass through (adaptor_base); stats() adds the upstream's.
/// Complexity: O(1) expected per operation (an open-addressing table); snapshot() O(n log n).
template <class Upstream>
class tracker_adaptor : public detail::adaptor::adaptor_base<tracker_adaptor<Upstream>, Upstream> {
  using base = detail::adaptor::adaptor_base<tracker_adaptor<Upstream>, Upstream>;
  using base::upstream_;

 public:
  explicit tracker_adaptor(Upstream upstream = Upstream{}, tracker_options options = {})
      : base(std::move(upstream)), state_(std::make_shared<detail::tracker::tracker_state>(std::move(options), name())) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "tracker_adaptor"; }

  // Always inlined, as statistics_adaptor's are: the upstream's inline path stays in the caller.
  [[gnu::always_inline]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(s, bytes, align, current_tenant());
  }
  /// Allocates for tenant `t` (overriding the current tenant_scope).
  [[gnu::always_inline]] void* allocate(stream_ref s, std::size_t bytes, std::size_t align, tenant t) {
    void* p;
    try {
      p = upstream_.allocate(s, bytes, align);
    } catch (out_of_memory& e) {  // by reference, rethrown as it is: a quota_exceeded stays one
      state_->record_oom(bytes, s, t, e.stats().free_bytes);
      state_->attach_holders(e);
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

  /// Records free_requested, frees upstream, and arranges free_completed for when `s` reaches
  /// the free: never blocks the calling thread (see the class comment).
  [[gnu::always_inline]] void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    auto ticket = state_->record_free_requested(p, bytes, s);
    if (!ticket.accepted) return;
    upstream_.deallocate(s, p, bytes, align);
    if (ticket.id != 0) state_->complete_after(state_, s, p, ticket);  // else completed already
  }

  [[gnu::always_inline]] void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align, current_tenant());
  }
  [[gnu::always_inline]] void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate(stream_ref{}, p, bytes, align);
  }

  /// Who holds memory now, grouped by tenant and by tag, largest first; `largest` holds up to
  /// `top` allocations.
  [[nodiscard]] tracker_snapshot snapshot(std::size_t top = 16) const {
    return detail::tracker::tracker_state::summarize(state_->live_copy(), *state_->options.registry, top);
  }

  /// Live allocations in address order.
  [[nodiscard]] std::vector<tracked_allocation> live_allocations() const { return state_->live_copy(); }
  /// The event history, oldest first (at most options.event_capacity events).
  [[nodiscard]] std::vector<tracker_event> events() const { return state_->events_copy(); }
  /// Frees requested whose completion is not recorded yet (their streams have not reached them).
  [[nodiscard]] std::size_t pending_frees() const { return state_->pending_frees(); }
  /// Events that fell out of the ring. O(options.event_capacity): the ring counts them for
  /// readers, not at each push.
  [[nodiscard]] std::size_t dropped_events() const {
    std::lock_guard lock(state_->mutex);
    return state_->ring.dropped();
  }

  /// Closes a step (a training or serving iteration): its summary — peak live during it,
  /// live and reserved at the mark, allocations, live bytes by tenant and tag — and leak
  /// detection: a tenant or tag whose live bytes at the mark reach a new high at
  /// options.leak_steps consecutive marks, by options.leak_min_bytes or more, is reported by
  /// leaks() with its largest allocations since the growth began (tags, and stacks when
  /// captured). O(live allocations) per mark.
  step_summary mark_step() {
    std::size_t reserved = 0;
    if constexpr (has_stats<Upstream>) reserved = upstream_.stats().reserved_bytes;
    return state_->mark_step(reserved);
  }
  /// The step summaries, oldest first (at most options.step_capacity).
  [[nodiscard]] std::vector<step_summary> steps() const { return state_->steps_copy(); }
  /// Suspected leaks as of the last mark, largest growth first; empty when none.
  [[nodiscard]] std::vector<leak_report> leaks() const { return state_->leaks_copy(); }

  /// Writes the event log's buffer (tracker_options::event_log) to its file; false when some
  /// event could not be written (event_log_failures()), or there is no log.
  bool flush_event_log() { return state_->flush_log(); }
  /// flush_event_log() unless another thread is inside the tracker: false then (for exit
  /// handlers, which must not wait on threads that may never return).
  bool try_flush_event_log() { return state_->try_flush_log(); }
  /// Events the event log could not write (a full disk, ...).
  [[nodiscard]] std::size_t event_log_failures() const { return state_->log_failures(); }

  /// PyTorch memory snapshot pickle (opens in pytorch.org/memory_viz).
  void write_memory_snapshot(std::ostream& out) const { state_->write_memory_snapshot(out); }
  /// RMM CSV log of the event history, with a Tenant column.
  void write_csv(std::ostream& out) const { detail::tracker::tracker_write_rmm_csv(out, state_->export_data()); }
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
    s.peak_requested_bytes = state_->peak_live_bytes();
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

  /// True when `p` is live through this adaptor (from its records, whatever the upstream has).
  [[nodiscard]] bool owns(const void* p) const {
    std::lock_guard lock(state_->mutex);
    return state_->live.contains(p);
  }

  /// Verifies its own records, then the upstream's: the records agree with the counters.
  void check_invariants() const {
#if VRAM_DEBUG
    std::lock_guard lock(state_->mutex);
    std::size_t sum = 0;
    state_->live.for_each([&](const detail::tracker::live_record& a) { sum += a.bytes; });
    if (sum != state_->live_bytes) throw std::logic_error("tracker_adaptor: live bytes != sum of records");
    if (state_->live.size() != state_->allocations - state_->deallocations)
      throw std::logic_error("tracker_adaptor: live records != allocations - deallocations");
#endif
    this->check_upstream_invariants();
  }

  [[nodiscard]] const tracker_options& options() const noexcept { return state_->options; }

  friend bool operator==(const tracker_adaptor& a, const tracker_adaptor& b) {
    return a.state_ == b.state_ && a.upstream_ == b.upstream_;
  }

 private:
  std::shared_ptr<detail::tracker::tracker_state> state_;
};

}  // namespace vram

#include <vram/source/host_source.hpp>
static_assert(vram::resource<vram::tracker_adaptor<vram::host_source>>);

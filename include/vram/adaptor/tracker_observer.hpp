#pragma once
// vram::tracker_observer: the tracker fed by an allocator's observer hooks, so the PyTorch
// snapshot shows the allocator's real segments (what it took from its upstream) with the
// blocks inside them, and the history includes segment_alloc / segment_free from growth and
// release — what pytorch.org/memory_viz needs to show fragmentation.

#include <cstddef>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <vram/core/observer.hpp>
#include <vram/core/tenant.hpp>
#include <vram/adaptor/detail/tracker/state.hpp>

namespace vram {

/// Records who holds memory inside an allocator:
///   vram::tracker_observer tracker({.registry = reg});
///   vram::stream_pool<vram::cuda_device_source, vram::tracker_observer> pool(src, {}, tracker);
///   ... tracker.dump("snapshot.pickle");
/// Copies share the records (keep one to read them). Allocations get the tenant and tag in
/// scope on the allocating thread. A free records free_requested at once and free_completed
/// when its stream reaches it (as tracker_adaptor: never blocking), or earlier when the
/// allocator hands an overlapping block out again or releases its segment: the allocator
/// decides when memory is reusable, and the snapshot keeps PyTorch's order per block.
/// Observers are called outside the allocator's locks, so a free may reach us after the
/// allocator handed the block out again: the old use is then recorded as freed at that
/// allocation, and its late free is ignored.
/// Misuse is the allocator's to report: unknown pointers are ignored here.
/// Thread safety: thread-safe (one spin lock). Cost: as tracker_adaptor, on the allocator's path.
/// OOM: recorded as an oom event, and dumped to options.oom_dump_path when set.
class tracker_observer {
 public:
  explicit tracker_observer(tracker_options options = {})
      : state_(std::make_shared<detail::tracker::tracker_state>(std::move(options), name())) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "tracker_observer"; }

  void on_allocate(const void* p, std::size_t bytes, stream_ref s) noexcept {
    try {
      state_->record_allocate(p, bytes, s, current_tenant(), false);
    } catch (...) {  // out of host memory for the record: the allocation goes untracked
    }
  }
  void on_deallocate(const void* p, std::size_t bytes, stream_ref s) noexcept {
    auto ticket = state_->record_free_requested(p, bytes, s, false, false);
    state_->complete_after(state_, s, p, ticket);
  }
  void on_grow(const void* p, std::size_t bytes) noexcept { state_->record_segment(p, bytes, true); }
  void on_release(const void* p, std::size_t bytes) noexcept { state_->record_segment(p, bytes, false); }
  void on_out_of_memory(std::size_t bytes, stream_ref s, const vram::stats& st) noexcept {
    state_->record_oom(bytes, s, current_tenant(), st.free_bytes);
  }

  [[nodiscard]] tracker_snapshot snapshot(std::size_t top = 16) const {
    return detail::tracker::tracker_state::summarize(state_->live_copy(), *state_->options.registry, top);
  }
  [[nodiscard]] std::vector<tracked_allocation> live_allocations() const { return state_->live_copy(); }
  [[nodiscard]] std::vector<tracker_event> events() const { return state_->events_copy(); }
  /// Frees requested whose completion is not recorded yet.
  [[nodiscard]] std::size_t pending_frees() const { return state_->pending_frees(); }
  void write_memory_snapshot(std::ostream& out) const { state_->write_memory_snapshot(out); }
  void write_csv(std::ostream& out) const { detail::tracker::tracker_write_rmm_csv(out, state_->export_data()); }
  void write_json(std::ostream& out) const { state_->write_json(out); }
  void write_report(std::ostream& out, std::size_t top = 10) const { state_->write_report(out, top); }
  bool dump(const std::string& path) const { return state_->dump(path); }
  /// As tracker_adaptor's: the event log (tracker_options::event_log) written out.
  bool flush_event_log() { return state_->flush_log(); }
  [[nodiscard]] std::size_t event_log_failures() const { return state_->log_failures(); }

 private:
  std::shared_ptr<detail::tracker::tracker_state> state_;
};

static_assert(observer<tracker_observer>);

}  // namespace vram

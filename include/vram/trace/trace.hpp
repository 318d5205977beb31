#pragma once
// vram::trace::trace: an allocation trace, the common model every reader produces and the
// replay engine consumes.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace vram::trace {

/// One step of a trace. Allocations are named by `id` (readers map recorded addresses to ids,
/// since addresses are reused); a free names the id it ends.
struct event {
  enum class op : std::uint8_t { alloc, free };
  op kind = op::alloc;
  std::uint16_t tenant = 0;  ///< index into trace::tenants (0 where the trace names none)
  std::uint32_t stream = 0;  ///< dense stream index, 0 .. trace::streams - 1
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;   ///< for frees: the size of the allocation being freed
  std::int64_t time_ns = 0;  ///< recorded time (or logical step), 0 where unknown
};

/// The reserved bytes the recording allocator held after event `event_index`.
struct reserved_sample {
  std::size_t event_index = 0;
  std::uint64_t reserved_bytes = 0;
};

/// The events of a trace too large to hold: each call reads them again from their file, in
/// order, and calls `each` on every one (vram/trace/read_trace_stream.hpp).
using event_feed = std::function<void(const std::function<void(const event&)>& each)>;

/// What a first reading of a streamed trace counted: its events are read again at each replay.
struct streamed_window {
  event_feed feed;               ///< the window's events (after trace::events)
  std::size_t events = 0, allocs = 0, frees = 0;
  std::uint64_t peak_live = 0;   ///< of the whole trace, the blocks live at the start included
};

/// An allocation trace: held in memory (`events`), or streamed from its file (`streamed`:
/// then `events` holds only the blocks live at the start, and memory is bounded by the blocks
/// live at once, not by the events). Consumers that must work on both read events through
/// for_each_event() and size().
///
/// Invariants (checked by `check()` in tests):
///   events[0 .. initial_live) are allocs of blocks already live when recording began
///   every free names an id allocated earlier and not yet freed; ids are allocated once
///   every event.stream < streams
struct trace {
  std::string name;    ///< file name or workload name
  std::string format;  ///< "pytorch-snapshot", "kineto", "rmm-csv", "lifetime-csv", "vram-trace", "generated"
  std::vector<event> events;
  std::optional<streamed_window> streamed;  ///< set for a streamed trace: the rest of the events
  std::size_t initial_live = 0;  ///< leading allocs that were live before the window
  /// Where the trace is a repeated step (repeat_steps.hpp): the first event of each step.
  /// The replay marks each boundary (mark_step) and measures the steps apart.
  std::vector<std::size_t> step_starts;
  std::uint32_t streams = 1;
  /// The tenants the trace names (an RMM log's Tenant column), by event::tenant; empty where
  /// it names none. Index 0 is the tenant of the allocations it does not attribute ("").
  std::vector<std::string> tenants;
  /// What the recording allocator held (PyTorch segment_alloc / Kineto "Total Reserved").
  std::vector<reserved_sample> recorded_reserved;
  std::optional<std::uint64_t> recorded_peak_reserved;
  /// Inconsistencies the reader tolerated (frees of unknown addresses, ...), counted.
  std::size_t warnings = 0;
  std::vector<std::string> warning_examples;  ///< the first few, for the report

  [[nodiscard]] std::size_t allocs() const noexcept {
    return count(event::op::alloc) - initial_live + (streamed ? streamed->allocs : 0);
  }
  [[nodiscard]] std::size_t frees() const noexcept { return count(event::op::free) + (streamed ? streamed->frees : 0); }
  /// Every event, those live at the start included.
  [[nodiscard]] std::size_t size() const noexcept { return events.size() + (streamed ? streamed->events : 0); }

  /// Calls f(const event&) on every event in order (a streamed trace's read again from its file).
  template <class F>
  void for_each_event(F&& f) const {
    for (const event& e : events) f(e);
    if (streamed) streamed->feed(std::function<void(const event&)>(std::ref(f)));
  }

  /// Peak of the sum of live requested bytes, computed directly from the events.
  [[nodiscard]] std::uint64_t peak_live_bytes() const noexcept {
    if (streamed) return streamed->peak_live;
    std::uint64_t live = 0, peak = 0;
    for (const auto& e : events) {
      if (e.kind == event::op::alloc) {
        live += e.bytes;
        if (live > peak) peak = live;
      } else {
        live -= e.bytes;
      }
    }
    return peak;
  }

  void warn(std::string message) {
    ++warnings;
    if (warning_examples.size() < 5) warning_examples.push_back(std::move(message));
  }

 private:
  [[nodiscard]] std::size_t count(event::op k) const noexcept {
    std::size_t n = 0;
    for (const auto& e : events) n += e.kind == k;
    return n;
  }
};

/// A trace that cannot be read; what() names the file and, where it applies, the byte offset.
class trace_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Sizes beyond this are taken as corrupt (no device has 2^48 bytes).
inline constexpr std::uint64_t max_trace_bytes = std::uint64_t{1} << 48;

}  // namespace vram::trace

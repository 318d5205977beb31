#pragma once
// What a tracker (tracker_adaptor, tracker_observer) records and hands out: its options, the
// events of its history, the live allocations, and the snapshot that holds them.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <vram/core/tenant.hpp>

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
  /// Leak detection at step marks (mark_step): a tenant or tag is a suspected leak when its
  /// live bytes at step end reach a new high at `leak_steps` consecutive marks, having grown by
  /// at least `leak_min_bytes` over them.
  std::size_t leak_steps = 8;
  std::size_t leak_min_bytes = std::size_t{1} << 20;
  /// Step summaries kept (the newest win).
  std::size_t step_capacity = 1024;
  /// Also append every event, as it is recorded, to this file (created or truncated): RMM's
  /// CSV log with the Tenant column, as write_csv() writes the ring, through a 1 MiB buffer
  /// (flush_event_log()). A history of any length, in bounded memory; vram-replay replays it
  /// as a stream. Empty: none. The tracker's constructor throws std::system_error naming the
  /// file when it cannot be created.
  std::string event_log;
};

/// What the tracker records per event (the PyTorch snapshot's device_traces actions).
enum class tracker_action : std::uint8_t { alloc, free_requested, free_completed, segment_alloc, segment_free, oom };

[[nodiscard]] constexpr const char* to_string(tracker_action a) noexcept {
  switch (a) {
    case tracker_action::alloc: return "alloc";
    case tracker_action::free_requested: return "free_requested";
    case tracker_action::free_completed: return "free_completed";
    case tracker_action::segment_alloc: return "segment_alloc";
    case tracker_action::segment_free: return "segment_free";
    case tracker_action::oom: return "oom";
  }
  return "?";
}

/// Longest tag kept per event (tags of live allocations are kept whole).
inline constexpr std::size_t max_event_tag = 31;

/// One entry of the event history. Per address the history reads alloc -> free_requested ->
/// free_completed, with no other alloc overlapping the block in between (PyTorch's order).
struct tracker_event {
  tracker_action action;
  std::uint64_t address;    ///< 0 for oom
  std::size_t bytes;        ///< requested bytes
  std::uint64_t stream;     ///< stream_ref::key()
  std::int64_t time_us;     ///< microseconds since the Unix epoch
  std::uint64_t thread;     ///< hash of the calling thread's id
  tenant owner;
  std::uint64_t device_free = 0;  ///< oom only: bytes the failing allocator had free (reserved, not live)
  std::array<char, max_event_tag + 1> tag{};

  void set_tag(std::string_view t) noexcept {
    std::size_t n = t.size() < max_event_tag ? t.size() : max_event_tag;
    std::memcpy(tag.data(), t.data(), n);
    tag[n] = '\0';
  }
};

/// One live allocation.
struct tracked_allocation {
  const void* address;
  std::size_t bytes;
  tenant owner;
  std::string tag;
  std::uint64_t stream;
  std::int64_t time_us;
  std::vector<void*> frames;  ///< native return addresses, innermost first (empty unless enabled)
};

/// Bytes held by one tenant or tag.
struct tracker_holder {
  std::string name;  ///< tenant path ("job/model_a") or tag ("" = untagged)
  std::size_t bytes = 0;
  std::size_t allocations = 0;
};

/// "Who holds VRAM": live allocations grouped by tenant and by tag, largest first.
struct tracker_snapshot {
  std::size_t live_bytes = 0;
  std::size_t live_allocations = 0;
  std::vector<tracker_holder> by_tenant;  ///< each tenant's own allocations (not its children's)
  std::vector<tracker_holder> by_tag;
  std::vector<tracked_allocation> largest;  ///< the largest live allocations, largest first
};

/// One step, as mark_step() closed it.
struct step_summary {
  std::size_t step = 0;         ///< 1 for the first mark
  std::size_t peak_live = 0;    ///< the tracker's live bytes at their highest during the step
  std::size_t live_at_end = 0;  ///< live bytes at the mark
  std::size_t reserved = 0;     ///< the upstream's reserved bytes at the mark (0 when it has no stats)
  std::size_t allocations = 0;  ///< allocations during the step
  std::vector<tracker_holder> by_tenant;  ///< live at the mark, largest first
  std::vector<tracker_holder> by_tag;
};

/// A tenant or tag whose live bytes grow step after step.
struct leak_report {
  enum class kind : std::uint8_t { tenant, tag } what = kind::tenant;
  std::string name;           ///< tenant path, or tag ("" = untagged)
  std::size_t steps = 0;      ///< consecutive marks at a new high
  std::size_t first_step = 0; ///< the mark the growth started from
  std::size_t from_bytes = 0; ///< live at that mark
  std::size_t to_bytes = 0;   ///< live at the last mark
  /// Its largest live allocations made since the growth began: their tags and, when
  /// captured, stacks say where the bytes come from.
  std::vector<tracked_allocation> sites;
};

}  // namespace vram

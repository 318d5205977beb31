#pragma once
// The tracker's bounded ring of events and its clock. The types it hands out are public, in
// vram/adaptor/tracker_snapshot.hpp.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <vram/adaptor/tracker_snapshot.hpp>
#include <vram/core/tenant.hpp>

namespace vram {

namespace detail::tracker {

[[nodiscard]] inline std::int64_t tracker_now_us() noexcept {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

/// One call's events, recorded as one entry of the ring and expanded when read: an
/// allocation that is its own segment is segment_alloc + alloc; a free completed at once is
/// free_requested + free_completed (+ segment_free); a completion, free_completed (+
/// segment_free). One entry per call instead of up to three events, and one cache line per
/// entry (the tag a pointer to the tracker's one copy of it, not a string), is what keeps the
/// ring's writes a small part of a tracked allocate + free (docs/observability.md, the
/// tracker's cost).
struct alignas(64) ring_entry {
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stream = 0;
  std::int64_t time_us = 0;
  std::uint64_t thread = 0;
  std::uint64_t other = 0;          // a free's segment_free stream (the block's allocating stream);
                                    // an oom's device_free
  const std::string* tag = nullptr;  // the tracker's tag_table copy; nullptr: untagged
  tenant owner;
  tracker_action action = tracker_action::alloc;  // the first event's
  bool completed = false;  // free_requested: free_completed follows, on `stream`
  bool segment = false;    // alloc: segment_alloc precedes; a free: segment_free follows
                           // (a free_requested has it only with `completed`)

  [[nodiscard]] std::size_t count() const noexcept { return 1 + std::size_t{completed} + std::size_t{segment}; }

  /// The first event.
  [[nodiscard]] tracker_event first() const noexcept {
    tracker_event e{action, address, bytes, stream, time_us, thread, owner, 0, {}};
    if (action == tracker_action::oom) e.device_free = other;
    if (tag != nullptr) e.set_tag(*tag);
    return e;
  }

  /// Calls f(const tracker_event&) on each of its events, in order.
  template <class F>
  void expand(F&& f) const {
    tracker_event e = first();
    if (e.action == tracker_action::alloc && segment) {
      e.action = tracker_action::segment_alloc;
      f(std::as_const(e));
      e.action = tracker_action::alloc;
      f(std::as_const(e));
      return;
    }
    f(std::as_const(e));
    if (completed) {
      e.action = tracker_action::free_completed;
      f(std::as_const(e));
    }
    if (segment && e.action == tracker_action::free_completed) {
      e.action = tracker_action::segment_free;
      e.stream = other;
      f(std::as_const(e));
    }
  }
};
static_assert(sizeof(ring_entry) == 64, "a ring entry is one cache line");

/// A bounded ring of events: keeps the newest `capacity` events; `dropped()` counts the rest.
/// It stores the newest `capacity` entries, which hold at least as many events (and perhaps
/// some older ones, which for_each skips). A push writes its entry and the write position,
/// and reads no other line of the ring: what the readers need beyond that (events stored,
/// dropped) they count from the stored entries, O(capacity). Invariant: entries_[0, next_)
/// are stored, and all of them once `full_`.
class tracker_ring {
 public:
  explicit tracker_ring(std::size_t capacity) : entries_(capacity) {}

  /// The entry of a new call's events, for the caller to fill in place but for `completed`
  /// and `segment`, set here (they fix its count); nullptr for a ring of capacity 0 (its
  /// events count as dropped). Always inlined, as is tracker_clock::at: on the allocation
  /// path, where GCC left them out of line once the pool's bin path was inlined there too,
  /// each call cost a tracked pair about 1 ns.
  [[gnu::always_inline]] ring_entry* push(bool completed, bool segment) noexcept {
    pushed_ += 1 + std::size_t{completed} + std::size_t{segment};
    if (capacity_ == 0) return nullptr;
    ring_entry* e = &entries_[next_];
    if (++next_ == capacity_) [[unlikely]] {
      next_ = 0;
      full_ = true;
    }
    // The next push writes there: ask for its lines now, so the stores of that push do not
    // wait for them.
    prefetch_for_write(&entries_[next_]);
    e->completed = completed;
    e->segment = segment;
    return e;
  }

  /// Calls f(const tracker_event&) on each kept event, oldest first.
  template <class F>
  void for_each(F&& f) const {
    std::size_t skip = stored_events() - size();
    const std::size_t stored = stored_entries();
    std::size_t at = full_ ? next_ : 0;
    for (std::size_t i = 0; i < stored; ++i, at = at + 1 == capacity_ ? 0 : at + 1)
      entries_[at].expand([&](const tracker_event& e) {
        if (skip > 0) --skip;
        else f(e);
      });
  }
  /// Calls f(const ring_entry&) on each stored entry, in no particular order.
  template <class F>
  void for_each_entry(F&& f) const {
    for (std::size_t i = 0, stored = stored_entries(); i < stored; ++i) f(entries_[i]);
  }
  /// Events kept. O(capacity).
  [[nodiscard]] std::size_t size() const noexcept { return std::min(stored_events(), capacity_); }
  /// Events pushed and not kept. O(capacity).
  [[nodiscard]] std::size_t dropped() const noexcept { return pushed_ - size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  [[nodiscard]] std::size_t stored_entries() const noexcept { return full_ ? capacity_ : next_; }
  [[nodiscard]] std::size_t stored_events() const noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0, stored = stored_entries(); i < stored; ++i) n += entries_[i].count();
    return n;
  }

  /// Every cache line the entry touches (an entry need not start on a line). Always inlined:
  /// GCC finds a function of prefetches alone free of effects and deletes its calls.
  [[gnu::always_inline]] static void prefetch_for_write(const ring_entry* e) noexcept {
    const char* last = reinterpret_cast<const char*>(e) + sizeof(ring_entry) - 1;
    for (const char* p = reinterpret_cast<const char*>(e); p <= last; p += 64) __builtin_prefetch(p, 1);
    __builtin_prefetch(last, 1);
  }

  std::vector<ring_entry> entries_;   // capacity entries, each holding one event or more
  std::size_t capacity_ = entries_.size();  // kept: entries_.size() is a division by the entry's size
  std::size_t next_ = 0;              // where the next entry goes
  bool full_ = false;                 // every entry stored: the ring has wrapped
  std::size_t pushed_ = 0;            // every event pushed, kept or not
};

/// "job/model_a/layer" for a tenant: its ancestors' names joined by '/'.
inline std::string tenant_path(const tenant_registry& reg, tenant t) {
  std::string path = reg.name(t);
  for (tenant p; reg.parent(t, p); t = p) path = std::string(reg.name(p)) + "/" + path;
  return path;
}

}  // namespace detail::tracker
}  // namespace vram

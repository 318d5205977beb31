#pragma once
// The tracker's bounded ring of events and its clock. The types it hands out are public, in
// vram/adaptor/tracker_snapshot.hpp.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <vram/adaptor/tracker_snapshot.hpp>
#include <vram/core/tenant.hpp>

namespace vram {

namespace detail::tracker {

[[nodiscard]] inline std::int64_t tracker_now_us() noexcept {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

/// A bounded ring: keeps the newest `capacity` events; `dropped()` counts the rest.
class tracker_ring {
 public:
  explicit tracker_ring(std::size_t capacity) : events_(capacity) {}
  /// The slot of a new event, for the caller to fill in place (the oldest event's when full:
  /// it counts as dropped); nullptr for a ring of capacity 0 (the event counts as dropped).
  tracker_event* push() noexcept {
    if (events_.empty()) {
      ++dropped_;
      return nullptr;
    }
    if (size_ == events_.size()) ++dropped_;
    else ++size_;
    tracker_event* slot = &events_[next_];
    next_ = next_ + 1 == events_.size() ? 0 : next_ + 1;
    return slot;
  }
  /// Oldest first.
  template <class F>
  void for_each(F&& f) const {
    std::size_t start = size_ == events_.size() ? next_ : 0;
    for (std::size_t i = 0; i < size_; ++i) f(events_[(start + i) % events_.size()]);
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t dropped() const noexcept { return dropped_; }
  [[nodiscard]] std::size_t capacity() const noexcept { return events_.size(); }

 private:
  std::vector<tracker_event> events_;
  std::size_t next_ = 0;  // where the next event goes
  std::size_t size_ = 0;  // size_ <= capacity
  std::size_t dropped_ = 0;
};

/// "job/model_a/layer" for a tenant: its ancestors' names joined by '/'.
inline std::string tenant_path(const tenant_registry& reg, tenant t) {
  std::string path = reg.name(t);
  for (tenant p; reg.parent(t, p); t = p) path = std::string(reg.name(p)) + "/" + path;
  return path;
}

}  // namespace detail::tracker
}  // namespace vram

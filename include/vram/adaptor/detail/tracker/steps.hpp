#pragma once
// Step summaries and leak detection for the tracker: at each step mark, the live bytes per
// tenant and per tag, and for each a streak of new highs. Steady workloads rise and fall
// within their range; a leak keeps setting new highs. Used under the tracker's mutex.

#include <algorithm>
#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <vram/adaptor/tracker_snapshot.hpp>

namespace vram::detail::tracker {

class step_book {
 public:
  explicit step_book(const tracker_options& o) : options_(o) {}

  /// Closes a step: `now` (summarized live records) is what is live at the mark, `live` the
  /// records themselves (for the sites of a leak), `peak` the live bytes at their highest
  /// during the step, `allocations` the tracker's allocations so far, `now_us` the mark's
  /// time. `path` names a tenant as `now` does.
  template <class TenantPath>
  const step_summary& mark(const tracker_snapshot& now, const std::vector<tracked_allocation>& live, std::size_t reserved,
                           std::size_t peak, std::size_t allocations, std::int64_t now_us, TenantPath&& path) {
    ++marks_;
    step_summary s{marks_, peak, now.live_bytes, reserved, allocations - allocations_at_mark_, now.by_tenant, now.by_tag};
    allocations_at_mark_ = allocations;
    leaks_.clear();
    follow(leak_report::kind::tenant, now.by_tenant, live, [&](const tracked_allocation& a) { return path(a.owner); });
    follow(leak_report::kind::tag, now.by_tag, live, [](const tracked_allocation& a) { return a.tag; });
    std::sort(leaks_.begin(), leaks_.end(), [](const leak_report& a, const leak_report& b) {
      return a.to_bytes - a.from_bytes > b.to_bytes - b.from_bytes;
    });
    last_mark_us_ = now_us;
    steps_.push_back(std::move(s));
    while (steps_.size() > std::max<std::size_t>(options_.step_capacity, 1)) steps_.pop_front();
    return steps_.back();
  }

  [[nodiscard]] const std::deque<step_summary>& steps() const noexcept { return steps_; }
  /// The suspected leaks as of the last mark, largest growth first.
  [[nodiscard]] const std::vector<leak_report>& leaks() const noexcept { return leaks_; }

 private:
  struct series {
    std::size_t high = 0;        // the highest live bytes seen at a mark
    std::size_t streak = 0;      // consecutive marks at a new high
    std::size_t from_step = 0;   // the mark before the streak, and its bytes and time
    std::size_t from_bytes = 0;
    std::int64_t from_us = 0;
  };

  template <class NameOf>
  void follow(leak_report::kind kind, const std::vector<tracker_holder>& holders,
              const std::vector<tracked_allocation>& live, NameOf&& name_of) {
    auto& all = kind == leak_report::kind::tenant ? tenants_ : tags_;
    std::map<std::string, std::size_t> bytes;
    for (const tracker_holder& h : holders) bytes[h.name] = h.bytes;
    for (auto& [name, b] : bytes) all.try_emplace(name);
    for (auto& [name, s] : all) {
      auto it = bytes.find(name);
      const std::size_t v = it == bytes.end() ? 0 : it->second;
      if (v > s.high) {
        if (s.streak == 0) {  // growth starts from the last mark's level
          s.from_step = marks_ - 1;
          s.from_bytes = s.high;
          s.from_us = last_mark_us_;
        }
        ++s.streak;
        s.high = v;
      } else {
        s.streak = 0;
      }
      if (s.streak >= std::max<std::size_t>(options_.leak_steps, 1) && v - s.from_bytes >= options_.leak_min_bytes)
        leaks_.push_back(report(kind, name, s, v, live, name_of));
    }
  }

  template <class NameOf>
  static leak_report report(leak_report::kind kind, const std::string& name, const series& s, std::size_t now,
                            const std::vector<tracked_allocation>& live, NameOf& name_of) {
    leak_report r{kind, name, s.streak, s.from_step, s.from_bytes, now, {}};
    for (const tracked_allocation& a : live)
      if (a.time_us > s.from_us && name_of(a) == name) r.sites.push_back(a);
    std::sort(r.sites.begin(), r.sites.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
    if (r.sites.size() > 5) r.sites.resize(5);
    return r;
  }

  const tracker_options& options_;
  std::size_t marks_ = 0;
  std::size_t allocations_at_mark_ = 0;  // the tracker's allocations at the last mark
  std::int64_t last_mark_us_ = 0;
  std::map<std::string, series> tenants_, tags_;
  std::deque<step_summary> steps_;
  std::vector<leak_report> leaks_;
};

}  // namespace vram::detail::tracker

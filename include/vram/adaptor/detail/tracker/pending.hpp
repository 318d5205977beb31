#pragma once
// The tracker's frees that wait for a stream: a marker (vram::event) recorded on the stream
// at the free, polled -- never waited for -- at the tracker's next call and at snapshot
// time. This is how a free on a CUDA stream gets its free_completed record without the
// host blocking and without a host function stalling the stream.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/core/event.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram::detail::tracker {

/// Markers of pending frees, one FIFO per stream. Not thread-safe: the tracker's mutex guards it.
///
/// Invariant: within one stream's FIFO, markers were recorded in stream order, so they
/// complete in that order: poll() looks at each FIFO's front only and stops at the first
/// incomplete marker (cost per poll: one query per stream with pending frees, plus one per
/// completion). Events are recycled through `spare_`, so a steady state creates none.
class tracker_pending_markers {
 public:
  /// Records a marker on `s` for the free (address, id). Throws what event::record throws
  /// (cuda_error), having changed nothing.
  void add(stream_ref s, std::uintptr_t address, std::uint64_t id) {
    event e;
    if (!spare_.empty()) {
      e = std::move(spare_.back());
      spare_.pop_back();
    }
    e.record(s);  // a recycled event is complete: recording it again moves its marker
    by_stream_[s.key()].push_back(entry{std::move(e), address, id});
    ++size_;
  }

  /// Calls done(address, id) for each free whose marker is complete, oldest first per stream.
  /// A marker whose query fails counts as complete: its stream is broken and runs no more work.
  template <class Done>
  void poll(Done&& done) noexcept {
    if (size_ == 0) return;
    for (auto it = by_stream_.begin(); it != by_stream_.end();) {
      auto& fifo = it->second;
      while (!fifo.empty()) {
        bool complete = true;
        try {
          complete = fifo.front().marker.query();
        } catch (...) {
        }
        if (!complete) break;
        entry e = std::move(fifo.front());
        fifo.pop_front();
        --size_;
        done(e.address, e.id);
        try {
          spare_.push_back(std::move(e.marker));
        } catch (...) {  // no memory to keep it: the event is destroyed instead
        }
      }
      it = fifo.empty() ? by_stream_.erase(it) : std::next(it);
    }
  }

  /// Markers not yet seen complete.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  struct entry {
    event marker;
    std::uintptr_t address;
    std::uint64_t id;
  };
  std::unordered_map<std::uint64_t, std::deque<entry>> by_stream_;  // stream key -> FIFO
  std::vector<event> spare_;  // recorded before and complete: reused by add()
  std::size_t size_ = 0;      // size_ == sum of the FIFOs' sizes
};

}  // namespace vram::detail::tracker

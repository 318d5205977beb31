#pragma once
// Turns a recorded address-based stream of allocs and frees into a vram::trace::trace:
// addresses become ids (addresses are reused), streams become dense indices, frees of
// addresses never seen become blocks live at the start (when their size is known) or
// counted warnings. The window's events go to the trace, or (for a trace read as a stream)
// to a sink, so that only the live blocks are held.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <vram/trace/trace.hpp>

namespace vram::detail::trace {

class trace_builder {
 public:
  /// The window's events are kept in the trace, or given to `sink` as they come (then the
  /// finished trace holds only the blocks live at the start).
  trace_builder(std::string name, std::string format, std::function<void(const vram::trace::event&)> sink = {})
      : sink_(std::move(sink)) {
    trace_.name = std::move(name);
    trace_.format = std::move(format);
  }

  /// An allocation of `bytes` at `addr`, by the tenant named `tenant` ("": none named).
  void alloc(std::uint64_t addr, std::uint64_t bytes, std::uint64_t stream, std::int64_t time_ns,
             std::string_view tenant = {}) {
    if (auto it = live_.find(addr); it != live_.end()) {
      trace_.warn("allocation at a live address " + std::to_string(addr) + ": the old block is taken as freed");
      emit_free(it->second, stream, time_ns);
      live_.erase(it);
    }
    std::uint64_t id = next_id_++;
    std::uint16_t t = tenant_index(tenant);
    live_.emplace(addr, block{id, bytes, t});
    emit({vram::trace::event::op::alloc, t, stream_index(stream), id, bytes, time_ns});
  }

  /// A free of `addr`; `bytes` is the recorded size (0 when the format has none).
  void free(std::uint64_t addr, std::uint64_t bytes, std::uint64_t stream, std::int64_t time_ns) {
    auto it = live_.find(addr);
    if (it == live_.end()) {
      if (bytes == 0) {
        trace_.warn("free of unknown address " + std::to_string(addr) + " (no size): ignored");
        return;
      }
      // Allocated before recording began: it was live at the start.
      block b{next_id_++, bytes, 0};
      initial_.push_back({vram::trace::event::op::alloc, 0, stream_index(stream), b.id, bytes, 0});
      emit_free(b, stream, time_ns);
      return;
    }
    emit_free(it->second, stream, time_ns);
    live_.erase(it);
  }

  /// A block known (from an end-of-window snapshot) to be live at `addr`: when no allocation
  /// in the window explains it, it was live from the start and is never freed.
  void live_at_end(std::uint64_t addr, std::uint64_t bytes, std::uint64_t stream) {
    if (live_.count(addr) != 0 || bytes == 0) return;
    live_.emplace(addr, block{next_id_, bytes, 0});
    initial_.push_back({vram::trace::event::op::alloc, 0, stream_index(stream), next_id_++, bytes, 0});
  }

  /// `bytes` allocated before the window beyond the blocks its frees revealed: one block,
  /// live throughout (never freed). An absurd figure (a block above max_trace_bytes, as a
  /// corrupt counter gives) adds nothing but a warning, as an absurd event size does.
  void live_before_window(std::uint64_t bytes) {
    std::uint64_t known = 0;
    for (const auto& e : initial_) known += e.bytes;
    if (bytes <= known) return;
    if (bytes - known > vram::trace::max_trace_bytes)
      return warn("memory allocated before the window: an absurd size, no block added for it");
    initial_.push_back({vram::trace::event::op::alloc, 0, 0, next_id_++, bytes - known, 0});
  }

  void recorded_reserved(std::uint64_t reserved) {
    trace_.recorded_reserved.push_back({window_events_, reserved});  // re-based in finish()
    if (!trace_.recorded_peak_reserved || reserved > *trace_.recorded_peak_reserved)
      trace_.recorded_peak_reserved = reserved;
  }

  void warn(std::string message) { trace_.warn(std::move(message)); }
  /// The window's events so far.
  [[nodiscard]] std::size_t events() const noexcept { return window_events_; }

  /// The finished trace: initial blocks first, then the window.
  vram::trace::trace finish() && {
    std::size_t n = initial_.size();
    trace_.initial_live = n;
    trace_.events.insert(trace_.events.begin(), initial_.begin(), initial_.end());
    // Samples count window events: shift them past the initial blocks.
    for (auto& s : trace_.recorded_reserved) s.event_index = std::min(s.event_index + n, n + window_events_);
    trace_.streams = static_cast<std::uint32_t>(std::max<std::size_t>(1, streams_.size()));
    if (tenants_.size() > 1) {  // some allocation was attributed
      trace_.tenants.resize(tenants_.size());
      for (const auto& [name, index] : tenants_) trace_.tenants[index] = name;
    }
    return std::move(trace_);
  }

 private:
  struct block {
    std::uint64_t id;
    std::uint64_t bytes;
    std::uint16_t tenant;
  };

  void emit_free(const block& b, std::uint64_t stream, std::int64_t time_ns) {
    emit({vram::trace::event::op::free, b.tenant, stream_index(stream), b.id, b.bytes, time_ns});
  }
  void emit(const vram::trace::event& e) {
    ++window_events_;
    if (sink_) sink_(e);
    else trace_.events.push_back(e);
  }

  /// The tenant's index: 0 for "" (none named), new names in order of appearance. Beyond
  /// 65,535 names the rest share the last index (a warning says so).
  std::uint16_t tenant_index(std::string_view name) {
    if (name.empty()) return 0;
    if (auto it = tenants_.find(std::string(name)); it != tenants_.end()) return it->second;
    if (tenants_.size() == 65535) {
      warn("more than 65,534 tenants: '" + std::string(name) + "' and later ones are counted as the last");
      return 65534;
    }
    return tenants_.emplace(std::string(name), static_cast<std::uint16_t>(tenants_.size())).first->second;
  }

  std::uint32_t stream_index(std::uint64_t stream) {
    auto [it, inserted] = streams_.emplace(stream, static_cast<std::uint32_t>(streams_.size()));
    return it->second;
  }

  vram::trace::trace trace_;
  std::function<void(const vram::trace::event&)> sink_;
  std::size_t window_events_ = 0;
  std::vector<vram::trace::event> initial_;
  std::unordered_map<std::uint64_t, block> live_;  // recorded address -> live block
  std::unordered_map<std::uint64_t, std::uint32_t> streams_;
  std::unordered_map<std::string, std::uint16_t> tenants_{{"", 0}};
  std::uint64_t next_id_ = 0;
};

}  // namespace vram::detail::trace

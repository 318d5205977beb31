#pragma once
// The workload generators' event emitter: allocations get fresh ids, frees reuse them.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <vram/trace/trace.hpp>

namespace vram::detail::trace {

/// Emits allocs and frees with fresh ids.
class emitter {
 public:
  emitter(std::string name) {
    t_.name = std::move(name);
    t_.format = "generated";
  }
  std::uint64_t alloc(std::uint64_t bytes, std::uint32_t stream = 0) {
    t_.events.push_back({vram::trace::event::op::alloc, 0, stream, next_, bytes, tick_++});
    sizes_.push_back(bytes);
    t_.streams = std::max(t_.streams, stream + 1);
    return next_++;
  }
  void free(std::uint64_t id, std::uint32_t stream = 0) {
    t_.events.push_back({vram::trace::event::op::free, 0, stream, id, sizes_[id], tick_++});
  }
  [[nodiscard]] std::size_t events() const noexcept { return t_.events.size(); }
  vram::trace::trace finish() && { return std::move(t_); }

 private:
  vram::trace::trace t_;
  std::vector<std::uint64_t> sizes_;
  std::uint64_t next_ = 0;
  std::int64_t tick_ = 0;
};

}  // namespace vram::detail::trace

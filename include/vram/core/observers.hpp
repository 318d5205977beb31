#pragma once
// vram::observers<Os...>: several observers as one, so an allocator's one Observer parameter
// can feed statistics and a tracker (and anything else) together.

#include <cstddef>
#include <tuple>
#include <utility>

#include <vram/core/observer.hpp>
#include <vram/core/stats.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram {

/// Passes every event to each of its observers, in the order given:
///   vram::statistics_observer counts;
///   vram::tracker_observer tracker;
///   vram::stream_pool<vram::host_source, vram::observers<vram::statistics_observer, vram::tracker_observer>>
///       pool({}, {}, {counts, tracker});
/// Holds the observers by value (the library's observers share their state between copies, so
/// the caller's copies see what the pool reports); get<I>() or get<O>() reaches one.
/// Thread safety and cost: those of the observers together; noexcept like each of them.
template <class... Os>
  requires(observer<Os> && ...)
class observers {
 public:
  observers() = default;
  observers(Os... os) : each_(std::move(os)...) {}  // NOLINT(google-explicit-constructor): {a, b} reads as the pair

  void on_allocate(const void* p, std::size_t bytes, stream_ref s) noexcept {
    std::apply([&](auto&... o) { (o.on_allocate(p, bytes, s), ...); }, each_);
  }
  void on_deallocate(const void* p, std::size_t bytes, stream_ref s) noexcept {
    std::apply([&](auto&... o) { (o.on_deallocate(p, bytes, s), ...); }, each_);
  }
  void on_grow(const void* p, std::size_t bytes) noexcept {
    std::apply([&](auto&... o) { (o.on_grow(p, bytes), ...); }, each_);
  }
  void on_release(const void* p, std::size_t bytes) noexcept {
    std::apply([&](auto&... o) { (o.on_release(p, bytes), ...); }, each_);
  }
  void on_out_of_memory(std::size_t bytes, stream_ref s, const stats& st) noexcept {
    std::apply([&](auto&... o) { (o.on_out_of_memory(bytes, s, st), ...); }, each_);
  }

  template <std::size_t I>
  [[nodiscard]] auto& get() noexcept { return std::get<I>(each_); }
  template <std::size_t I>
  [[nodiscard]] const auto& get() const noexcept { return std::get<I>(each_); }
  template <class O>
  [[nodiscard]] O& get() noexcept { return std::get<O>(each_); }
  template <class O>
  [[nodiscard]] const O& get() const noexcept { return std::get<O>(each_); }

 private:
  std::tuple<Os...> each_;
};

static_assert(observer<observers<no_observer, no_observer>>);

}  // namespace vram

#pragma once
// vram::pmr_resource<R>: a std::pmr::memory_resource over any host-accessible vram resource,
// so std::pmr containers (vector, string, map, ...) draw from a vram pool.

#include <cstddef>
#include <memory_resource>
#include <type_traits>
#include <utility>

#include <vram/core/concepts.hpp>
#include <vram/core/properties.hpp>
#include <vram/core/ref.hpp>

namespace vram {

/// Serves std::pmr from a vram resource `R` whose memory the host may touch.
///
/// Purpose: host code that already speaks std::pmr (containers, monotonic buffers chained
/// over an upstream) gets a vram pool, with its statistics, quotas and tracking, underneath.
/// Streams: every call uses the synchronous stream (allocate_sync / deallocate_sync): pmr
/// has no notion of streams and containers use memory in program order.
/// Alignment: the alignment pmr asks for, at least 1 (vram resources round it up: stream_pool
/// and host_source give 256 bytes). An alignment above vram::max_alignment or not a power of
/// two throws vram::invalid_argument (a std::invalid_argument, as pmr allows any exception).
/// Zero bytes: pmr expects a usable non-null pointer, so a zero-byte request takes 1 byte
/// from `R` (and the matching deallocate frees 1 byte).
/// Errors: out of memory is vram::out_of_memory, a std::bad_alloc, as pmr requires.
/// Upstream: `R` held by value. To share a non-copyable pool (stream_pool), hold it through
/// vram::ref(pool); constructing from an lvalue deduces that for you:
///   vram::stream_pool<vram::host_source> pool;
///   vram::pmr_resource mr{pool};                // pmr_resource<vram::ref_t<stream_pool<host_source>>>
///   std::pmr::vector<int> v(&mr);
/// Equality (do_is_equal): another pmr_resource<R> whose `R` compares equal (so memory from
/// one can be freed through the other).
/// Thread safety: that of `R`. Complexity: one call into `R` per operation.
template <class R>
  requires synchronous_resource_with<R, host_accessible>
class pmr_resource final : public std::pmr::memory_resource {
 public:
  explicit pmr_resource(R resource) noexcept(std::is_nothrow_move_constructible_v<R>)
      : resource_(std::move(resource)) {}

  [[nodiscard]] R& upstream() noexcept { return resource_; }
  [[nodiscard]] const R& upstream() const noexcept { return resource_; }

 private:
  static constexpr std::size_t at_least_one(std::size_t bytes) noexcept { return bytes == 0 ? 1 : bytes; }

  void* do_allocate(std::size_t bytes, std::size_t align) override {
    return resource_.allocate_sync(at_least_one(bytes), align == 0 ? 1 : align);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    resource_.deallocate_sync(p, at_least_one(bytes), align == 0 ? 1 : align);
  }
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    if (this == &other) return true;
    const auto* o = dynamic_cast<const pmr_resource*>(&other);
    if (o == nullptr) return false;
    try {
      return resource_ == o->resource_;
    } catch (...) {
      return false;  // an equality that throws cannot promise interchangeable memory
    }
  }

  R resource_;
};

namespace detail {
/// What pmr_resource holds when given an lvalue: a copy of copyable resources (sources share
/// their state between copies), a resource_ref to the others (pools are not copyable).
template <class R>
using interop_pmr_held = std::conditional_t<std::is_copy_constructible_v<R>, R, ref_t<R>>;
}  // namespace detail

template <class R>
pmr_resource(R&) -> pmr_resource<detail::interop_pmr_held<R>>;

}  // namespace vram

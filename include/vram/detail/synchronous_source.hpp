#pragma once
// detail::synchronous_source: the stream-ordered calls of a source whose memory is ready when
// allocated and gone when freed (cudaMalloc, cudaMallocManaged, cudaHostAlloc).

#include <cstddef>

#include <vram/core/alignment.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/event.hpp>
#include <vram/core/stream_ref.hpp>

namespace vram::detail {

/// CRTP base: Derived provides allocate_sync, deallocate_sync and name().
/// allocate(s, ...) is allocate_sync: the memory is usable at once, so on `s` too.
/// deallocate(s, p, ...) first waits for the work enqueued on `s` (it may still use p), then
/// frees; a failure to wait is reported as upstream_failure and the memory is freed anyway
/// (the free would synchronize the device regardless).
template <class Derived>
class synchronous_source {
 public:
  void* allocate(stream_ref, std::size_t bytes, std::size_t align = default_alignment) {
    return self().allocate_sync(bytes, align);
  }

  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    try {
      synchronize(s);
    } catch (...) {
      report_misuse({misuse::upstream_failure, Derived::name(), p, bytes, 0});
    }
    self().deallocate_sync(p, bytes, align);
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

}  // namespace vram::detail

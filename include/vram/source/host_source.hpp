#pragma once
// vram::host_source: aligned host memory, for CPU users and for testing the allocators.

#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/event.hpp>
#include <vram/core/throw.hpp>

namespace vram {

/// Host memory from the global aligned operator new.
///
/// It records every live allocation, so a foreign pointer, a double free or a wrong size is
/// reported (error handler) and ignored instead of corrupting the heap; that costs a locked
/// hash-map update per call, which is fine for an upstream (pools call it rarely).
///
/// Thread safety: all members may be called concurrently.
/// Streams: memory is ready when allocate returns; deallocate(s, ...) frees it once the work
/// enqueued on `s` so far has run (a task on a host stream; after synchronizing a CUDA stream).
/// Alignment: any valid alignment (power of two, <= max_alignment); at least default_alignment.
/// Zero bytes: allocate returns nullptr; deallocate(nullptr, ...) does nothing.
/// Copies share one allocation table and compare equal; memory may be freed through any copy.
class host_source {
 public:
  host_source() : state_(std::make_shared<state>()) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "host_source"; }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (bytes == 0) return nullptr;
    align = align < default_alignment ? default_alignment : align;
    void* p = ::operator new(bytes, std::align_val_t{align}, std::nothrow);
    if (p == nullptr) detail::throw_out_of_memory(name(), bytes, stream_ref{});
    std::lock_guard lock(state_->mutex);
    state_->live.emplace(p, entry{bytes, align});
    return p;
  }

  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    if (!forget(p, bytes, align)) return;
    free_now(p, align);
  }

  void* allocate(stream_ref, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate_sync(bytes, align);
  }

  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    if (p == nullptr) return;
    if (!forget(p, bytes, align)) return;
    try {
      after_pending_work(s, [p, align] { free_now(p, align); });
    } catch (...) {  // the stream failed: its work cannot run any more, so freeing now is safe
      report_misuse({misuse::upstream_failure, name(), p, bytes, 0});
      free_now(p, align);
    }
  }

  /// True when `p` is a live allocation of this source.
  [[nodiscard]] bool owns(const void* p) const {
    std::lock_guard lock(state_->mutex);
    return state_->live.contains(const_cast<void*>(p));
  }

  /// Number of live allocations (for leak checks).
  [[nodiscard]] std::size_t live_allocations() const {
    std::lock_guard lock(state_->mutex);
    return state_->live.size();
  }

  friend bool operator==(const host_source& a, const host_source& b) noexcept { return a.state_ == b.state_; }
  friend constexpr void get_property(const host_source&, host_accessible) noexcept {}

 private:
  struct entry {
    std::size_t bytes;
    std::size_t align;
  };
  struct state {
    std::mutex mutex;
    std::unordered_map<void*, entry> live;
  };

  static void free_now(void* p, std::size_t align) noexcept {
    ::operator delete(p, std::align_val_t{align < default_alignment ? default_alignment : align});
  }

  /// Removes p from the table if the call is well formed; reports misuse otherwise.
  bool forget(void* p, std::size_t bytes, std::size_t align) noexcept {
    std::lock_guard lock(state_->mutex);
    auto it = state_->live.find(p);
    if (it == state_->live.end()) {
      report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
      return false;
    }
    if (it->second.bytes != bytes) {
      report_misuse({misuse::wrong_size, name(), p, bytes, it->second.bytes});
      return false;
    }
    if (it->second.align != align && !(align <= default_alignment && it->second.align <= default_alignment)) {
      report_misuse({misuse::wrong_alignment, name(), p, align, it->second.align});
      return false;
    }
    state_->live.erase(it);
    return true;
  }

  std::shared_ptr<state> state_;
};

static_assert(resource_with<host_source, host_accessible>);

}  // namespace vram

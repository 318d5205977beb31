#pragma once
// vram::simulated_device_source: a "GPU" of any capacity, made of reserved address space
// that is never touched. For trace replay and for tests of device-side behaviour.

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>

#include <vram/core/alignment.hpp>
#include <vram/core/concepts.hpp>
#include <vram/core/error_handler.hpp>
#include <vram/core/throw.hpp>

namespace vram {

/// How a simulated device hands out memory.
struct simulated_device_options {
  /// Bytes the device has; allocations beyond it throw out_of_memory.
  std::size_t capacity = std::size_t{80} << 30;
  /// Every allocation is rounded up to this (cudaMalloc maps 2 MiB pages).
  std::size_t granularity = std::size_t{2} << 20;
  /// false: separate allocations, like cudaMalloc (a pool must not merge them).
  /// true: one growable range, like cuda_vmm_source: allocations are placed at the lowest free
  /// address (so growth is adjacent), neighbours may be merged by a pool, and any
  /// granularity-aligned piece of live memory may be freed on its own.
  bool contiguous = false;
};

/// Simulates device memory: addresses come from a PROT_NONE reservation of `capacity` bytes,
/// so they are unique and realistic, cost no RAM, and fault if anyone dereferences them
/// (device memory cannot be read from the host either).
///
/// Placement: first fit at the lowest address (the reservation is the "card").
/// Complexity: O(log n + k) per call, k the free ranges scanned before a fit.
/// Thread safety: all members may be called concurrently (one mutex; it is an upstream).
/// Streams: allocation and free take effect at once (as cudaMalloc / cudaFree, which synchronize).
/// Alignment: allocations are aligned to `granularity`; a larger alignment is an invalid argument.
/// Zero bytes: allocate returns nullptr; deallocate(nullptr, ...) does nothing.
/// Copies share the device and compare equal.
class simulated_device_source {
 public:
  explicit simulated_device_source(simulated_device_options options = {})
      : state_(std::make_shared<state>(options)) {}

  /// A device of `capacity` bytes with the default granularity.
  explicit simulated_device_source(std::size_t capacity, bool contiguous = false)
      : simulated_device_source(simulated_device_options{.capacity = capacity, .contiguous = contiguous}) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "simulated_device_source"; }

  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    detail::check_request(name(), bytes, align);
    if (align > state_->granularity)
      detail::throw_invalid_argument(name(), "alignment larger than the device granularity");
    if (bytes == 0) return nullptr;
    return state_->allocate(bytes);
  }

  void deallocate_sync(void* p, std::size_t bytes, std::size_t = default_alignment) noexcept {
    if (p != nullptr) state_->deallocate(p, bytes);
  }

  void* allocate(stream_ref, std::size_t bytes, std::size_t align = default_alignment) {
    return allocate_sync(bytes, align);
  }
  void deallocate(stream_ref, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    deallocate_sync(p, bytes, align);
  }

  [[nodiscard]] bool contiguous() const noexcept { return state_->contiguous; }
  [[nodiscard]] std::size_t granularity() const noexcept { return state_->granularity; }
  [[nodiscard]] std::size_t capacity() const noexcept { return state_->capacity; }

  /// True when p lies inside live memory of this device.
  [[nodiscard]] bool owns(const void* p) const {
    std::lock_guard lock(state_->mutex);
    return state_->find_live(reinterpret_cast<std::uintptr_t>(p)) != state_->live.end();
  }

  /// Device-level statistics: reserved_bytes is the memory in use on the device (rounded to
  /// the granularity), live_bytes what callers asked for.
  [[nodiscard]] vram::stats stats() const {
    std::lock_guard lock(state_->mutex);
    return state_->counters;
  }

  friend bool operator==(const simulated_device_source& a, const simulated_device_source& b) noexcept {
    return a.state_ == b.state_;
  }
  friend constexpr void get_property(const simulated_device_source&, device_accessible) noexcept {}

 private:
  struct range {
    std::size_t bytes;      // rounded to the granularity
    std::size_t requested;  // what the caller asked for (== bytes for pieces of a split range)
  };

  struct state {
    explicit state(const simulated_device_options& o)
        : capacity(align_up(o.capacity, o.granularity)), granularity(o.granularity), contiguous(o.contiguous) {
      if (!is_power_of_two(granularity) || granularity < default_alignment)
        detail::throw_invalid_argument(name(), "granularity must be a power of two >= default_alignment");
      if (capacity == 0 || capacity > max_request_bytes) detail::throw_invalid_argument(name(), "absurd capacity");
      // Reserve one extra granule so the base can be aligned to the granularity.
      reserved = capacity + granularity;
      void* p = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) detail::throw_out_of_memory(name(), capacity, stream_ref{});
      mapping = p;
      base = align_up(reinterpret_cast<std::uintptr_t>(p), granularity);
      free.emplace(base, capacity);
    }
    ~state() { ::munmap(mapping, reserved); }
    state(const state&) = delete;
    state& operator=(const state&) = delete;

    void* allocate(std::size_t bytes) {
      std::size_t rounded = align_up(bytes, granularity);
      std::lock_guard lock(mutex);
      auto it = std::find_if(free.begin(), free.end(), [&](const auto& r) { return r.second >= rounded; });
      if (it == free.end()) {
        ++counters.ooms;
        detail::throw_out_of_memory(name(), bytes, stream_ref{}, counters);
      }
      std::uintptr_t addr = it->first;
      std::size_t left = it->second - rounded;
      free.erase(it);
      if (left != 0) free.emplace(addr + rounded, left);
      live.emplace(addr, range{rounded, bytes});
      counters.reserved_bytes += rounded;
      counters.live_bytes += bytes;
      counters.peak_reserved_bytes = std::max(counters.peak_reserved_bytes, counters.reserved_bytes);
      counters.peak_live_bytes = std::max(counters.peak_live_bytes, counters.live_bytes);
      ++counters.live_allocations;
      ++counters.total_allocations;
      ++counters.upstream_allocations;
      return reinterpret_cast<void*>(addr);
    }

    void deallocate(void* p, std::size_t bytes) noexcept {
      auto addr = reinterpret_cast<std::uintptr_t>(p);
      std::lock_guard lock(mutex);
      auto it = live.find(addr);
      if (it != live.end() && it->second.requested == bytes) {
        give_back(it, it->second.bytes);
        return;
      }
      if (contiguous && is_aligned(addr, granularity) && is_aligned(bytes, granularity) && covered(addr, bytes)) {
        free_pieces(addr, bytes);
        return;
      }
      if (it != live.end())
        report_misuse({misuse::wrong_size, name(), p, bytes, it->second.requested});
      else
        report_misuse({misuse::foreign_pointer, name(), p, bytes, 0});
    }

    /// The live range containing addr, or live.end().
    std::map<std::uintptr_t, range>::const_iterator find_live(std::uintptr_t addr) const {
      auto it = live.upper_bound(addr);
      if (it == live.begin()) return live.end();
      --it;
      return addr < it->first + it->second.bytes ? it : live.end();
    }

    /// True when [addr, addr+bytes) is entirely live memory (several ranges may cover it).
    bool covered(std::uintptr_t addr, std::size_t bytes) const {
      std::uintptr_t end = addr + bytes;
      while (addr < end) {
        auto it = find_live(addr);
        if (it == live.end()) return false;
        addr = it->first + it->second.bytes;
      }
      return true;
    }

    /// Frees [addr, addr+bytes), a covered, granule-aligned range, splitting live ranges at its ends.
    void free_pieces(std::uintptr_t addr, std::size_t bytes) noexcept {
      std::uintptr_t end = addr + bytes;
      while (addr < end) {
        auto it = live.find(find_live(addr)->first);
        std::uintptr_t r_begin = it->first, r_end = it->first + it->second.bytes;
        std::size_t requested = it->second.requested;
        live.erase(it);
        --counters.live_allocations;
        counters.live_bytes -= requested;
        // Keep the parts of the range outside [addr, end) live, as whole-granule pieces.
        if (r_begin < addr) keep_piece(r_begin, addr - r_begin);
        std::uintptr_t cut_end = std::min(r_end, end);
        if (cut_end < r_end) keep_piece(cut_end, r_end - cut_end);
        counters.reserved_bytes -= cut_end - addr;
        add_free(addr, cut_end - addr);
        addr = cut_end;
      }
      ++counters.total_deallocations;
      ++counters.upstream_deallocations;
    }

    void keep_piece(std::uintptr_t addr, std::size_t bytes) {
      live.emplace(addr, range{bytes, bytes});
      counters.live_bytes += bytes;
      ++counters.live_allocations;
    }

    void give_back(std::map<std::uintptr_t, range>::iterator it, std::size_t bytes) noexcept {
      std::uintptr_t addr = it->first;
      counters.live_bytes -= it->second.requested;
      counters.reserved_bytes -= bytes;
      --counters.live_allocations;
      ++counters.total_deallocations;
      ++counters.upstream_deallocations;
      live.erase(it);
      add_free(addr, bytes);
    }

    /// Inserts a free range, merging it with free neighbours (free ranges never touch).
    void add_free(std::uintptr_t addr, std::size_t bytes) {
      auto next = free.lower_bound(addr);
      if (next != free.end() && addr + bytes == next->first) {
        bytes += next->second;
        next = free.erase(next);
      }
      if (next != free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == addr) {
          prev->second += bytes;
          return;
        }
      }
      free.emplace_hint(next, addr, bytes);
    }

    std::size_t capacity;
    std::size_t granularity;
    bool contiguous;
    std::size_t reserved = 0;
    void* mapping = nullptr;
    std::uintptr_t base = 0;

    mutable std::mutex mutex;
    std::map<std::uintptr_t, std::size_t> free;  // address -> bytes; sum == capacity - counters.reserved_bytes
    std::map<std::uintptr_t, range> live;        // address -> range
    vram::stats counters;
  };

  std::shared_ptr<state> state_;
};

static_assert(resource_with<simulated_device_source, device_accessible>);

}  // namespace vram

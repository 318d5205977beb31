#pragma once
// A recording, leak-checking upstream for adaptor and allocator tests: it forwards to an
// inner resource and counts calls and live bytes, so a test can prove that an allocator
// gave back everything it took, and that a failed request never touched the upstream.

#include <atomic>
#include <cstddef>
#include <memory>

#include <vram/core/concepts.hpp>

namespace vram::test {

struct recording_counters {
  std::atomic<std::size_t> allocations{0};
  std::atomic<std::size_t> deallocations{0};
  std::atomic<std::size_t> live_bytes{0};
  std::atomic<std::size_t> peak_live_bytes{0};

  [[nodiscard]] std::size_t live_allocations() const { return allocations - deallocations; }
};

template <class Inner>
class recording_resource : public forward_properties<recording_resource<Inner>, Inner> {
 public:
  explicit recording_resource(Inner inner = Inner{}) : inner_(std::move(inner)), counters_(std::make_shared<recording_counters>()) {}

  [[nodiscard]] static constexpr const char* name() noexcept { return "recording_resource"; }

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    void* p = inner_.allocate(s, bytes, align);
    note_allocate(p, bytes);
    return p;
  }
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    note_deallocate(p, bytes);
    inner_.deallocate(s, p, bytes, align);
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    void* p = inner_.allocate_sync(bytes, align);
    note_allocate(p, bytes);
    return p;
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    note_deallocate(p, bytes);
    inner_.deallocate_sync(p, bytes, align);
  }

  // Forwarded capabilities of contiguous sources, so pools see through the recorder.
  [[nodiscard]] bool contiguous() const noexcept
    requires has_contiguous_growth<Inner>
  { return inner_.contiguous(); }
  [[nodiscard]] std::size_t granularity() const noexcept
    requires has_contiguous_growth<Inner>
  { return inner_.granularity(); }

  [[nodiscard]] const recording_counters& counters() const noexcept { return *counters_; }
  [[nodiscard]] Inner& inner() noexcept { return inner_; }

  friend bool operator==(const recording_resource& a, const recording_resource& b) noexcept {
    return a.counters_ == b.counters_;
  }

 private:
  void note_allocate(void* p, std::size_t bytes) {
    if (p == nullptr) return;
    counters_->allocations.fetch_add(1);
    std::size_t live = counters_->live_bytes.fetch_add(bytes) + bytes;
    std::size_t peak = counters_->peak_live_bytes.load();
    while (live > peak && !counters_->peak_live_bytes.compare_exchange_weak(peak, live)) {
    }
  }
  void note_deallocate(void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return;
    counters_->deallocations.fetch_add(1);
    counters_->live_bytes.fetch_sub(bytes);
  }

  Inner inner_;
  std::shared_ptr<recording_counters> counters_;
};

}  // namespace vram::test

#pragma once
// vram::retry_adaptor<Upstream>: on out_of_memory, run reclaim callbacks (release a pool's
// cache, shrink, spill, anything the user registers) and retry, a bounded number of times;
// on final failure, dump who holds what to a configured path and rethrow.

#include <atomic>
#include <cstddef>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/adaptor/detail/adaptor_base.hpp>

namespace vram {

/// Tries to make room for a failed request of `bytes` on `stream`; returns the bytes it freed
/// (or any non-zero value when it freed something it cannot measure; 0 when it freed nothing).
/// Must not allocate from the retry_adaptor that calls it.
using reclaim_callback = std::function<std::size_t(std::size_t bytes, stream_ref stream)>;

/// Writes a report of who holds memory (e.g. a tracker_adaptor's write_report).
using oom_dump_writer = std::function<void(std::ostream&)>;

struct retry_options {
  /// Reclaim-and-retry rounds after the first failure.
  std::size_t max_retries = 2;
  /// On final failure, write the numbers and the dump writer's report here (empty: no dump).
  std::string dump_path;
  oom_dump_writer dump_writer;
};

/// Retries failed allocations after reclaiming memory.
///
/// allocate(): call the upstream; on vram::out_of_memory (including quota_exceeded) run every
/// reclaim callback in registration order and retry, at most max_retries times; stop early
/// when a round reclaims nothing (retrying could not succeed). On final failure: write
/// "what failed, after how many retries, having reclaimed how much" plus the dump writer's
/// report to dump_path, then rethrow the upstream's exception unchanged (it carries the bytes,
/// the stream, the failing resource and its stats).
/// Thread safety: as the upstream; callbacks may run on several threads at once (they are
/// the caller's to make safe). Registering callbacks is thread-safe.
/// Streams, alignment: those of the upstream. Upstream: held by value; copies share options
/// and callbacks. Capabilities: those of adaptor_base (stats, release, owns, check_invariants
/// pass through; try_allocate retries like allocate). Complexity: the upstream's, plus
/// callbacks on the failure path only.
template <class Upstream>
class retry_adaptor : public detail::adaptor::adaptor_base<retry_adaptor<Upstream>, Upstream> {
  using base = detail::adaptor::adaptor_base<retry_adaptor<Upstream>, Upstream>;
  using base::upstream_;

 public:
  explicit retry_adaptor(Upstream upstream = Upstream{}, retry_options options = {})
      : base(std::move(upstream)), state_(std::make_shared<state>()) {
    state_->options = std::move(options);
  }

  [[nodiscard]] static constexpr const char* name() noexcept { return "retry_adaptor"; }

  /// Adds a reclaim callback (run after those added before it).
  void add_reclaim(reclaim_callback cb) {
    std::lock_guard lock(state_->mutex);
    state_->callbacks.push_back(std::move(cb));
  }
  /// Adds "call r.release()" as a reclaim callback; `r` must outlive this adaptor's use.
  template <class R>
    requires has_release<R>
  void add_release(R& r) {
    add_reclaim([&r](std::size_t, stream_ref) { return static_cast<std::size_t>(r.release()); });
  }
  /// Replaces the dump path and writer used on final failure.
  void set_dump(std::string path, oom_dump_writer writer) {
    std::lock_guard lock(state_->mutex);
    state_->options.dump_path = std::move(path);
    state_->options.dump_writer = std::move(writer);
  }

  void* allocate(stream_ref s, std::size_t bytes, std::size_t align = default_alignment) {
    for (std::size_t attempt = 0;; ++attempt) {
      try {
        return upstream_.allocate(s, bytes, align);
      } catch (const out_of_memory& e) {
        std::size_t reclaimed = attempt < max_retries() ? reclaim(bytes, s) : 0;
        if (reclaimed == 0) {
          give_up(e, attempt);
          throw;
        }
        state_->retries.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  void deallocate(stream_ref s, void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    upstream_.deallocate(s, p, bytes, align);
  }
  void* allocate_sync(std::size_t bytes, std::size_t align = default_alignment) {
    return allocate(stream_ref{}, bytes, align);
  }
  void deallocate_sync(void* p, std::size_t bytes, std::size_t align = default_alignment) noexcept {
    upstream_.deallocate(stream_ref{}, p, bytes, align);
  }

  /// Retries made (each after a reclaim round that freed something).
  [[nodiscard]] std::size_t retries() const noexcept { return state_->retries.load(std::memory_order_relaxed); }
  /// Requests that failed for good.
  [[nodiscard]] std::size_t failures() const noexcept { return state_->failures.load(std::memory_order_relaxed); }
  /// Bytes the callbacks reported reclaiming.
  [[nodiscard]] std::size_t reclaimed_bytes() const noexcept { return state_->reclaimed.load(std::memory_order_relaxed); }

  friend bool operator==(const retry_adaptor& a, const retry_adaptor& b) {
    return a.state_ == b.state_ && a.upstream_ == b.upstream_;
  }

 private:
  struct state {
    std::mutex mutex;  // guards options and callbacks
    retry_options options;
    std::vector<reclaim_callback> callbacks;
    std::atomic<std::size_t> retries{0}, failures{0}, reclaimed{0};
  };

  std::size_t max_retries() const {
    std::lock_guard lock(state_->mutex);
    return state_->options.max_retries;
  }

  std::size_t reclaim(std::size_t bytes, stream_ref s) {
    std::vector<reclaim_callback> cbs;
    {
      std::lock_guard lock(state_->mutex);
      cbs = state_->callbacks;
    }
    std::size_t total = 0;
    for (auto& cb : cbs) total += cb(bytes, s);
    state_->reclaimed.fetch_add(total, std::memory_order_relaxed);
    return total;
  }

  void give_up(const out_of_memory& e, std::size_t retries) noexcept {
    state_->failures.fetch_add(1, std::memory_order_relaxed);
    try {
      std::string path;
      oom_dump_writer writer;
      {
        std::lock_guard lock(state_->mutex);
        path = state_->options.dump_path;
        writer = state_->options.dump_writer;
      }
      if (path.empty()) return;
      std::ofstream out(path, std::ios::trunc);
      out << e.what() << "\nvram: retry_adaptor gave up after " << retries << " retries; " << e.bytes()
          << " bytes requested; callbacks reclaimed " << reclaimed_bytes() << " bytes in total\n";
      if (writer) writer(out);
    } catch (...) {  // the dump is best effort: the out_of_memory is what the caller must see
    }
  }

  std::shared_ptr<state> state_;
};

}  // namespace vram

#include <vram/source/host_source.hpp>
static_assert(vram::resource<vram::retry_adaptor<vram::host_source>>);

#pragma once
// detail::stream_pool::freeing_stream / stream_marker: what stream_pool remembers about a stream that freed
// blocks into it, and a marker of "all work enqueued on it so far".
//
// Why not vram::event directly: a host_stream may be destroyed while the pool still holds
// blocks freed on it (every test thread makes its own). A marker on a host stream holds the
// stream's shared state, so recording and querying never touch the host_stream object; a
// destroyed host stream has drained its queue, so its markers are complete. CUDA streams are
// recorded with vram::event (cudaEventRecord) and must outlive the pool's use of them
// (see stream_pool's stream contract); a pool being destroyed never names them
// (wait_before_release).

#include <cstdint>
#include <memory>
#include <optional>

#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/detail/cuda_device_guard.hpp>

namespace vram::detail::stream_pool {

/// A point in one stream's work: complete once everything enqueued before it has run.
class stream_marker {
 public:
  stream_marker() = default;

  [[nodiscard]] bool query() const {
    if (host_) return host_->completed.load(std::memory_order_acquire) >= ticket_;
    if (cuda_) return cuda_->query();
    return true;
  }

  /// Work enqueued on `s` from now on runs after the marked work (the caller blocks only
  /// when `s` is the synchronous stream or the kinds cannot wait on each other).
  void make_wait(stream_ref s) const {
    if (query()) return;
    if (host_) {
      if (s.is_host()) {
        s.host().enqueue([state = host_, ticket = ticket_] { state->wait_for(ticket); });
        return;
      }
      host_->wait_for(ticket_);
      return;
    }
    cuda_->make_wait(s);
  }

 private:
  friend class freeing_stream;
  std::shared_ptr<host_stream_state> host_;
  std::uint64_t ticket_ = 0;
  std::shared_ptr<event> cuda_;
};

/// A stream as the pool remembers it.
class freeing_stream {
 public:
  freeing_stream() = default;  // the synchronous stream
  explicit freeing_stream(stream_ref s) { refresh(s); }

  /// Re-binds to `s` (same key): a host_stream at a recycled address has a new state.
  void refresh(stream_ref s) noexcept {
    if (s.is_host()) {
      if (host_ != s.host().state()) host_ = s.host().state();
    } else if (s.is_cuda()) {
      cuda_ = s.cuda();
      is_cuda_ = true;
    }
  }
  [[nodiscard]] bool is_cuda() const noexcept { return is_cuda_; }
  /// True when refresh(s) would change something (cheap check for the hot path).
  [[nodiscard]] bool stale(stream_ref s) const noexcept { return s.is_host() && host_ != s.host().state(); }

  /// Marks all work enqueued on the stream so far (complete at once when the stream is idle).
  [[nodiscard]] stream_marker record() const {
    stream_marker m;
    if (host_) {
      std::lock_guard lock(host_->mutex);
      m.host_ = host_;
      m.ticket_ = host_->enqueued;
    } else if (is_cuda_) {
#if VRAM_HAS_CUDA
      // An idle stream needs no event: its work so far is complete now. (An event recorded on
      // it and queried at once would still read "not ready", so the blocks freed on it would
      // wait for a later merge.) A stream being captured is not queried: that would end the
      // capture.
      if (!detail::cuda_stream_capturing(cuda_) && cudaStreamQuery(cuda_) == cudaSuccess) return m;
#endif
      m.cuda_ = std::make_shared<event>();
      m.cuda_->record(stream_ref{cuda_});
    }
    return m;
  }

 private:
  std::shared_ptr<host_stream_state> host_;
  CUstream_st* cuda_ = nullptr;
  bool is_cuda_ = false;
};

/// Blocks until the work of every stream that `for_each_stream(visit)` visits is done, before a
/// pool being destroyed gives its memory back. Host streams: each one's marker is waited for.
/// CUDA streams are not named at all: a user may destroy a stream once it is synchronized, before
/// the pool (a destroyed handle is undefined behaviour to the driver, and crashes it), so the
/// pool's device is synchronized instead, once: the upstream's device() where it has one, else
/// the current device. A failure is passed to `on_failure` and the other streams are still waited for.
template <class Upstream, class ForEachStream, class OnFailure>
void wait_before_release(const Upstream& upstream, ForEachStream&& for_each_stream, OnFailure&& on_failure) noexcept {
  bool any_cuda = false;
  for_each_stream([&](const freeing_stream& s) {
    if (s.is_cuda()) {
      any_cuda = true;
      return;
    }
    try {
      s.record().make_wait(stream_ref{});
    } catch (...) {
      on_failure();
    }
  });
#if VRAM_HAS_CUDA
  if (!any_cuda) return;
  try {
    if constexpr (requires { upstream.device(); }) {
      detail::cuda_device_guard on(upstream.device());
      detail::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    } else {
      detail::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
  } catch (...) {
    on_failure();
  }
#else
  (void)upstream;
  (void)any_cuda;
#endif
}

}  // namespace vram::detail::stream_pool

#pragma once
// vram::event and the operations on streams: record an event, make a stream wait on it,
// query it, synchronize with it, and synchronize a whole stream. The same calls work for
// CUDA streams, host streams and the synchronous stream.

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include <vram/core/config.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/core/stream_ref.hpp>
#include <vram/core/throw.hpp>

namespace vram {

/// Blocks the calling thread until all work enqueued on `s` so far is done.
inline void synchronize(stream_ref s) {
  switch (s.type()) {
    case stream_ref::kind::synchronous: return;
    case stream_ref::kind::host: s.host().synchronize(); return;
    case stream_ref::kind::cuda:
#if VRAM_HAS_CUDA
      detail::check_cuda(cudaStreamSynchronize(s.cuda()), "cudaStreamSynchronize");
      return;
#else
      detail::throw_no_cuda("synchronize(stream_ref)");
#endif
  }
}

namespace detail {

#if VRAM_HAS_CUDA
/// True when `s` is being captured into a CUDA graph (its work runs at graph launch, not now).
/// A failed query counts as capturing: the caller then takes its no-stream fallback.
[[nodiscard]] inline bool cuda_stream_capturing(cudaStream_t s) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(s, &status);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error for the next call
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

/// The host function after_pending_work enqueues: runs and deletes its task. It must not
/// throw into the driver, and a host function may make no CUDA call, so `f` must not either.
inline void CUDART_CB run_host_task(void* data) noexcept {
  auto* task = static_cast<std::function<void()>*>(data);
  try {
    (*task)();
  } catch (...) {  // nowhere to report from a driver thread; the task owns its error handling
  }
  delete task;
}
#endif

}  // namespace detail

/// Runs `f` once the work enqueued on `s` so far is done, without blocking the caller: at
/// once on the synchronous stream, as a task on a host stream, as a host function
/// (cudaLaunchHostFunc) on a CUDA stream. On a CUDA stream `f` runs on a driver thread and
/// must make no CUDA call. Throws cuda_error when the host function cannot be enqueued,
/// also for a stream being captured into a graph (a captured host function would run at
/// every launch of the graph); `f` has not run then, and the caller decides what to do.
inline void after_pending_work(stream_ref s, std::function<void()> f) {
  switch (s.type()) {
    case stream_ref::kind::synchronous: f(); return;
    case stream_ref::kind::host: s.host().enqueue(std::move(f)); return;
    case stream_ref::kind::cuda:
#if VRAM_HAS_CUDA
    {
      if (detail::cuda_stream_capturing(s.cuda()))
        detail::check_cuda(cudaErrorStreamCaptureUnsupported, "cudaLaunchHostFunc (stream is capturing)");
      auto* task = new std::function<void()>(std::move(f));
      cudaError_t e = cudaLaunchHostFunc(s.cuda(), detail::run_host_task, task);
      if (e != cudaSuccess) {
        delete task;  // never enqueued: it will not run
        detail::check_cuda(e, "cudaLaunchHostFunc");
      }
      return;
    }
#else
      detail::throw_no_cuda("after_pending_work");
#endif
  }
}

/// A marker in a stream's work: complete once all work enqueued before record() has run.
///
/// An event that was never recorded is complete. Recording again moves the marker. Move-only;
/// owns its cudaEvent_t (created on the first record on a CUDA stream, timing disabled).
/// Thread safety: like cudaEvent_t, one event must not be recorded concurrently from two
/// threads; query/synchronize/wait may run concurrently with each other.
class event {
 public:
  event() noexcept = default;
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  event(event&& o) noexcept { swap(o); }
  event& operator=(event&& o) noexcept {
    event tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~event() {
#if VRAM_HAS_CUDA
    if (cuda_event_ != nullptr) (void)cudaEventDestroy(cuda_event_);  // nothing to do on failure in a destructor
#endif
  }

  /// Marks the work enqueued on `s` so far.
  void record(stream_ref s) {
    switch (s.type()) {
      case stream_ref::kind::synchronous:
        kind_ = stream_ref::kind::synchronous;
        host_state_.reset();
        return;
      case stream_ref::kind::host: {
        auto& state = s.host().state();
        std::lock_guard lock(state->mutex);
        ticket_ = state->enqueued;
        host_state_ = state;
        kind_ = stream_ref::kind::host;
        return;
      }
      case stream_ref::kind::cuda:
#if VRAM_HAS_CUDA
        if (cuda_event_ == nullptr)
          detail::check_cuda(cudaEventCreateWithFlags(&cuda_event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        detail::check_cuda(cudaEventRecord(cuda_event_, s.cuda()), "cudaEventRecord");
        host_state_.reset();
        kind_ = stream_ref::kind::cuda;
        return;
#else
        detail::throw_no_cuda("event::record");
#endif
    }
  }

  /// True when the marked work is done. Never blocks.
  [[nodiscard]] bool query() const {
    switch (kind_) {
      case stream_ref::kind::synchronous: return true;
      case stream_ref::kind::host: return host_state_->completed.load(std::memory_order_acquire) >= ticket_;
      case stream_ref::kind::cuda:
#if VRAM_HAS_CUDA
      {
        cudaError_t status = cudaEventQuery(cuda_event_);
        if (status == cudaErrorNotReady) return false;
        detail::check_cuda(status, "cudaEventQuery");
        return true;
      }
#else
        detail::throw_no_cuda("event::query");
#endif
    }
    return true;
  }

  /// Blocks the calling thread until the marked work is done.
  void synchronize() const {
    switch (kind_) {
      case stream_ref::kind::synchronous: return;
      case stream_ref::kind::host:
        detail::host_blocking_waits.fetch_add(1, std::memory_order_relaxed);  // see host_stream::blocking_waits
        host_state_->wait_for(ticket_);
        return;
      case stream_ref::kind::cuda:
#if VRAM_HAS_CUDA
        detail::check_cuda(cudaEventSynchronize(cuda_event_), "cudaEventSynchronize");
        return;
#else
        detail::throw_no_cuda("event::synchronize");
#endif
    }
  }

  /// Makes work enqueued on `s` from now on wait until the marked work is done, without
  /// blocking the caller where the stream kinds allow it:
  /// - host stream waiting on a host or CUDA event: a task on `s` blocks its worker;
  /// - CUDA stream waiting on a CUDA event: cudaStreamWaitEvent;
  /// - CUDA stream waiting on a host event, or the synchronous stream: the caller blocks.
  void make_wait(stream_ref s) const {
    if (query()) return;  // nothing to wait for: the common case costs nothing
    if (s.is_host()) {
      if (kind_ == stream_ref::kind::host) {
        s.host().enqueue([state = host_state_, ticket = ticket_] { state->wait_for(ticket); });
        return;
      }
#if VRAM_HAS_CUDA
      s.host().enqueue([e = cuda_event_] { detail::check_cuda(cudaEventSynchronize(e), "cudaEventSynchronize"); });
      return;
#endif
    }
#if VRAM_HAS_CUDA
    if (s.is_cuda() && kind_ == stream_ref::kind::cuda) {
      detail::check_cuda(cudaStreamWaitEvent(s.cuda(), cuda_event_, 0), "cudaStreamWaitEvent");
      return;
    }
#endif
    synchronize();
  }

 private:
  void swap(event& o) noexcept {
    std::swap(kind_, o.kind_);
    std::swap(ticket_, o.ticket_);
    std::swap(host_state_, o.host_state_);
#if VRAM_HAS_CUDA
    std::swap(cuda_event_, o.cuda_event_);
#endif
  }

  stream_ref::kind kind_ = stream_ref::kind::synchronous;
  std::uint64_t ticket_ = 0;                              // host: complete when completed >= ticket_
  std::shared_ptr<detail::host_stream_state> host_state_;  // host: keeps the counter alive
#if VRAM_HAS_CUDA
  cudaEvent_t cuda_event_ = nullptr;
#endif
};

/// `s` waits for `e` (cudaStreamWaitEvent's shape); see event::make_wait.
inline void wait(stream_ref s, const event& e) { e.make_wait(s); }

}  // namespace vram

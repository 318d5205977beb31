#pragma once
// vram::host_stream: an in-order task queue run by its own worker thread.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace vram {

namespace detail {

/// How many times a thread blocked on host-stream work, process-wide (see
/// host_stream::blocking_waits). Relaxed: a count for tests and diagnostics, not a fence.
inline std::atomic<std::uint64_t> host_blocking_waits{0};

/// Shared by a host_stream and every event recorded on it, so an event may outlive its stream.
/// Invariant: completed <= enqueued; tasks.size() + running == enqueued - completed.
struct host_stream_state {
  std::mutex mutex;
  std::condition_variable work_ready;    // the worker waits here for tasks
  std::condition_variable work_done;     // synchronize() and waits on events wait here
  std::deque<std::function<void()>> tasks;
  std::uint64_t enqueued = 0;            // guarded by mutex; tickets are 1, 2, ...
  std::atomic<std::uint64_t> completed{0};  // written under mutex, read without it by query()
  bool stopping = false;
  std::exception_ptr first_error;        // the first exception a task threw

  /// Blocks the caller until every task up to `ticket` has run.
  void wait_for(std::uint64_t ticket) {
    if (completed.load(std::memory_order_acquire) >= ticket) return;
    std::unique_lock lock(mutex);
    work_done.wait(lock, [&] { return completed.load(std::memory_order_acquire) >= ticket; });
  }
};

}  // namespace detail

/// A stream without a GPU: tasks enqueued on it run one after another, in order, on the
/// stream's own worker thread, concurrently with the caller and with other host streams.
///
/// It is what lets vram's stream-ordered allocators be tested for real on a machine without
/// a GPU: a "kernel" is a task that reads or writes the memory it was given, and a block that
/// is reused before its last task ran shows up as corruption.
///
/// Thread safety: every member may be called from any thread. Tasks must not call
/// synchronize() on their own stream (that would wait for itself).
/// Exceptions: a task that throws is recorded; the first one is rethrown by synchronize().
/// Destruction runs every task already enqueued, then joins the worker.
/// Blocking is counted: blocking_waits() says how often a caller waited on host-stream work,
/// which is how tests prove that allocate and deallocate paths never block the host.
class host_stream {
 public:
  host_stream() : state_(std::make_shared<detail::host_stream_state>()), worker_([s = state_] { run(*s); }) {}

  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;

  ~host_stream() {
    {
      std::lock_guard lock(state_->mutex);
      state_->stopping = true;
    }
    state_->work_ready.notify_one();
    worker_.join();
  }

  /// Appends `task` to the queue; it runs after every task enqueued before it.
  /// Returns the task's ticket (an event recorded now completes when this task has run).
  std::uint64_t enqueue(std::function<void()> task) {
    std::uint64_t ticket;
    {
      std::lock_guard lock(state_->mutex);
      state_->tasks.push_back(std::move(task));
      ticket = ++state_->enqueued;
    }
    state_->work_ready.notify_one();
    return ticket;
  }

  /// Blocks until every task enqueued so far has run; rethrows the first task exception.
  void synchronize() {
    detail::host_blocking_waits.fetch_add(1, std::memory_order_relaxed);
    std::uint64_t ticket;
    {
      std::lock_guard lock(state_->mutex);
      ticket = state_->enqueued;
    }
    state_->wait_for(ticket);
    std::lock_guard lock(state_->mutex);
    if (state_->first_error) std::rethrow_exception(std::exchange(state_->first_error, nullptr));
  }

  /// True when every task enqueued so far has run.
  [[nodiscard]] bool idle() const {
    std::lock_guard lock(state_->mutex);
    return state_->completed.load(std::memory_order_acquire) == state_->enqueued;
  }

  /// Calls, process-wide, that blocked the calling thread on host-stream work:
  /// host_stream::synchronize() and event::synchronize() of a host-stream event (also when
  /// reached through wait() from the synchronous stream). Counted per call, whether or not
  /// the work was already done, so a count is deterministic. Waits that a stream's own
  /// worker performs (a host stream waiting on an event, see event::make_wait) block no
  /// caller and are not counted. Cost: one relaxed atomic increment per blocking call.
  [[nodiscard]] static std::uint64_t blocking_waits() noexcept {
    return detail::host_blocking_waits.load(std::memory_order_relaxed);
  }

  /// The state shared with events (implementation detail of vram::event).
  [[nodiscard]] const std::shared_ptr<detail::host_stream_state>& state() const noexcept { return state_; }

 private:
  static void run(detail::host_stream_state& s) {
    std::unique_lock lock(s.mutex);
    for (;;) {
      s.work_ready.wait(lock, [&] { return s.stopping || !s.tasks.empty(); });
      if (s.tasks.empty()) return;  // stopping, and drained
      auto task = std::move(s.tasks.front());
      s.tasks.pop_front();
      lock.unlock();
      try {
        task();
      } catch (...) {
        std::lock_guard error_lock(s.mutex);
        if (!s.first_error) s.first_error = std::current_exception();
      }
      task = nullptr;  // destroy captures before reporting completion
      lock.lock();
      s.completed.fetch_add(1, std::memory_order_release);
      s.work_done.notify_all();
    }
  }

  std::shared_ptr<detail::host_stream_state> state_;
  std::thread worker_;
};

}  // namespace vram

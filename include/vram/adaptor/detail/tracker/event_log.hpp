#pragma once
// The tracker's event log (tracker_options::event_log): every event of the history appended,
// as it is recorded, to a file in RMM's CSV with vram's Tenant column -- the lines
// tracker_write_rmm_csv writes for the ring -- so that a history of any length costs a 1 MiB
// buffer, not memory per event. vram-replay reads the file as a stream
// (vram/trace/read_trace_stream.hpp).

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <unordered_map>

#include <vram/core/tenant.hpp>
#include <vram/adaptor/detail/tracker/records.hpp>
#include <vram/adaptor/tracker_snapshot.hpp>
#include <vram/trace/detail/rmm_csv.hpp>

namespace vram::detail::tracker {

/// Thread safety: none; the tracker calls it under its mutex.
/// Invariant: buffer_ holds the lines not yet written, at most capacity bytes before a write.
class tracker_event_log {
  static constexpr std::size_t capacity = std::size_t{1} << 20;

 public:
  /// Creates (or truncates) the file at `path` and writes the header. Throws std::system_error
  /// naming the path when it cannot be created.
  tracker_event_log(const std::string& path, const tenant_registry& registry) : path_(path), registry_(registry) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "vram: tracker event log " + path);
    buffer_.reserve(capacity);
    buffer_ = trace::rmm_csv_header;
    if (!flush()) {
      int error = errno;
      ::close(fd_);
      throw std::system_error(error, std::generic_category(), "vram: tracker event log " + path);
    }
  }
  tracker_event_log(const tracker_event_log&) = delete;
  tracker_event_log& operator=(const tracker_event_log&) = delete;
  ~tracker_event_log() {
    (void)flush();
    ::close(fd_);
  }

  /// Appends `e` where RMM's log has its action (alloc, free_requested, oom); the other
  /// actions are the snapshot's. Never throws: an event that cannot be written (the disk
  /// full, no host memory for a tenant's name) is counted in failures() instead.
  void write(const tracker_event& e) noexcept {
    const char* action = e.action == tracker_action::alloc            ? "allocate"
                         : e.action == tracker_action::free_requested ? "free"
                         : e.action == tracker_action::oom            ? "allocate failure"
                                                                      : nullptr;
    if (action == nullptr) return;
    try {
      const std::string& tenant = tenant_of(e.owner);
      if (buffer_.size() + 160 + tenant.size() * 2 > capacity) (void)flush();
      trace::append_rmm_csv_line(buffer_, e.thread, e.time_us, action, e.address, e.bytes, e.stream, tenant);
      ++written_;
    } catch (...) {
      ++failures_;
    }
  }

  /// Writes what is buffered; false when some event could not be written, now or before.
  bool flush() noexcept {
    std::size_t done = 0;
    while (done < buffer_.size()) {
      ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failures_ += std::max<std::size_t>(1, lines_in(done));  // what is left of the buffer is lost
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    buffer_.clear();
    return failures_ == 0;
  }

  /// Events that could not be written.
  [[nodiscard]] std::size_t failures() const noexcept { return failures_; }
  /// Events appended (written or buffered).
  [[nodiscard]] std::size_t events() const noexcept { return written_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  /// The lines of the buffer from byte `from` on.
  [[nodiscard]] std::size_t lines_in(std::size_t from) const noexcept {
    std::size_t n = 0;
    for (std::size_t i = from; i < buffer_.size(); ++i) n += buffer_[i] == '\n';
    return n;
  }

  /// The tenant's path, looked up once per tenant.
  const std::string& tenant_of(tenant t) {
    auto it = tenants_.find(t.id);
    if (it == tenants_.end()) it = tenants_.emplace(t.id, tenant_path(registry_, t)).first;
    return it->second;
  }

  std::string path_;
  const tenant_registry& registry_;
  int fd_ = -1;
  std::string buffer_;
  std::unordered_map<std::uint32_t, std::string> tenants_;
  std::size_t written_ = 0, failures_ = 0;
};

}  // namespace vram::detail::tracker

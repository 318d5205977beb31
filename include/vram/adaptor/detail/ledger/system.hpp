#pragma once
// What a quota ledger asks of the operating system: mapped files, process-shared robust
// mutexes, open-file-description locks (the liveness of a process slot), random ids, and a
// count of fork()s. Linux only (open-file-description locks, renameat2).

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <vram/core/error.hpp>
#include <vram/core/throw.hpp>

namespace vram::detail::ledger {

[[noreturn]] inline void fail_errno(ledger_error::reason r, const std::string& path, const char* what, int err) {
  throw_ledger_error(r, path, std::string(what) + ": " + std::strerror(err));
}

/// A file mapped shared, unmapped and closed on destruction. No lock is ever taken through
/// its descriptor: a mapping is copied by fork(), and with it the open file description
/// (slot_lock.hpp takes the slots' locks through a description of its own).
class mapped_file {
 public:
  mapped_file() = default;
  mapped_file(int fd, void* base, std::size_t bytes) noexcept : fd_(fd), base_(base), bytes_(bytes) {}
  mapped_file(mapped_file&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~mapped_file() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] int fd() const noexcept { return fd_; }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(base_);
  }

 private:
  int fd_ = -1;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

/// Maps `fd` (of `bytes` bytes) shared; takes ownership of fd, also when it throws.
inline mapped_file map_file(int fd, std::size_t bytes, bool writable, const std::string& path) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    fail_errno(ledger_error::reason::system, path, "mmap", err);
  }
  return mapped_file(fd, p, bytes);
}

/// Makes `m` a robust, process-shared mutex (in a freshly created file).
inline void init_shared_mutex(pthread_mutex_t* m, const std::string& path) {
  pthread_mutexattr_t a;
  int rc = pthread_mutexattr_init(&a);
  if (rc == 0) rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  if (rc == 0) rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  if (rc == 0) rc = pthread_mutex_init(m, &a);
  pthread_mutexattr_destroy(&a);
  if (rc != 0) fail_errno(ledger_error::reason::system, path, "pthread_mutex_init", rc);
}

/// Holds a robust mutex. When the previous holder died inside it, `repair` runs first (with
/// the mutex held) and the mutex is marked consistent again.
class robust_guard {
 public:
  template <class Repair>
  robust_guard(pthread_mutex_t* m, const std::string& path, Repair&& repair) : m_(m) {
    int rc = pthread_mutex_lock(m);
    if (rc == EOWNERDEAD) {
      try {
        repair();
      } catch (...) {
        pthread_mutex_unlock(m);  // not marked consistent: the next holder repairs again
        throw;
      }
      rc = pthread_mutex_consistent(m);
    }
    if (rc != 0)
      fail_errno(rc == ENOTRECOVERABLE ? ledger_error::reason::corrupted : ledger_error::reason::system, path,
                 "locking the ledger", rc);
  }
  ~robust_guard() { pthread_mutex_unlock(m_); }
  robust_guard(const robust_guard&) = delete;
  robust_guard& operator=(const robust_guard&) = delete;

 private:
  pthread_mutex_t* m_;
};

/// The one-byte range `index` of a file, as an open-file-description lock request.
inline struct flock byte_range(short type, std::uint32_t index) noexcept {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = static_cast<off_t>(index);
  l.l_len = 1;
  return l;
}

/// Takes an exclusive open-file-description lock on byte `index` of fd's file; false when
/// another open file description holds it. Released when nothing refers to this open file
/// description any more (no descriptor, no mapping, in any process), which the kernel sees
/// when the last process that refers to it dies, however it dies.
inline bool lock_byte(int fd, std::uint32_t index) noexcept {
  struct flock l = byte_range(F_WRLCK, index);
  return ::fcntl(fd, F_OFD_SETLK, &l) == 0;
}

inline void unlock_byte(int fd, std::uint32_t index) noexcept {
  struct flock l = byte_range(F_UNLCK, index);
  ::fcntl(fd, F_OFD_SETLK, &l);
}

/// Whether an open file description other than fd's holds byte `index`. An error is
/// answered "held": a slot is reclaimed only when its holder is known to be gone.
inline bool byte_held_elsewhere(int fd, std::uint32_t index) noexcept {
  struct flock l = byte_range(F_WRLCK, index);
  if (::fcntl(fd, F_OFD_GETLK, &l) != 0) return true;
  return l.l_type != F_UNLCK;
}

inline void random_id(std::uint64_t (&out)[2], const std::string& path) {
  std::size_t got = 0;
  auto* p = reinterpret_cast<unsigned char*>(out);
  while (got < sizeof out) {
    ssize_t n = ::getrandom(p + got, sizeof out - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno(ledger_error::reason::system, path, "getrandom", errno);
    got += static_cast<std::size_t>(n);
  }
}

/// The calling process's name (/proc/self/comm), at most 15 characters; "" when unknown.
inline void process_command(char (&out)[16]) noexcept {
  std::memset(out, 0, sizeof out);
  int fd = ::open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = ::read(fd, out, sizeof out - 1);
  ::close(fd);
  if (n <= 0) return;
  out[n] = '\0';
  if (char* nl = std::strchr(out, '\n')) *nl = '\0';
}

/// Counts fork()s in this process's history: a child sees a different value than its
/// parent saw, so a handle attached before fork() knows it is in the child.
inline std::uint64_t fork_generation() noexcept {
  static std::atomic<std::uint64_t> generation{0};
  [[maybe_unused]] static const int registered =
      pthread_atfork(nullptr, nullptr, [] { generation.fetch_add(1, std::memory_order_relaxed); });
  return generation.load(std::memory_order_relaxed);
}

}  // namespace vram::detail::ledger

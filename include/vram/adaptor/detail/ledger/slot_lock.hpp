#pragma once
// The liveness of a process slot: an open-file-description lock on one byte of the usage
// file, held through an open file description that only the process that took it refers to.
//
// An open-file-description lock lives as long as its description, and a description lives
// as long as anything refers to it: a descriptor or a mapping, in any process. fork() copies
// every descriptor and every mapping, so a lock taken through a descriptor the process keeps
// would outlive the process in each child it forked (and each of theirs). So the lock is
// taken through a description of its own, which then keeps a single reference: a one-page
// mapping marked MADV_DONTFORK, which the kernel leaves out of every child, however it is
// made (fork, a raw clone, posix_spawn) and exec. The descriptor is closed at once (closing a
// descriptor releases none of its description's locks). The process's death unmaps it, and
// the kernel drops the lock; unmapping it drops the lock too.
// Between the open and the close the descriptor is in the process's table: a pthread_atfork
// handler keeps fork() from copying it then (its prepare step waits for the mutex). A raw
// clone syscall at that instant runs no handler; its child would hold the lock until it
// exits or execs (descriptors are close-on-exec).

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

#include <vram/core/error.hpp>
#include <vram/core/throw.hpp>
#include <vram/adaptor/detail/ledger/system.hpp>

namespace vram::detail::ledger {

/// Held from a slot_lock's open to its close; fork() waits for it.
inline pthread_mutex_t slot_lock_opening = PTHREAD_MUTEX_INITIALIZER;

/// One handle's lock on its process slot. Not thread-safe on its own: the ledger calls
/// acquire() and release() with its charge mutex held, or in its destructor.
class slot_lock {
 public:
  slot_lock() = default;
  slot_lock(const slot_lock&) = delete;
  slot_lock& operator=(const slot_lock&) = delete;
  ~slot_lock() { release(); }

  /// Takes byte `index` of `file`, the usage file that `mapped_fd` maps, through a new open
  /// file description; false when another description holds it. Pre: nothing held. Throws
  /// ledger_error: system, or mismatched when `file` is no longer the file `mapped_fd` maps
  /// (the ledger was replaced meanwhile).
  [[nodiscard]] bool acquire(const std::string& file, int mapped_fd, std::uint32_t index, const std::string& path) {
    static const int registered = pthread_atfork([] { pthread_mutex_lock(&slot_lock_opening); },
                                                 [] { pthread_mutex_unlock(&slot_lock_opening); },
                                                 [] { pthread_mutex_unlock(&slot_lock_opening); });
    if (registered != 0) fail_errno(ledger_error::reason::system, path, "pthread_atfork", registered);
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    pthread_mutex_lock(&slot_lock_opening);
    int err = 0;
    const char* failed = nullptr;
    bool held = false;
    const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat mine {}, mapped {};
    if (fd < 0) {
      err = errno, failed = "opening its usage file for a slot's lock";
    } else if (::fstat(fd, &mine) != 0 || ::fstat(mapped_fd, &mapped) != 0) {
      err = errno, failed = "fstat";
    } else if (mine.st_dev == mapped.st_dev && mine.st_ino == mapped.st_ino && lock_byte(fd, index)) {
      void* p = ::mmap(nullptr, page, PROT_NONE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        err = errno, failed = "mmap";
      } else if (::madvise(p, page, MADV_DONTFORK) != 0) {
        err = errno, failed = "madvise";
        ::munmap(p, page);
      } else {
        base_ = p, bytes_ = page, owner_ = ::getpid(), held = true;
      }
    }
    if (fd >= 0) ::close(fd);  // the mapping, if any, is the description's one reference now
    pthread_mutex_unlock(&slot_lock_opening);
    if (failed != nullptr) fail_errno(ledger_error::reason::system, path, failed, err);
    if (!held && (mine.st_dev != mapped.st_dev || mine.st_ino != mapped.st_ino))
      throw_ledger_error(ledger_error::reason::mismatched, path, "its usage file was replaced while attaching");
    return held;
  }

  /// Drops the lock: in the process that took it. A child of it has no such mapping, and
  /// unmaps nothing (the address may hold something else there).
  void release() noexcept {
    if (base_ != nullptr && owner_ == ::getpid()) ::munmap(base_, bytes_);
    base_ = nullptr;
  }

 private:
  void* base_ = nullptr;  // the mapping that alone refers to the lock's description; nullptr: none
  std::size_t bytes_ = 0;
  pid_t owner_ = 0;  // the process that mapped it
};

}  // namespace vram::detail::ledger

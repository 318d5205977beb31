#pragma once
// The peak resident set of work run in a child process (fork, then wait4's ru_maxrss), so a
// test can compare what two sizes of the same work cost in memory, free of what the test
// process itself has held before.

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <stdexcept>

namespace vram::test {

/// Runs `work` in a child; its peak resident set in KiB. Throws std::runtime_error when the
/// child cannot run, or `work` returns false or throws.
inline long child_peak_kib(const std::function<bool()>& work) {
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    bool ok = false;
    try {
      ok = work();
    } catch (...) {
    }
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  rusage usage{};
  if (::wait4(pid, &status, 0, &usage) != pid) throw std::runtime_error("wait4 failed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("the child's work failed");
  return usage.ru_maxrss;
}

}  // namespace vram::test

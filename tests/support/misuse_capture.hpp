#pragma once
// Installs an error handler that records misuse reports for the duration of a scope, so a
// test can assert that bad input was reported (and how) instead of printed.

#include <atomic>
#include <mutex>
#include <vector>

#include <vram/core/error_handler.hpp>

namespace vram::test {

class misuse_capture {
 public:
  misuse_capture() { previous_ = set_error_handler(&record); }
  ~misuse_capture() { set_error_handler(previous_); clear(); }
  misuse_capture(const misuse_capture&) = delete;
  misuse_capture& operator=(const misuse_capture&) = delete;

  [[nodiscard]] static std::size_t count() {
    std::lock_guard lock(mutex());
    return reports().size();
  }
  [[nodiscard]] static std::size_t count(misuse kind) {
    std::lock_guard lock(mutex());
    std::size_t n = 0;
    for (const auto& r : reports()) n += r.kind == kind;
    return n;
  }
  [[nodiscard]] static misuse_report last() {
    std::lock_guard lock(mutex());
    return reports().back();
  }
  static void clear() {
    std::lock_guard lock(mutex());
    reports().clear();
  }

 private:
  static void record(const misuse_report& r) noexcept {
    std::lock_guard lock(mutex());
    reports().push_back(r);
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<misuse_report>& reports() {
    static std::vector<misuse_report> r;
    return r;
  }
  error_handler previous_;
};

}  // namespace vram::test

#pragma once
// What a test executable needs from outside the project (a browser, python3, zlib, CUDA),
// declared once at namespace scope in the test file:
//
//   static const vram::test::prerequisite chromium{"chromium (scripts/setup installs it)", [] { ... }};
//
// tests/main.cpp checks every declared prerequisite before Catch2 runs any case. Where one
// is missing, it says which and exits 77, which tests/CMakeLists.txt registers as
// SKIP_RETURN_CODE: CTest reports the executable as skipped, never as passed. Cases that
// need the prerequisite live in their own executable, so a missing tool skips only them.

#include <vector>

namespace vram::test {

class prerequisite {
 public:
  /// `what`: the thing needed and where it comes from; `available`: whether it is here.
  prerequisite(const char* what, bool (*available)()) : what_(what), available_(available) {
    all().push_back(this);
  }
  prerequisite(const prerequisite&) = delete;
  prerequisite& operator=(const prerequisite&) = delete;

  [[nodiscard]] const char* what() const noexcept { return what_; }
  [[nodiscard]] bool available() const { return available_(); }

  /// Every prerequisite declared in this executable, in declaration order.
  static std::vector<const prerequisite*>& all() {
    static std::vector<const prerequisite*> declared;
    return declared;
  }

 private:
  const char* what_;
  bool (*available_)();
};

}  // namespace vram::test

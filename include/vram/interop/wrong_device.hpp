#pragma once
// vram::wrong_device: a resource registered for one device was used while another device was
// current (see vram::device_registry).

#include <cstdio>

#include <vram/core/error.hpp>

namespace vram {

/// Thrown when memory is requested from a device's resource while a different device is
/// current: the memory would live on a device the calling code's kernels do not run on.
/// Carries both device ids; what() allocates nothing beyond the base class message.
class wrong_device : public invalid_argument {
 public:
  wrong_device(const char* resource, int expected, int actual)
      : invalid_argument("vram: resource used on the wrong device"), expected_(expected), actual_(actual) {
    std::snprintf(message_, sizeof message_, "vram: %s: resource of device %d used while device %d is current",
                  resource, expected, actual);
  }
  [[nodiscard]] const char* what() const noexcept override { return message_; }
  /// The device the resource belongs to.
  [[nodiscard]] int expected_device() const noexcept { return expected_; }
  /// The device that was current.
  [[nodiscard]] int current_device() const noexcept { return actual_; }

 private:
  char message_[160];
  int expected_;
  int actual_;
};

}  // namespace vram

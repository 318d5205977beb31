#pragma once
// What a name given to vram (a tenant's, a ledger's, a file's) may hold: text a person can
// read back and a C string holds whole. A NUL would cut it where it is stored (two names
// that differ after it would be one), and other control characters would garble every
// listing and message that prints it; such a name is refused before anything changes.

#include <string>
#include <string_view>

#include <vram/core/throw.hpp>

namespace vram::detail {

/// Whether `name` holds a NUL or another control character: a byte below 0x20, or 0x7f.
[[nodiscard]] constexpr bool has_control_character(std::string_view name) noexcept {
  for (char c : name) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7f) return true;
  }
  return false;
}
static_assert(has_control_character(std::string_view("a\0b", 3)) && has_control_character("a\tb") &&
              has_control_character("\x7f") && has_control_character("\x1f"));
static_assert(!has_control_character("") && !has_control_character("job/model-1.a_b ~") &&
              !has_control_character("\xc3\xa9"));  // UTF-8 is bytes of 0x80 and above: accepted

/// Throws vram::invalid_argument when `name` holds a control character; `what` says what the
/// name names ("a tenant path"). The message does not repeat the name: it would print it.
inline void check_name(const char* resource, const char* what, std::string_view name) {
  if (has_control_character(name)) [[unlikely]]
    throw_invalid_argument(resource, (std::string(what) + " holds a NUL or another control character").c_str());
}

}  // namespace vram::detail

#pragma once
// The single handler for misuse that cannot throw: deallocate() is noexcept, so a double
// free, a foreign pointer or a wrong size is reported here, and the resource leaves its
// state unchanged.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace vram {

/// What a caller did wrong.
enum class misuse {
  foreign_pointer,    ///< deallocate of a pointer this resource did not allocate (or already freed)
  double_free,        ///< deallocate of a block that is already free, where the resource can tell
  wrong_size,         ///< deallocate with a size other than the one allocated
  wrong_alignment,    ///< deallocate with an alignment other than the one allocated
  wrong_stream,       ///< use on a stream the resource is not bound to
  use_after_reset,    ///< deallocate of a block from before a reset()
  live_at_destruction,///< a resource destroyed while allocations are still live
  upstream_failure,   ///< an upstream release failed inside a noexcept path
};

[[nodiscard]] constexpr const char* to_string(misuse m) noexcept {
  switch (m) {
    case misuse::foreign_pointer: return "foreign pointer";
    case misuse::double_free: return "double free";
    case misuse::wrong_size: return "wrong size";
    case misuse::wrong_alignment: return "wrong alignment";
    case misuse::wrong_stream: return "wrong stream";
    case misuse::use_after_reset: return "use after reset";
    case misuse::live_at_destruction: return "live allocations at destruction";
    case misuse::upstream_failure: return "upstream failure";
  }
  return "misuse";
}

/// One report. `resource` is a string literal; sizes are 0 where they do not apply.
struct misuse_report {
  misuse kind;
  const char* resource;
  const void* pointer;
  std::size_t bytes;           ///< what the caller passed
  std::size_t expected_bytes;  ///< what the resource recorded (wrong_size), else 0
};

using error_handler = void (*)(const misuse_report&) noexcept;

/// The default handler writes one line to stderr and returns; the resource is unchanged.
inline void default_error_handler(const misuse_report& r) noexcept {
  if (r.kind == misuse::wrong_size)
    std::fprintf(stderr, "vram: %s in %s: pointer %p freed with %zu bytes, allocated with %zu\n", to_string(r.kind),
                 r.resource, r.pointer, r.bytes, r.expected_bytes);
  else if (r.kind == misuse::foreign_pointer)
    std::fprintf(stderr, "vram: %s in %s: pointer %p (%zu bytes) is not live here: never allocated by it, or "
                         "already freed (a double free)\n", to_string(r.kind), r.resource, r.pointer, r.bytes);
  else
    std::fprintf(stderr, "vram: %s in %s: pointer %p, %zu bytes\n", to_string(r.kind), r.resource, r.pointer, r.bytes);
}

namespace detail {
inline std::atomic<error_handler>& error_handler_slot() noexcept {
  static std::atomic<error_handler> slot{&default_error_handler};
  return slot;
}
}  // namespace detail

/// Installs `h` (nullptr restores the default) and returns the previous handler.
inline error_handler set_error_handler(error_handler h) noexcept {
  return detail::error_handler_slot().exchange(h ? h : &default_error_handler);
}

[[nodiscard]] inline error_handler get_error_handler() noexcept { return detail::error_handler_slot().load(); }

namespace detail {
/// How many misuse reports this thread has made. A free is noexcept and cannot say that it
/// was refused; an adaptor compares this count before and after passing a free upstream.
inline std::uint64_t& misuse_reports_on_this_thread() noexcept {
  static thread_local std::uint64_t count = 0;
  return count;
}
}  // namespace detail

/// Reports misuse through the installed handler. Cold: it is never on a correct program's path.
[[gnu::cold]] inline void report_misuse(const misuse_report& r) noexcept {
  ++detail::misuse_reports_on_this_thread();
  get_error_handler()(r);
}

}  // namespace vram

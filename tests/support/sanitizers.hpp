#pragma once
// Whether this build runs under AddressSanitizer or ThreadSanitizer. Resident-memory bounds
// are checked only without them: ASan keeps freed memory in its quarantine (256 MiB by
// default) and both add shadow memory, so a process's peak resident set then measures the
// sanitizer, not the code. The work still runs under them, for the memory and race checks.

namespace vram::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized_build = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool sanitized_build = true;
#else
inline constexpr bool sanitized_build = false;
#endif
#else
inline constexpr bool sanitized_build = false;
#endif

}  // namespace vram::test

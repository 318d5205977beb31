#pragma once
// vram::tag_scope: a short label for the allocations a thread makes in a scope (for example
// "layer12.attn"), recorded by the tracker next to the tenant.

#include <utility>

namespace vram {

namespace detail {
inline const char*& current_tag_slot() noexcept {
  thread_local const char* tag = "";
  return tag;
}
}  // namespace detail

/// The calling thread's current tag ("" outside any tag_scope).
[[nodiscard]] inline const char* current_tag() noexcept { return detail::current_tag_slot(); }

/// Sets the calling thread's tag until the scope ends (scopes nest). The string is not copied:
/// it must outlive the scope (a literal, or a string the caller keeps). Consumers that keep a
/// tag beyond the scope (the tracker) copy it.
class tag_scope {
 public:
  explicit tag_scope(const char* tag) noexcept
      : previous_(std::exchange(detail::current_tag_slot(), tag != nullptr ? tag : "")) {}
  ~tag_scope() { detail::current_tag_slot() = previous_; }
  tag_scope(const tag_scope&) = delete;
  tag_scope& operator=(const tag_scope&) = delete;

 private:
  const char* previous_;
};

}  // namespace vram

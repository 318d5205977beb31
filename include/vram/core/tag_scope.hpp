#pragma once
// vram::tag_scope: a short label for the allocations a thread makes in a scope (for example
// "layer12.attn"), recorded by the tracker next to the tenant.

#include <cstdint>
#include <utility>

namespace vram {

namespace detail {
/// A thread's tag, and how many times a tag_scope has set it: a consumer that remembers what
/// it made of the tag at one generation (the tracker, its copy of the string) may reuse that
/// while the generation is the same, without reading the string again.
struct tag_slot {
  const char* tag = "";
  std::uint64_t generation = 0;
};
inline tag_slot& current_tag_slot() noexcept {
  thread_local constinit tag_slot slot;
  return slot;
}
}  // namespace detail

/// The calling thread's current tag ("" outside any tag_scope).
[[nodiscard]] inline const char* current_tag() noexcept { return detail::current_tag_slot().tag; }

/// Sets the calling thread's tag until the scope ends (scopes nest). The string is not copied:
/// it must outlive the scope and stay unchanged during it (a literal, or a string the caller
/// keeps). Consumers that keep a tag beyond the scope (the tracker) copy it, once per scope.
class tag_scope {
 public:
  explicit tag_scope(const char* tag) noexcept : previous_(set(tag != nullptr ? tag : "")) {}
  ~tag_scope() { set(previous_); }
  tag_scope(const tag_scope&) = delete;
  tag_scope& operator=(const tag_scope&) = delete;

 private:
  static const char* set(const char* tag) noexcept {
    detail::tag_slot& slot = detail::current_tag_slot();
    ++slot.generation;
    return std::exchange(slot.tag, tag);
  }

  const char* previous_;
};

}  // namespace vram

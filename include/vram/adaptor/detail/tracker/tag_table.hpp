#pragma once
// The tags a tracker's records name, each kept once. A live record and an event hold a
// pointer to their tag's one copy instead of a string of their own, so recording a tag costs
// a pointer store, and a thread whose tag_scope has not changed since its last record finds
// that pointer without reading its tag at all (docs/observability.md, the tracker's cost).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <unordered_set>

#include <vram/core/tag_scope.hpp>

namespace vram::detail::tracker {

/// Not thread-safe: each tracker calls it under its mutex.
///
/// Invariants: every tag is kept at most once, and a kept tag's address never changes (the
/// set's nodes do not move); the untagged "" is nullptr, never kept. A thread's cache names a
/// kept tag only while the table's version and the thread's tag generation are those it was
/// filled at: versions are unique in the process (no two tables, even at one address, share
/// one), and collect() takes a new one before any tag goes.
class tag_table {
 public:
  /// The one copy of the calling thread's current tag (nullptr when untagged). When a tag
  /// is to be kept and the table is full(), calls `collect` first (which may collect()).
  /// Throws std::bad_alloc, having kept nothing new.
  template <class Collect>
  [[nodiscard, gnu::always_inline]] const std::string* current(Collect&& collect) {
    const tag_slot& slot = current_tag_slot();
    thread_cache& c = cache();
    if (c.version == version_ && c.generation == slot.generation) [[likely]]
      return c.tag;
    if (full()) collect();
    return refill(slot, c);
  }

  /// The one copy of `tag` (nullptr for ""). Throws std::bad_alloc, having kept nothing new.
  [[nodiscard]] const std::string* intern(std::string_view tag) {
    if (tag.empty()) return nullptr;
    auto it = tags_.find(tag);
    if (it == tags_.end()) it = tags_.emplace(tag).first;
    return &*it;
  }

  /// True when the tags kept have doubled since the last collect(): time to drop those no
  /// record names (the table's size stays within twice what the records name, plus a start).
  [[nodiscard]] bool full() const noexcept { return tags_.size() >= collect_at_; }

  /// Keeps only the tags `for_each_used` names: it calls its argument with every tag pointer a
  /// record holds. Without host memory for the marks nothing goes (the table only grows).
  template <class ForEachUsed>
  void collect(ForEachUsed&& for_each_used) noexcept {
    try {
      std::unordered_set<const std::string*> used;
      for_each_used([&](const std::string* t) {
        if (t != nullptr) used.insert(t);
      });
      version_ = next_version();  // before any tag goes: no cache may name one
      for (auto it = tags_.begin(); it != tags_.end();) it = used.contains(&*it) ? std::next(it) : tags_.erase(it);
    } catch (...) {
    }
    collect_at_ = std::max(first_collect, 2 * tags_.size());
  }

  [[nodiscard]] std::size_t size() const noexcept { return tags_.size(); }

 private:
  static constexpr std::size_t first_collect = 1024;

  /// The calling thread's last answer, for one table at a time.
  struct thread_cache {
    std::uint64_t version = 0;  // 0: none (versions count from 1)
    std::uint64_t generation = 0;
    const std::string* tag = nullptr;
  };
  static thread_cache& cache() noexcept {
    thread_local constinit thread_cache c;
    return c;
  }

  [[gnu::noinline]] const std::string* refill(const tag_slot& slot, thread_cache& c) {
    const std::string* t = intern(slot.tag);
    c = {version_, slot.generation, t};
    return t;
  }

  static std::uint64_t next_version() noexcept {
    static std::atomic<std::uint64_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  /// Transparent hashing: a lookup by string_view builds no string.
  struct hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  std::uint64_t version_ = next_version();
  std::unordered_set<std::string, hash, std::equal_to<>> tags_;
  std::size_t collect_at_ = first_collect;
};

}  // namespace vram::detail::tracker

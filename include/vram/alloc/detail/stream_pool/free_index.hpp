#pragma once
// detail::stream_pool::free_index: the free blocks of one stream key of a stream_pool, as segregated
// lists (TLSF-like) that still answer exact best fit: the smallest block of at least `need`
// bytes, the lowest address among equals.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace vram::detail::stream_pool {

/// Classes of block sizes: one per 256-B step below 32 KiB, then 64 per doubling, so a class
/// spans at most 1/64 of its sizes and holds few blocks. Each class keeps an intrusive list
/// sorted by (size, address); two levels of bitmaps find the first non-empty class at or above
/// a request's class in O(1).
///
/// Node needs the members `std::size_t size`, `std::uintptr_t addr`, `Node* free_prev`,
/// `Node* free_next` and `std::uint32_t free_class` (they belong to the index while the node
/// is in it; the class is kept so that an erase need not compute it again).
/// Complexity: best fit O(1) plus a walk of the request's own class; insert O(class length);
/// erase O(1).
/// Invariants: a listed node's free_class is class_of(its size) and it is in that list;
/// every class list is sorted by (size, address); bit c of the class bitmap is set
/// iff class c is non-empty; bit w of the summary iff word w of the bitmap is non-zero;
/// size() == the number of listed nodes.
template <class Node>
class free_index {
  static constexpr int quantum_log2 = 8;                  // 256-B blocks
  static constexpr int sub_log2 = 6;                      // 64 classes per doubling
  static constexpr std::size_t exact_classes = std::size_t{2} << sub_log2;  // below 128 quanta: one size each
  static constexpr int max_log2 = 63 - quantum_log2;      // largest quanta count's log2
  static constexpr std::size_t class_count =
      exact_classes + (static_cast<std::size_t>(max_log2 - sub_log2) << sub_log2);
  static constexpr std::size_t words = (class_count + 63) / 64;
  static_assert(words <= 64, "the summary is one 64-bit word");

 public:
  free_index() : heads_(std::make_unique<Node*[]>(class_count)) {}

  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }

  /// Adds n in (size, address) order within its class.
  void insert(Node* n) noexcept {
    std::size_t c = class_of(n->size);
    n->free_class = static_cast<std::uint32_t>(c);
    Node** link = &heads_[c];
    Node* prev = nullptr;
    while (*link != nullptr && before(*link, n)) {
      prev = *link;
      link = &prev->free_next;
    }
    n->free_prev = prev;
    n->free_next = *link;
    if (*link != nullptr) (*link)->free_prev = n;
    *link = n;
    bitmap_[c / 64] |= std::uint64_t{1} << (c % 64);
    summary_ |= std::uint64_t{1} << (c / 64);
    ++count_;
  }

  /// Removes n (pre: n is in this index).
  void erase(Node* n) noexcept {
    if (n->free_next != nullptr) n->free_next->free_prev = n->free_prev;
    if (n->free_prev != nullptr) {
      n->free_prev->free_next = n->free_next;
    } else {
      std::size_t c = n->free_class;
      heads_[c] = n->free_next;
      if (heads_[c] == nullptr && (bitmap_[c / 64] &= ~(std::uint64_t{1} << (c % 64))) == 0)
        summary_ &= ~(std::uint64_t{1} << (c / 64));
    }
    n->free_prev = n->free_next = nullptr;
    --count_;
  }

  /// The smallest node of at least `need` bytes (lowest address among equals), or nullptr.
  [[nodiscard]] Node* best_fit(std::size_t need) const noexcept {
    if (count_ == 0) return nullptr;  // common for a stream's index: no list to touch
    std::size_t c = class_of(need);
    for (Node* n = heads_[c]; n != nullptr; n = n->free_next)
      if (n->size >= need) return n;
    return first_from(c + 1);
  }

  /// The node after n in (size, address) order, or nullptr.
  [[nodiscard]] Node* next(const Node* n) const noexcept {
    return n->free_next != nullptr ? n->free_next : first_from(n->free_class + std::size_t{1});
  }

  /// The largest node, or nullptr.
  [[nodiscard]] Node* largest() const noexcept {
    if (summary_ == 0) return nullptr;
    std::size_t w = 63 - static_cast<std::size_t>(std::countl_zero(summary_));
    Node* n = heads_[w * 64 + 63 - static_cast<std::size_t>(std::countl_zero(bitmap_[w]))];
    while (n->free_next != nullptr) n = n->free_next;
    return n;
  }

  /// Calls f(node) for every node in (size, address) order; f must not change the index.
  template <class F>
  void for_each(F&& f) const {
    for (Node* n = first_from(0); n != nullptr; n = next(n)) f(n);
  }

  /// True when n is listed where its size says (walks that class; checks its kept class).
  [[nodiscard]] bool contains(const Node* n) const noexcept {
    if (n->free_class != class_of(n->size)) return false;
    for (const Node* x = heads_[n->free_class]; x != nullptr; x = x->free_next)
      if (x == n) return true;
    return false;
  }

 private:
  static bool before(const Node* a, const Node* b) noexcept {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  }

  /// Sizes map to classes monotonically: size a <= size b implies class_of(a) <= class_of(b).
  static std::size_t class_of(std::size_t bytes) noexcept {
    std::size_t q = bytes >> quantum_log2;
    if (q < exact_classes) return q;
    int log = std::bit_width(q) - 1;  // >= sub_log2 + 1
    std::size_t sub = (q >> (log - sub_log2)) & ((std::size_t{1} << sub_log2) - 1);
    return exact_classes + (static_cast<std::size_t>(log - sub_log2 - 1) << sub_log2) + sub;
  }

  /// The head of the first non-empty class at or above c, or nullptr.
  Node* first_from(std::size_t c) const noexcept {
    if (c >= class_count) return nullptr;
    std::size_t w = c / 64;
    if (std::uint64_t bits = bitmap_[w] & (~std::uint64_t{0} << (c % 64)))
      return heads_[w * 64 + static_cast<std::size_t>(std::countr_zero(bits))];
    std::uint64_t rest = w + 1 < 64 ? summary_ & (~std::uint64_t{0} << (w + 1)) : 0;
    if (rest == 0) return nullptr;
    w = static_cast<std::size_t>(std::countr_zero(rest));
    return heads_[w * 64 + static_cast<std::size_t>(std::countr_zero(bitmap_[w]))];
  }

  std::unique_ptr<Node*[]> heads_;           // class_count list heads
  std::array<std::uint64_t, words> bitmap_{};  // bit c: class c non-empty
  std::uint64_t summary_ = 0;                // bit w: bitmap_[w] != 0
  std::size_t count_ = 0;
};

}  // namespace vram::detail::stream_pool

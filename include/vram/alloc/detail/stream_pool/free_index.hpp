#pragma once
// detail::stream_pool::free_index: the free blocks of one stream key of a stream_pool, as segregated
// lists (TLSF-like) that still answer exact best fit: the smallest block of at least `need`
// bytes, the lowest address among equals.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <new>
#include <set>
#include <unordered_map>

namespace vram::detail::stream_pool {

/// Classes of block sizes: one per 256-B step below 32 KiB, then 64 per doubling, so a class
/// spans at most 1/64 of its sizes and usually holds few blocks. Each class keeps an intrusive
/// list sorted by (size, address); two levels of bitmaps find the first non-empty class at or
/// above a request's class in O(1). A class may still hold thousands of blocks of one size
/// (equal tensors, KV-cache pages): when a walk of a class reaches `walk_limit` nodes, the
/// class also gets an ordered set of its nodes, through which inserts and best fits there
/// find their place in O(log k); the set is dropped when the class shrinks below half the
/// limit (the hysteresis pays for each build: at least k / 2 operations on the class come
/// between two builds of a k-node set, so building costs O(log k) per operation, amortized).
///
/// Node needs the members `std::size_t size`, `std::uintptr_t addr`, `Node* free_prev`,
/// `Node* free_next` and `std::uint32_t free_class` (they belong to the index while the node
/// is in it; the class is kept so that an erase need not compute it again).
/// Complexity, k the length of the class concerned: best fit and insert O(min(k, walk_limit))
/// in a class without a set, O(log k) in one with a set; erase O(1), O(log k) with a set;
/// next() O(1). bench.pool_worst_case measures a class of 4,096 equal blocks beside the common
/// case. If memory for a set runs out, the class is walked instead: no answer depends on the
/// sets, and no operation fails.
/// Invariants: a listed node's free_class is class_of(its size) and it is in that list;
/// every class list is sorted by (size, address); bit c of `long_` is set iff class c has a
/// set, which then holds exactly its list's nodes, at least walk_limit / 2 of them; bit c of
/// the class bitmap is set iff class c is non-empty; bit w of the summary iff word w of the
/// bitmap is non-zero; size() == the number of listed nodes.
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
  /// A walk of a class that reaches this many nodes gives the class an ordered set.
  static constexpr std::uint32_t walk_limit = 64;

  free_index() : heads_(std::make_unique<Node*[]>(class_count)) {}

  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }

  /// Adds n in (size, address) order within its class.
  void insert(Node* n) noexcept {
    std::size_t c = class_of(n->size);
    n->free_class = static_cast<std::uint32_t>(c);
    Node** link = &heads_[c];
    Node* prev = nullptr;
    std::uint32_t walked = 0;
    if (has_set(c) && place_by_set(n, c, prev)) [[unlikely]] {
      if (prev != nullptr) link = &prev->free_next;
    } else {
      for (; *link != nullptr && before(*link, n); ++walked) {
        prev = *link;
        link = &prev->free_next;
      }
    }
    n->free_prev = prev;
    n->free_next = *link;
    if (*link != nullptr) (*link)->free_prev = n;
    *link = n;
    bitmap_[c / 64] |= std::uint64_t{1} << (c % 64);
    summary_ |= std::uint64_t{1} << (c / 64);
    ++count_;
    if (walked >= walk_limit) [[unlikely]]
      build_set(c);
  }

  /// Removes n (pre: n is in this index).
  void erase(Node* n) noexcept {
    if (has_set(n->free_class)) [[unlikely]]
      forget_in_set(n);
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
    if (has_set(c)) [[unlikely]]
      return fit_by_set(c, need);
    std::uint32_t walked = 0;
    for (Node* n = heads_[c]; n != nullptr; n = n->free_next, ++walked)
      if (n->size >= need) {
        if (walked >= walk_limit) [[unlikely]]
          build_set(c);
        return n;
      }
    if (walked >= walk_limit) [[unlikely]]
      build_set(c);
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

  // ---- long classes: their sets, out of line so that the short classes' paths stay small

  /// A long class's nodes in (size, address) order; lower_bound(need) finds the first node
  /// of at least `need` bytes.
  struct order {
    using is_transparent = void;
    bool operator()(const Node* a, const Node* b) const noexcept { return before(a, b); }
    bool operator()(const Node* a, std::size_t need) const noexcept { return a->size < need; }
    bool operator()(std::size_t need, const Node* a) const noexcept { return need < a->size; }
  };
  using ordered = std::set<Node*, order>;

  [[nodiscard]] bool has_set(std::size_t c) const noexcept { return (long_[c / 64] >> (c % 64)) & 1; }

  /// Gives class c a set holding its list (a cache of the list's order: best_fit, which is
  /// const, may build it). Without memory for it, nothing changes.
  [[gnu::noinline]] void build_set(std::size_t c) const noexcept {
    try {
      ordered& set = long_classes_.try_emplace(c).first->second;
      for (Node* x = heads_[c]; x != nullptr; x = x->free_next) set.insert(set.end(), x);
      long_[c / 64] |= std::uint64_t{1} << (c % 64);
    } catch (const std::bad_alloc&) {
      long_classes_.erase(c);
    }
  }
  void drop_set(std::size_t c) const noexcept {
    long_classes_.erase(c);
    long_[c / 64] &= ~(std::uint64_t{1} << (c % 64));
  }

  /// Places n (of class c, which has a set) through the set; `prev` is the node n goes after
  /// (nullptr: the head). False when memory for the set's node ran out: the set is dropped
  /// and the caller walks the list.
  [[gnu::noinline]] bool place_by_set(Node* n, std::size_t c, Node*& prev) noexcept {
    ordered& set = long_classes_.find(c)->second;
    try {
      auto it = set.insert(n).first;
      prev = it == set.begin() ? nullptr : *std::prev(it);
      return true;
    } catch (const std::bad_alloc&) {
      drop_set(c);
      return false;
    }
  }

  /// Takes n out of its class's set, and drops the set when the class gets short.
  [[gnu::noinline]] void forget_in_set(Node* n) noexcept {
    std::size_t c = n->free_class;
    ordered& set = long_classes_.find(c)->second;
    set.erase(n);
    if (set.size() < walk_limit / 2) drop_set(c);
  }

  /// Best fit through class c's set: its first node of at least `need` bytes, else the head
  /// of the next non-empty class.
  [[gnu::noinline]] Node* fit_by_set(std::size_t c, std::size_t need) const noexcept {
    const ordered& set = long_classes_.find(c)->second;
    auto at = set.lower_bound(need);
    return at != set.end() ? *at : first_from(c + 1);
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
  // The long classes' sets, and which classes have one. Mutable: a cache of the lists' order
  // that best_fit() may build.
  mutable std::unordered_map<std::size_t, ordered> long_classes_;
  mutable std::array<std::uint64_t, words> long_{};
  std::array<std::uint64_t, words> bitmap_{};  // bit c: class c non-empty
  std::uint64_t summary_ = 0;                // bit w: bitmap_[w] != 0
  std::size_t count_ = 0;
};

}  // namespace vram::detail::stream_pool

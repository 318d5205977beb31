#pragma once
// detail::flat_map: an open-addressing hash map from an address to a small value: stream_pool's
// block nodes (its O(1) deallocate lookup) and the adaptors' per-pointer records (faster than
// std::unordered_map: one probe sequence in one array, no node allocation). Keys are non-zero
// addresses; 0 marks an empty slot. The table grows and never shrinks.
//
// Linear probing with backward-shift deletion (no tombstones), load factor <= 1/4: runs stay
// so short that a lookup usually ends at the home slot and an erase moves nothing, so the
// loops' exits are predictable (at a load of 1/2 their exits mispredict far more often).
// 64-128 bytes of table per entry: about the size of the block it points to. Values are moved,
// never copied (a value may own memory: erase_at, noexcept, then allocates nothing).
// Invariant: size_ * 4 <= slots_.size(); every key sits in the probe run that starts at its hash.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace vram::detail {

template <class Value>
class flat_map {
 public:
  flat_map() { slots_.resize(16); }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  static constexpr std::size_t npos = ~std::size_t{0};

  /// The slot holding `key`, or npos (a slot stays valid until the next insert or erase).
  [[nodiscard, gnu::always_inline]] std::size_t locate(std::uintptr_t key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) return i;
      if (slots_[i].key == 0) return npos;
    }
  }
  [[nodiscard]] Value& at(std::size_t slot) noexcept { return slots_[slot].value; }

  /// The value stored for `key`, or nullptr.
  [[nodiscard, gnu::always_inline]] Value* find(std::uintptr_t key) noexcept {
    std::size_t i = locate(key);
    return i != npos ? &slots_[i].value : nullptr;
  }
  [[nodiscard, gnu::always_inline]] const Value* find(std::uintptr_t key) const noexcept {
    std::size_t i = locate(key);
    return i != npos ? &slots_[i].value : nullptr;
  }

  /// Inserts `key` (pre: non-zero); false, changing nothing, when it is present already.
  /// May throw std::bad_alloc when growing.
  bool insert(std::uintptr_t key, Value value) {
    if ((size_ + 1) * 4 > slots_.size()) grow();
    std::size_t i = home(key);
    for (; slots_[i].key != 0; i = (i + 1) & mask())
      if (slots_[i].key == key) return false;
    slots_[i] = slot{key, std::move(value)};
    ++size_;
    return true;
  }

  /// Removes `key` (pre: present).
  void erase(std::uintptr_t key) noexcept { erase_at(locate(key)); }

  /// Removes the entry in slot `at` (from locate()).
  void erase_at(std::size_t at) noexcept {
    std::size_t i = at;
    // Backward shift: move later members of the run into the hole when their home allows.
    for (std::size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      std::size_t h = home(slots_[j].key);
      // slots_[j] may move to i when i lies cyclically in [h, j).
      if (((j - h) & mask()) >= ((j - i) & mask())) {
        slots_[i] = std::move(slots_[j]);
        i = j;
      }
    }
    slots_[i] = slot{};
    --size_;
  }

  template <class F>
  void for_each(F&& f) const {
    for (const auto& s : slots_)
      if (s.key != 0) f(s.key, s.value);
  }

 private:
  struct slot {
    std::uintptr_t key = 0;
    Value value{};
  };

  [[nodiscard]] std::size_t mask() const noexcept { return slots_.size() - 1; }
  [[nodiscard]] std::size_t home(std::uintptr_t key) const noexcept {
    // Fibonacci hashing: the top bits of the product depend on every bit of the key (block
    // addresses share many low zero bits and high bits; the middle bits of the product do not
    // mix them, and linear probing then builds long runs).
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void place(std::uintptr_t key, Value&& value) noexcept {
    std::size_t i = home(key);
    while (slots_[i].key != 0) i = (i + 1) & mask();
    slots_[i] = slot{key, std::move(value)};
  }
  [[gnu::noinline]] void grow() {  // out of line: keeps insert() small enough to inline
    std::vector<slot> old(slots_.size() * 2);  // the only step that can throw
    old.swap(slots_);
    --shift_;
    for (auto& s : old)
      if (s.key != 0) place(s.key, std::move(s.value));
  }

  std::vector<slot> slots_;
  int shift_ = 64 - 4;  // 64 - log2(slots_.size())
  std::size_t size_ = 0;
};

}  // namespace vram::detail

#pragma once
// A pointer -> record map split into independently locked shards, so adaptors that must
// remember something per live allocation (its tenant, its size) do not serialise all threads
// behind one mutex. Each shard is an open-addressed table (detail::flat_map): no node is
// allocated per record.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>

#include <vram/detail/flat_map.hpp>

namespace vram::detail::adaptor {

template <class Record, std::size_t Shards = 16>
class adaptor_pointer_map {
  static_assert((Shards & (Shards - 1)) == 0, "Shards must be a power of two");

 public:
  /// Inserts p (not yet present). May throw std::bad_alloc.
  void insert(const void* p, const Record& r) {
    auto& s = shard(p);
    std::lock_guard lock(s.mutex);
    if (p != nullptr) s.map.insert(key(p), r);  // present already: the first record stays
  }

  /// Removes p if `accept(record)` says so; returns the record found (removed or not).
  template <class Accept>
  std::optional<Record> take_if(const void* p, Accept&& accept) noexcept {
    auto& s = shard(p);
    std::lock_guard lock(s.mutex);
    std::size_t slot = s.map.locate(key(p));
    if (slot == map_t::npos) return std::nullopt;
    Record r = s.map.at(slot);
    if (accept(r)) s.map.erase_at(slot);
    return r;
  }

  [[nodiscard]] std::optional<Record> find(const void* p) const {
    auto& s = shard(p);
    std::lock_guard lock(s.mutex);
    Record* r = s.map.find(key(p));
    if (r == nullptr) return std::nullopt;
    return *r;
  }

  [[nodiscard]] std::size_t size() const {
    std::size_t n = 0;
    for (auto& s : shards_) {
      std::lock_guard lock(s.mutex);
      n += s.map.size();
    }
    return n;
  }

  /// Calls f(pointer, record) for every entry, one shard locked at a time.
  template <class F>
  void for_each(F&& f) const {
    for (auto& s : shards_) {
      std::lock_guard lock(s.mutex);
      s.map.for_each([&](std::uintptr_t p, const Record& r) { f(reinterpret_cast<const void*>(p), r); });
    }
  }

 private:
  using map_t = flat_map<Record>;
  struct alignas(64) shard_t {
    mutable std::mutex mutex;
    map_t map;
  };
  static std::uintptr_t key(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }
  shard_t& shard(const void* p) const noexcept {
    // Allocations are at least 256-byte aligned: skip the always-zero bits, then mix.
    auto v = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p) >> 8);
    v *= 0x9e3779b97f4a7c15ull;
    return shards_[(v >> 40) & (Shards - 1)];
  }
  mutable std::array<shard_t, Shards> shards_;
};

}  // namespace vram::detail::adaptor

// detail::flat_map: random inserts, lookups and erases against std::unordered_map, on keys that
// share their low and high bits as block addresses do (long probe runs, backward shifts), with
// a value that owns memory (moved, never copied: a move-only value compiles).

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include <vram/detail/flat_map.hpp>

using vram::detail::flat_map;

namespace {

struct owned {  // move-only: flat_map must never copy a value
  std::unique_ptr<std::vector<int>> items;
};

std::uintptr_t key_of(std::uint64_t i) { return 0x7f0000000000u + i * 4096u; }  // 4 KiB-aligned, one high prefix

}  // namespace

TEST_CASE("flat_map: random inserts, finds and erases agree with std::unordered_map", "[detail][flat_map]") {
  std::mt19937_64 rng(GENERATE(1u, 2u, 3u));
  flat_map<owned> map;
  std::unordered_map<std::uintptr_t, int> model;  // key -> the value's first item
  std::vector<std::uintptr_t> keys;
  for (int step = 0; step < 20000; ++step) {
    const std::uint64_t roll = rng() % 10;
    if (roll < 5 || keys.empty()) {  // insert, sometimes a key that is present
      const std::uintptr_t k = key_of(rng() % 4096);
      const int v = static_cast<int>(rng() % 1000000);
      const bool added = map.insert(k, owned{std::make_unique<std::vector<int>>(3, v)});
      CHECK(added == (model.count(k) == 0));
      if (added) {
        model[k] = v;
        keys.push_back(k);
      }
    } else if (roll < 8) {  // erase a present key
      const std::size_t at = rng() % keys.size();
      const std::uintptr_t k = keys[at];
      const std::size_t slot = map.locate(k);
      REQUIRE(slot != map.npos);
      map.erase_at(slot);
      model.erase(k);
      keys[at] = keys.back();
      keys.pop_back();
    } else {  // look up, present or not
      const std::uintptr_t k = key_of(rng() % 4096);
      owned* v = map.find(k);
      auto it = model.find(k);
      REQUIRE((v != nullptr) == (it != model.end()));
      if (v != nullptr) {
        REQUIRE(v->items != nullptr);
        CHECK(v->items->size() == 3);
        CHECK((*v->items)[0] == it->second);
      }
    }
    REQUIRE(map.size() == model.size());
  }
  std::size_t seen = 0;
  map.for_each([&](std::uintptr_t k, const owned& v) {
    ++seen;
    auto it = model.find(k);
    REQUIRE(it != model.end());
    CHECK((*v.items)[0] == it->second);
  });
  CHECK(seen == model.size());
}

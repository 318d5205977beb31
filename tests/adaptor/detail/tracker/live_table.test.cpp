// detail::tracker::live_table (the tracker's live allocations by address) against a
// std::unordered_map model: random inserts and erases whose addresses collide in the index
// (a pool hands out neighbouring and reused addresses), with every lookup, the size and the
// set of records checked against the model after each operation.

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <vram/adaptor/detail/tracker/live_table.hpp>

namespace {

using vram::detail::tracker::live_record;
using vram::detail::tracker::live_table;

/// A payload derived from the size, to tell one record from another.
std::int64_t stamp(std::size_t bytes) { return static_cast<std::int64_t>(bytes) * 3 + 1; }

const void* address(std::uint64_t i) { return reinterpret_cast<const void*>(std::uintptr_t{0x10000} + i * 256); }

void check_against(const live_table& table, const std::unordered_map<const void*, std::size_t>& model) {
  REQUIRE(table.size() == model.size());
  std::size_t seen = 0;
  table.for_each([&](const live_record& r) {
    ++seen;
    auto it = model.find(r.address);
    REQUIRE(it != model.end());
    REQUIRE(r.bytes == it->second);
    REQUIRE(r.time_us == stamp(it->second));  // the record is the one its address was given
  });
  REQUIRE(seen == model.size());
}

}  // namespace

TEST_CASE("live_table: random inserts and erases agree with a map", "[adaptor][tracker]") {
  std::mt19937_64 rng(GENERATE(1u, 2u, 3u));
  live_table table;
  std::unordered_map<const void*, std::size_t> model;
  std::vector<const void*> live;
  const std::uint64_t space = GENERATE(64u, 4096u);  // few addresses: long probe runs and reuse
  for (int op = 0; op < 20000; ++op) {
    const bool insert = live.empty() || (rng() % 100 < (live.size() < 300 ? 60u : 40u));
    if (insert) {
      const void* p = address(rng() % space);
      if (model.contains(p)) {
        REQUIRE(table.contains(p));
        continue;
      }
      REQUIRE(table.find(p) == nullptr);
      live_record& r = table.insert(p);
      REQUIRE(r.address == p);
      r.bytes = 1 + rng() % 100000;
      r.time_us = stamp(r.bytes);
      model.emplace(p, r.bytes);
      live.push_back(p);
    } else {
      const std::size_t k = rng() % live.size();
      const void* p = live[k];
      live[k] = live.back();
      live.pop_back();
      live_record* r = table.find(p);
      REQUIRE(r != nullptr);
      REQUIRE(r->bytes == model.at(p));
      table.erase(p);
      model.erase(p);
      REQUIRE_FALSE(table.contains(p));
    }
    if (op % 97 == 0) {
      for (const void* q : live) REQUIRE(table.find(q) != nullptr);
      check_against(table, model);
    }
  }
  for (const void* p : live) table.erase(p);
  CHECK(table.size() == 0);
  table.for_each([](const live_record&) { FAIL("a record outlived its erase"); });
}

TEST_CASE("live_table: erasing what is not live changes nothing", "[adaptor][tracker]") {
  live_table table;
  table.erase(address(1));  // empty table
  table.insert(address(2)).bytes = 7;
  table.erase(address(3));
  table.erase(nullptr);
  CHECK(table.size() == 1);
  CHECK(table.find(address(2))->bytes == 7);
  CHECK_FALSE(table.contains(nullptr));
}

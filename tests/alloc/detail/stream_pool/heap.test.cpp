// detail::stream_pool::heap (stream_pool's best-fit heap) on its own, against a brute-force
// model of the address space: after every operation the heap's own check() holds, its blocks
// tile exactly the ranges it was given minus what it gave back, its free blocks are the
// model's free bytes fully coalesced, find_fit() is the model's best fit (smallest adequate
// block, lowest address among equals, the top block of a contiguous range last), and release()
// returns only free, granule-aligned memory. The heap never touches memory, so the ranges are
// plain numbers.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <vram/alloc/detail/stream_pool/heap.hpp>

namespace {

using vram::detail::stream_pool::block;
using vram::detail::stream_pool::block_state;
using vram::detail::stream_pool::heap;

constexpr std::size_t granule = std::size_t{64} << 10;

/// A byte-exact model: which addresses are held from the "upstream", and which are live.
struct model {
  std::map<std::uintptr_t, std::size_t> held;  // ranges the heap holds
  std::map<std::uintptr_t, std::size_t> live;  // blocks handed out (carved)

  /// Adds a range the upstream gave; with a contiguous upstream, merged with the one below
  /// (ranges only grow upwards), as the heap merges chunks.
  void hold(std::uintptr_t a, std::size_t n, bool contiguous) {
    if (contiguous && !held.empty()) {
      auto& last = *held.rbegin();
      if (last.first + last.second == a) {
        last.second += n;
        return;
      }
    }
    held.emplace(a, n);
  }
  [[nodiscard]] bool is_live(std::uintptr_t a) const {
    auto it = live.upper_bound(a);
    return it != live.begin() && a < std::prev(it)->first + std::prev(it)->second;
  }
  /// The free runs: held bytes not live, split where held ranges do not touch (hold() has
  /// merged the ranges that touch, as the heap merges chunks, when the upstream is contiguous).
  [[nodiscard]] std::vector<std::pair<std::uintptr_t, std::size_t>> free_runs() const {
    std::vector<std::pair<std::uintptr_t, std::size_t>> runs;
    for (auto [a, n] : held) {
      std::uintptr_t at = a, end = a + n;
      auto it = live.lower_bound(a);
      for (; it != live.end() && it->first < end; ++it) {
        if (it->first > at) runs.emplace_back(at, it->first - at);
        at = it->first + it->second;
      }
      if (at < end) runs.emplace_back(at, end - at);
    }
    return runs;
  }
};

void fail(const char* what) { throw std::logic_error(std::string("heap invariant: ") + what); }

/// The heap's blocks, in address order, checked against the model.
void check_against(const heap& h, const model& m) {
  std::vector<std::pair<std::uintptr_t, std::size_t>> free_blocks;
  std::size_t held = 0;
  h.check(fail, [&](const block* b) {
    if (b->state == block_state::free) {
      free_blocks.emplace_back(b->addr, b->size);
    } else {
      REQUIRE(m.live.count(b->addr) == 1);
    }
  });
  for (auto [a, n] : m.held) held += n;
  REQUIRE(h.reserved() == held);
  REQUIRE(free_blocks == m.free_runs());  // every free run is one block: fully coalesced
}

/// Best fit by brute force: the smallest run of at least `need`, lowest address among equals;
/// with a contiguous upstream the run at the very top of the held space only when nothing
/// else fits.
const std::pair<std::uintptr_t, std::size_t>* model_fit(const std::vector<std::pair<std::uintptr_t, std::size_t>>& runs,
                                                         const model& m, bool contiguous, std::size_t need) {
  std::uintptr_t top = m.held.empty() ? 0 : m.held.rbegin()->first + m.held.rbegin()->second;
  const std::pair<std::uintptr_t, std::size_t>* best = nullptr;
  auto rank = [&](const auto& r) { return std::tuple(contiguous && r.first + r.second == top, r.second, r.first); };
  for (const auto& r : runs)
    if (r.second >= need && (best == nullptr || rank(r) < rank(*best))) best = &r;
  return best;
}

}  // namespace

TEST_CASE("heap: best fit, coalescing, growth and release against a brute-force model", "[heap]") {
  for (bool contiguous : {true, false}) {
    for (std::uint64_t seed : {1u, 2u, 3u}) {
      CAPTURE(contiguous, seed);
      std::mt19937_64 rng(seed);
      heap h(contiguous, granule);
      model m;
      std::uintptr_t next = std::uintptr_t{1} << 40;  // the fake upstream's next address
      auto& any = h.any_stream();
      for (int op = 0; op < 1500; ++op) {
        std::size_t r = rng() % 100;
        if (r < 50) {  // allocate: best fit, or grow by a range (sometimes not adjacent)
          std::size_t bytes = 256 * (1 + rng() % (rng() % 4 == 0 ? 4096 : 64));
          auto runs = m.free_runs();
          const auto* expected = model_fit(runs, m, contiguous, bytes);
          block* b = h.find_fit(any, bytes);
          if (expected == nullptr) {
            REQUIRE(b == nullptr);
            std::size_t grow = (bytes + granule - 1) / granule * granule;
            if (rng() % 3 == 0) next += granule;  // a gap: the new range starts a chunk
            h.grow_by(grow, any, [&](std::size_t n) { return reinterpret_cast<void*>(std::exchange(next, next + n)); });
            m.hold(next - grow, grow, contiguous);
            runs = m.free_runs();
            expected = model_fit(runs, m, contiguous, bytes);
            b = h.find_fit(any, bytes);
            REQUIRE(expected != nullptr);
          }
          REQUIRE(b != nullptr);
          REQUIRE(b->addr == expected->first);
          REQUIRE(b->size == expected->second);
          block* carved = h.carve(b, bytes, 256);
          REQUIRE(carved->addr == expected->first);
          REQUIRE(carved->size == bytes);
          carved->state = block_state::live;
          m.live.emplace(carved->addr, bytes);
        } else if (r < 90 && !m.live.empty()) {  // free a random live block
          auto it = std::next(m.live.begin(), static_cast<long>(rng() % m.live.size()));
          block* b = nullptr;
          h.check(fail, [&](const block* x) {
            if (x->addr == it->first && x->state == block_state::live) b = const_cast<block*>(x);
          });
          REQUIRE(b != nullptr);
          h.free(b, any);
          m.live.erase(it);
        } else {  // release: only free memory goes back, granule-aligned
          std::vector<std::pair<std::uintptr_t, std::size_t>> returned;
          std::size_t released = h.release([&](std::uintptr_t a, std::size_t n) { returned.emplace_back(a, n); });
          std::size_t sum = 0;
          for (auto [a, n] : returned) {
            sum += n;
            REQUIRE(a % granule == 0);
            REQUIRE(n % granule == 0);
            for (std::uintptr_t x = a; x < a + n; x += 256) REQUIRE_FALSE(m.is_live(x));
            // Take [a, a + n) out of the model's held ranges.
            auto hit = std::prev(m.held.upper_bound(a));
            auto [start, size] = *hit;
            REQUIRE(a + n <= start + size);
            m.held.erase(hit);
            if (a > start) m.held.emplace(start, a - start);
            if (a + n < start + size) m.held.emplace(a + n, start + size - (a + n));
          }
          REQUIRE(released == sum);
          if (!contiguous)  // whole chunks only: every returned range was one grow_by's range
            for (auto [a, n] : returned) REQUIRE(n >= granule);
        }
        check_against(h, m);
      }
      h.clear([](std::uintptr_t, std::size_t) {});
      REQUIRE(h.chunks().empty());
    }
  }
}

TEST_CASE("heap: the top block of a contiguous range is taken last", "[heap]") {
  heap h(true, granule);
  auto& any = h.any_stream();
  std::uintptr_t next = std::uintptr_t{1} << 40;
  auto upstream = [&](std::size_t n) { return reinterpret_cast<void*>(std::exchange(next, next + n)); };
  h.grow_by(4 * granule, any, upstream);
  block* a = h.carve(h.find_fit(any, granule), granule, 256);  // [0, 1): live
  a->state = block_state::live;
  block* b = h.carve(h.find_fit(any, granule), granule, 256);  // [1, 2): live; [2, 4) free at the top
  b->state = block_state::live;
  h.free(a, any);  // [0, 1) free, below a live block
  block* fit = h.find_fit(any, 256);
  REQUIRE(fit->addr == next - 4 * granule);  // the low block, though the top one is larger too
  REQUIRE(h.is_wilderness(h.find_fit(any, 2 * granule)));  // only the top fits
  h.clear([](std::uintptr_t, std::size_t) {});
}

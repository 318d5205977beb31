// detail::stream_pool::free_index (stream_pool's best-fit index) against a brute-force model: best fit
// is the smallest adequate block, lowest address among equals; next() walks (size, address)
// order; largest(), size() and contains() agree with the model after every operation.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include <vram/alloc/detail/stream_pool/free_index.hpp>

namespace {

struct node {
  std::size_t size = 0;
  std::uintptr_t addr = 0;
  node* free_prev = nullptr;
  node* free_next = nullptr;
  std::uint32_t free_class = 0;
  bool listed = false;
};

bool before(const node* a, const node* b) { return a->size != b->size ? a->size < b->size : a->addr < b->addr; }

const node* model_best_fit(const std::vector<node*>& listed, std::size_t need) {
  const node* best = nullptr;
  for (const node* n : listed)
    if (n->size >= need && (best == nullptr || before(n, best))) best = n;
  return best;
}

// Sizes from every region of the class map: exact 256-B classes, the first geometric octaves,
// and very large blocks; repeated sizes are common (several blocks of one size).
std::size_t random_size(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return 256 * (1 + rng() % 127);                                 // exact classes
    case 1: return 256 * (128 + rng() % 4096);                              // 32 KiB .. 1 MiB
    case 2: return std::size_t{256} << (rng() % 32);                        // powers of two up to 512 GiB
    default: return std::size_t{1} << 21 << (rng() % 3);  // a few repeated sizes
  }
}

}  // namespace

/// Random inserts and erases (inserts `insert_percent(op)` % of the time) with sizes from
/// `size_of`, checked against the model after every operation.
template <class SizeOf, class InsertPercent>
void against_model(std::uint64_t seed, int ops, SizeOf&& size_of, InsertPercent&& insert_percent) {
  std::mt19937_64 rng(seed);
  vram::detail::stream_pool::free_index<node> index;
  std::vector<std::unique_ptr<node>> nodes;
  std::vector<node*> listed;
  for (int op = 0; op < ops; ++op) {
    if (listed.empty() || rng() % 100 < insert_percent(op)) {
      auto n = std::make_unique<node>();
      n->size = size_of(rng);
      // Distinct addresses (as in a pool), in an order unrelated to the sizes.
      n->addr = 256 * (1 + (static_cast<std::uintptr_t>(op) * 7919 + seed * 104729) % 1000003);
      n->listed = true;
      index.insert(n.get());
      listed.push_back(n.get());
      nodes.push_back(std::move(n));
    } else {
      std::size_t k = rng() % listed.size();
      node* n = listed[k];
      CHECK(index.contains(n));
      index.erase(n);
      n->listed = false;
      CHECK_FALSE(index.contains(n));
      listed[k] = listed.back();
      listed.pop_back();
    }
    REQUIRE(index.size() == listed.size());
    REQUIRE(index.empty() == listed.empty());
    for (int q = 0; q < 4; ++q) {
      std::size_t need = q == 0 && !listed.empty() ? listed[rng() % listed.size()]->size  // an exact size
                                                   : size_of(rng) - (rng() % 2) * 256;
      REQUIRE(index.best_fit(need) == model_best_fit(listed, need));
    }
    if (op % 100 == 0) {
      std::vector<node*> sorted = listed;
      std::sort(sorted.begin(), sorted.end(), before);
      std::vector<node*> walked;
      index.for_each([&](node* n) { walked.push_back(n); });
      REQUIRE(walked == sorted);
      for (std::size_t i = 0; i + 1 < sorted.size(); ++i) REQUIRE(index.next(sorted[i]) == sorted[i + 1]);
      if (!sorted.empty()) {
        CHECK(index.next(sorted.back()) == nullptr);
        CHECK(index.largest() == sorted.back());
      } else {
        CHECK(index.largest() == nullptr);
      }
    }
  }
}

TEST_CASE("free_index: exact best fit and order against a brute-force model", "[free_index]") {
  for (std::uint64_t seed : {1u, 2u, 3u}) against_model(seed, 3000, random_size, [](int) { return 55; });
}

TEST_CASE("free_index: long classes (many blocks of a few sizes) grow past the walk limit and shrink back",
          "[free_index]") {
  // Four sizes of one class (at 1 MiB a class spans 16 KiB), so the class holds hundreds of
  // nodes, and its ordered set is built, used and dropped as the population rises and falls.
  auto one_class = [](std::mt19937_64& rng) { return (std::size_t{1} << 20) + 256 * (rng() % 4); };
  auto waves = [](int op) { return (op / 400) % 2 == 0 ? 80 : 25; };  // up to ~240 nodes, then down to a few
  for (std::uint64_t seed : {1u, 2u}) against_model(seed, 2400, one_class, waves);
}

TEST_CASE("free_index: the largest sizes and the class boundaries", "[free_index]") {
  vram::detail::stream_pool::free_index<node> index;
  node huge{std::size_t{1} << 62, 256}, top{(std::size_t{1} << 56) - 256, 512}, edge{128 * 256, 768}, below{127 * 256, 1024};
  for (node* n : {&huge, &top, &edge, &below}) index.insert(n);
  CHECK(index.best_fit(1) == &below);
  CHECK(index.best_fit(127 * 256) == &below);
  CHECK(index.best_fit(127 * 256 + 1) == &edge);  // the first geometric class
  CHECK(index.best_fit(128 * 256 + 1) == &top);
  CHECK(index.best_fit((std::size_t{1} << 56) - 256) == &top);
  CHECK(index.best_fit((std::size_t{1} << 56) - 255) == &huge);
  CHECK(index.best_fit(~std::size_t{0} - 255) == nullptr);
  CHECK(index.largest() == &huge);
  index.erase(&huge);
  CHECK(index.largest() == &top);
  CHECK(index.best_fit((std::size_t{1} << 56) - 255) == nullptr);
}

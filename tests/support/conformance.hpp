#pragma once
// The conformance suite: behaviour every vram resource shares, written once and run over a
// list of fixtures (host resources in tests/conformance.test.cpp, CUDA resources in
// tests/cuda/conformance.test.cpp). Include after defining VRAM_CONFORMANCE_FIXTURES.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <vram/core/concepts.hpp>
#include <vram/core/error.hpp>
#include <vram/core/event.hpp>
#include <vram/core/resource_ref.hpp>

#include "support/misuse_capture.hpp"

namespace vram::test {

/// Snapshot of whatever the resource exposes, to prove "nothing changed".
template <class R>
auto observable_state(const R& r) {
  if constexpr (has_stats<R>) {
    auto s = r.stats();
    return std::vector<std::size_t>{s.live_bytes, s.reserved_bytes, s.live_allocations, s.total_allocations,
                                    s.total_deallocations, s.free_blocks, s.upstream_allocations};
  } else {
    return std::vector<std::size_t>{};
  }
}

template <class R>
void check_invariants_if_any(const R& r) {
  if constexpr (has_check_invariants<R>) r.check_invariants();
}

}  // namespace vram::test

#ifndef VRAM_CONFORMANCE_FIXTURES
#  error "define VRAM_CONFORMANCE_FIXTURES to a std::tuple of fixtures before including conformance.hpp"
#endif

TEMPLATE_LIST_TEST_CASE("conformance: models the concepts", "[conformance]", VRAM_CONFORMANCE_FIXTURES) {
  using R = decltype(TestType::make());
  STATIC_REQUIRE(vram::resource<R>);
  STATIC_REQUIRE(vram::synchronous_resource<R>);
  STATIC_REQUIRE(noexcept(std::declval<R&>().deallocate_sync(nullptr, 1, 256)));
  STATIC_REQUIRE(noexcept(std::declval<R&>().deallocate(vram::stream_ref{}, nullptr, 1, 256)));
}

TEMPLATE_LIST_TEST_CASE("conformance: allocations are aligned, distinct and disjoint", "[conformance]",
                        VRAM_CONFORMANCE_FIXTURES) {
  auto r = TestType::make();
  struct block {
    void* p;
    std::size_t bytes;
    std::size_t align;
  };
  std::vector<block> blocks;
  for (std::size_t bytes : {1ul, 7ul, 256ul, 1000ul, 4096ul, 65536ul, 1ul << 20}) {
    for (std::size_t align : {8ul, 64ul, 256ul}) {
      void* p = r.allocate_sync(bytes, align);
      REQUIRE(p != nullptr);
      CHECK(vram::is_aligned(p, std::max(align, vram::default_alignment)));
      blocks.push_back({p, bytes, align});
      if constexpr (TestType::host_accessible) std::memset(p, 0xab, bytes);
    }
  }
  std::sort(blocks.begin(), blocks.end(), [](auto& a, auto& b) { return a.p < b.p; });
  for (std::size_t i = 1; i < blocks.size(); ++i)
    CHECK(static_cast<char*>(blocks[i - 1].p) + blocks[i - 1].bytes <= static_cast<char*>(blocks[i].p));
  vram::test::check_invariants_if_any(r);
  for (auto& b : blocks) r.deallocate_sync(b.p, b.bytes, b.align);
  vram::test::check_invariants_if_any(r);
}

TEMPLATE_LIST_TEST_CASE("conformance: zero bytes gives nullptr and freeing nullptr does nothing", "[conformance]",
                        VRAM_CONFORMANCE_FIXTURES) {
  auto r = TestType::make();
  auto before = vram::test::observable_state(r);
  CHECK(r.allocate_sync(0) == nullptr);
  CHECK(r.allocate(vram::stream_ref{}, 0) == nullptr);
  r.deallocate_sync(nullptr, 0);
  r.deallocate(vram::stream_ref{}, nullptr, 0);
  CHECK(vram::test::observable_state(r) == before);
}

TEMPLATE_LIST_TEST_CASE("conformance: bad alignment and absurd sizes are typed errors that change nothing",
                        "[conformance]", VRAM_CONFORMANCE_FIXTURES) {
  auto r = TestType::make();
  void* keep = r.allocate_sync(512);
  auto before = vram::test::observable_state(r);
  CHECK_THROWS_AS(r.allocate_sync(256, 3), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate_sync(256, 0), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate_sync(256, std::size_t{1} << 40), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate_sync(~std::size_t{0}), vram::invalid_argument);
  CHECK_THROWS_AS(r.allocate_sync(vram::max_request_bytes + 1), vram::invalid_argument);
  CHECK(vram::test::observable_state(r) == before);
  vram::test::check_invariants_if_any(r);
  r.deallocate_sync(keep, 512);
}

TEMPLATE_LIST_TEST_CASE("conformance: a request beyond capacity is out_of_memory with the numbers",
                        "[conformance]", VRAM_CONFORMANCE_FIXTURES) {
  auto r = TestType::make();
  auto before = vram::test::observable_state(r);
  const std::size_t huge = std::size_t{1} << 52;  // 4 PiB: valid, but no machine has it
  try {
    (void)r.allocate_sync(huge);
    FAIL("expected out_of_memory");
  } catch (const vram::out_of_memory& e) {
    CHECK(e.bytes() == huge);
    CHECK(std::string(e.what()).find("out of memory") != std::string::npos);
    CHECK(e.resource() != nullptr);
  }
  CHECK(vram::test::observable_state(r) == before);
  vram::test::check_invariants_if_any(r);
}

TEMPLATE_LIST_TEST_CASE("conformance: foreign pointers are reported and change nothing", "[conformance]",
                        VRAM_CONFORMANCE_FIXTURES) {
  vram::test::misuse_capture capture;
  auto r = TestType::make();
  void* keep = r.allocate_sync(1024);
  auto before = vram::test::observable_state(r);
  alignas(256) static char foreign[1024];
  r.deallocate_sync(foreign, 1024);
  CHECK(capture.count() == 1);
  CHECK(capture.last().pointer == foreign);
  CHECK(vram::test::observable_state(r) == before);
  vram::test::check_invariants_if_any(r);
  r.deallocate_sync(keep, 1024);
  CHECK(capture.count() == 1);
}

TEMPLATE_LIST_TEST_CASE("conformance: double free is reported and changes nothing", "[conformance]",
                        VRAM_CONFORMANCE_FIXTURES) {
  vram::test::misuse_capture capture;
  auto r = TestType::make();
  void* a = r.allocate_sync(4096);
  void* b = r.allocate_sync(4096);
  r.deallocate_sync(a, 4096);
  auto before = vram::test::observable_state(r);
  r.deallocate_sync(a, 4096);
  CHECK(capture.count() == 1);
  CHECK(vram::test::observable_state(r) == before);
  vram::test::check_invariants_if_any(r);
  r.deallocate_sync(b, 4096);
  CHECK(capture.count() == 1);
}

TEMPLATE_LIST_TEST_CASE("conformance: stream-ordered use on several host streams and threads", "[conformance]",
                        VRAM_CONFORMANCE_FIXTURES) {
  // A fixture with `static constexpr bool single_stream = true` (activation_arena) is bound to
  // one stream and one thread by design; its own tests cover its stream use.
  if constexpr (requires { TestType::single_stream; }) {
    if (TestType::single_stream) return;
  }
  auto r = TestType::make();
  constexpr int threads = 4;
  constexpr int rounds = 200;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&r, t] {
      vram::host_stream stream;
      for (int i = 0; i < rounds; ++i) {
        std::size_t bytes = 256 + static_cast<std::size_t>((t * 7919 + i * 104729) % 65536);
        void* p = r.allocate(stream, bytes);
        if constexpr (TestType::host_accessible) {
          auto pattern = static_cast<unsigned char>(t * 31 + i);
          stream.enqueue([p, bytes, pattern] { std::memset(p, pattern, bytes); });
          stream.enqueue([p, bytes, pattern] {
            auto* c = static_cast<unsigned char*>(p);
            if (c[0] != pattern || c[bytes - 1] != pattern) throw std::runtime_error("corrupted block");
          });
        }
        r.deallocate(stream, p, bytes);
      }
      stream.synchronize();  // rethrows a corrupted-block error
    });
  }
  for (auto& w : workers) w.join();
  vram::test::check_invariants_if_any(r);
}

TEMPLATE_LIST_TEST_CASE("conformance: equality and type-erased references", "[conformance]",
                        VRAM_CONFORMANCE_FIXTURES) {
  auto r = TestType::make();
  CHECK(r == r);
  vram::resource_ref<> ref = r;
  CHECK(ref == vram::resource_ref<>(r));
  void* p = ref.allocate_sync(1000);
  CHECK(p != nullptr);
  ref.deallocate_sync(p, 1000);
}

// Fuzzes stream_pool<fault_injection_adaptor<host_source>>: allocate / deallocate on three host streams
// and the synchronous stream, cross-stream frees after an event, release(), injected upstream
// failures, and deliberate misuse (double free, interior pointer, wrong size), against the
// reference model; invariants, non-overlap and block contents are checked after every step.

#include <memory>

#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/adaptor/fault_injection_adaptor.hpp>
#include <vram/source/host_source.hpp>

#include "fuzz_common.hpp"

using namespace vram::fuzz;
using source = vram::fault_injection_adaptor<vram::host_source>;

namespace {
vram::stream_ref stream_of(std::size_t i) {
  static vram::host_stream streams[3];  // idle between inputs: created once
  return i == 0 ? vram::stream_ref{} : vram::stream_ref(streams[i - 1]);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  misuse_counter misuse;
  source upstream{vram::host_source{}};
  vram::stream_pool_options options{
      .initial_size = in.ConsumeBool() ? std::size_t{1} << 20 : 0,
      .maximum_size = in.ConsumeBool() ? std::size_t{16} << 20 : 0,
      .growth_step = std::size_t{1} << in.ConsumeIntegralInRange<int>(16, 22),
      .small_max = in.ConsumeBool() ? 0 : std::size_t{1} << in.ConsumeIntegralInRange<int>(8, 20),
      .lane_cache_bytes = std::size_t{1} << in.ConsumeIntegralInRange<int>(10, 22),
      .bin_capacity = in.ConsumeIntegralInRange<std::size_t>(1, 16)};
  {
    vram::stream_pool<source> pool(upstream, options);
    model m;
    std::vector<void*> freed;  // recently freed pointers, for misuse
    std::size_t expected_reports = 0;
    while (in.remaining_bytes() > 0) {
      switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0: case 1: case 2: case 3: {  // allocate
          if (m.size() >= 64) break;
          std::size_t bytes = fuzz_size(in, std::size_t{2} << 20);
          std::size_t align = fuzz_alignment(in);
          std::size_t s = in.ConsumeIntegralInRange<std::size_t>(0, 3);
          try {
            void* p = pool.allocate(stream_of(s), bytes, align);
            if (bytes == 0) VRAM_FUZZ_CHECK(p == nullptr);
            else m.add(p, bytes, std::max(align, vram::default_alignment), s, true);
          } catch (const vram::out_of_memory&) {
            VRAM_FUZZ_CHECK(bytes != 0);
          }
          break;
        }
        case 4: case 5: case 6: {  // deallocate, on its own stream or another one after an event
          if (m.empty()) break;
          auto [p, b] = m.pick(in.ConsumeIntegral<std::size_t>());
          std::size_t s = b.stream;
          if (in.ConsumeBool()) {
            std::size_t t = in.ConsumeIntegralInRange<std::size_t>(0, 3);
            vram::event e;
            e.record(stream_of(s));
            e.make_wait(stream_of(t));
            s = t;
          }
          m.take(p, true);
          pool.deallocate(stream_of(s), p, b.bytes, b.align);
          freed.push_back(p);
          if (freed.size() > 16) freed.erase(freed.begin());
          break;
        }
        case 7:  // release
          pool.release();
          break;
        case 8: {  // upstream faults from now on
          upstream.set_plan({.fail_call = in.ConsumeIntegralInRange<std::size_t>(0, 4),
                             .sticky = in.ConsumeBool(),
                             .byte_budget = in.ConsumeBool() ? ~std::size_t{0} : std::size_t{8} << 20});
          break;
        }
        case 9: {  // misuse: must be reported and change nothing
          auto before = pool.stats();
          int kind = in.ConsumeIntegralInRange<int>(0, 2);
          if (kind == 0 && !freed.empty()) {
            void* p = freed[in.ConsumeIntegralInRange<std::size_t>(0, freed.size() - 1)];
            if (m.inside_live(p)) break;  // handed out again: not a double free any more
            pool.deallocate(stream_of(0), p, 256);
          } else if (kind == 1 && !m.empty()) {
            auto [p, b] = m.pick(in.ConsumeIntegral<std::size_t>());
            if (b.bytes < 512) break;
            pool.deallocate(stream_of(b.stream), p + 256, 256);  // interior pointer
          } else if (kind == 2 && !m.empty()) {
            auto [p, b] = m.pick(in.ConsumeIntegral<std::size_t>());
            pool.deallocate(stream_of(b.stream), p, b.bytes + 1);  // wrong size
          } else {
            break;
          }
          ++expected_reports;
          VRAM_FUZZ_CHECK(misuse_counter::reports == expected_reports);
          auto after = pool.stats();
          VRAM_FUZZ_CHECK(after.live_bytes == before.live_bytes);
          VRAM_FUZZ_CHECK(after.live_allocations == before.live_allocations);
          VRAM_FUZZ_CHECK(after.reserved_bytes == before.reserved_bytes);
          break;
        }
      }
      check(pool, m);
      VRAM_FUZZ_CHECK(pool.stats().reserved_bytes == upstream.live_bytes());
    }
    m.verify_all();
    for (const auto& [p, b] : m.blocks()) pool.deallocate(stream_of(b.stream), p, b.bytes, b.align);
    m.clear();
    check(pool, m);
    VRAM_FUZZ_CHECK(pool.stats().live_bytes == 0);
    for (std::size_t i = 1; i <= 3; ++i) vram::synchronize(stream_of(i));
  }
  VRAM_FUZZ_CHECK(upstream.live_bytes() == 0);  // the pool gave back everything it took
  return 0;
}

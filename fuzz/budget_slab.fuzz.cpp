// Fuzzes budget_slab<host_source, fault_injection_adaptor<host_source>>: allocate / deallocate within
// and beyond a small device budget, spill-budget changes, a pressure callback that frees a
// block, injected spill failures and misuse (double free, wrong size class), against the
// reference model. Also checked: every block's residency, and that the device side never
// holds more than its budget.

#include <vram/alloc/budget_slab.hpp>
#include <vram/adaptor/fault_injection_adaptor.hpp>
#include <vram/source/host_source.hpp>

#include "fuzz_common.hpp"

using namespace vram::fuzz;
using spill_source = vram::fault_injection_adaptor<vram::host_source>;
using slab_type = vram::budget_slab<vram::host_source, spill_source>;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  misuse_counter misuse;
  spill_source spill{vram::host_source{}};
  std::size_t budget = std::size_t{64} << in.ConsumeIntegralInRange<int>(10, 14);  // 64 KiB .. 1 MiB
  {
    slab_type slab(vram::host_source{}, spill, {.device_budget = budget});
    model m;
    std::vector<void*> freed;
    std::size_t expected_reports = 0;
    bool pressure_frees = false;
    slab.set_pressure_callback([&](std::size_t) {
      if (!pressure_frees || m.empty()) return false;
      auto [p, b] = m.pick(0);
      m.take(p, true);
      slab.deallocate_sync(p, b.bytes, b.align);
      return true;
    });
    while (in.remaining_bytes() > 0) {
      switch (in.ConsumeIntegralInRange<int>(0, 8)) {
        case 0: case 1: case 2: case 3: {
          if (m.size() >= 96) break;
          std::size_t bytes = fuzz_size(in, budget * 2);
          std::size_t align = std::size_t{1} << in.ConsumeIntegralInRange<int>(0, 16);
          try {
            void* p = slab.allocate_sync(bytes, align);
            if (bytes == 0) {
              VRAM_FUZZ_CHECK(p == nullptr);
            } else {
              m.add(p, bytes, std::max(align, vram::default_alignment), 0, true);
              VRAM_FUZZ_CHECK(slab.residency(p) != vram::residency::none);
            }
          } catch (const vram::out_of_memory&) {
            VRAM_FUZZ_CHECK(bytes != 0);
          }
          break;
        }
        case 4: case 5: {
          if (m.empty()) break;
          auto [p, b] = m.pick(in.ConsumeIntegral<std::size_t>());
          m.take(p, true);
          slab.deallocate_sync(p, b.bytes, b.align);
          freed.push_back(p);
          if (freed.size() > 16) freed.erase(freed.begin());
          break;
        }
        case 6:
          slab.set_spill_budget(in.ConsumeBool() ? ~std::size_t{0} : in.ConsumeIntegralInRange<std::size_t>(0, budget));
          pressure_frees = in.ConsumeBool();
          break;
        case 7:
          spill.set_plan({.fail_call = in.ConsumeIntegralInRange<std::size_t>(0, 3), .sticky = in.ConsumeBool()});
          break;
        case 8: {  // misuse
          auto before = slab.stats();
          if (in.ConsumeBool() && !freed.empty()) {
            void* p = freed[in.ConsumeIntegralInRange<std::size_t>(0, freed.size() - 1)];
            if (m.inside_live(p)) break;
            slab.deallocate_sync(p, 256);
          } else if (!m.empty()) {
            auto [p, b] = m.pick(in.ConsumeIntegral<std::size_t>());
            std::size_t wrong = b.bytes * 4 + 65536;  // another class, another run length
            slab.deallocate_sync(p, wrong, b.align);
          } else {
            break;
          }
          ++expected_reports;
          VRAM_FUZZ_CHECK(misuse_counter::reports == expected_reports);
          auto after = slab.stats();
          VRAM_FUZZ_CHECK(after.live_bytes == before.live_bytes);
          VRAM_FUZZ_CHECK(after.live_allocations == before.live_allocations);
          break;
        }
      }
      check(slab, m);
      auto st = slab.stats();
      VRAM_FUZZ_CHECK(st.reserved_bytes == slab.device_budget() + st.spilled_bytes);
      VRAM_FUZZ_CHECK(st.spilled_bytes == spill.live_bytes());
    }
    m.verify_all();
    for (const auto& [p, b] : m.blocks()) slab.deallocate_sync(p, b.bytes, b.align);
    m.clear();
    check(slab, m);
  }
  VRAM_FUZZ_CHECK(spill.live_bytes() == 0);
  return 0;
}

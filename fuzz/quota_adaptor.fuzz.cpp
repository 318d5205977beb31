// Fuzzes quota_adaptor<fault_injection_adaptor<host_source>> over a small tenant tree: allocations for
// random tenants, frees, hard-limit changes and upstream failures, against an exact model of
// usage: a request succeeds iff it fits under the hard limit of the tenant and of every
// ancestor (and the upstream did not fail); usage and peaks never pass a limit in force.

#include <array>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/core/error.hpp>
#include <vram/adaptor/fault_injection_adaptor.hpp>
#include <vram/source/host_source.hpp>

#include "fuzz_common.hpp"

using namespace vram::fuzz;
using source = vram::fault_injection_adaptor<vram::host_source>;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  misuse_counter misuse;
  auto registry = std::make_shared<vram::tenant_registry>();
  // two roots: default (tenant::none) and job -> {model_a, model_b}; model_a -> layer
  vram::tenant job = registry->create("job");
  vram::tenant model_a = registry->create("model_a", &job);
  vram::tenant model_b = registry->create("model_b", &job);
  vram::tenant layer = registry->create("layer", &model_a);
  const std::array<vram::tenant, 5> tenants{vram::tenant::none(), job, model_a, model_b, layer};
  const std::array<int, 5> parent{-1, -1, 1, 1, 2};
  std::array<std::size_t, 5> usage{}, limit;
  limit.fill(vram::quota_adaptor<source>::unlimited);
  source upstream{vram::host_source{}};
  {
    vram::quota_adaptor<source> q(upstream, registry);
    model m;
    std::map<void*, int> owner;
    while (in.remaining_bytes() > 0) {
      switch (in.ConsumeIntegralInRange<int>(0, 6)) {
        case 0: case 1: case 2: {
          if (m.size() >= 64) break;
          int t = in.ConsumeIntegralInRange<int>(0, 4);
          std::size_t bytes = fuzz_size(in, 1 << 20);
          bool fits = true;  // zero bytes always "fits": nullptr, nothing reserved
          if (bytes != 0)
            for (int k = t; k != -1; k = parent[k]) fits &= usage[k] + bytes <= limit[k];
          std::size_t failures = upstream.failures();
          try {
            void* p = q.allocate(vram::stream_ref{}, bytes, vram::default_alignment, tenants[t]);
            VRAM_FUZZ_CHECK(fits);
            if (bytes == 0) {
              VRAM_FUZZ_CHECK(p == nullptr);
              break;
            }
            m.add(p, bytes, vram::default_alignment, 0, true);
            owner[p] = t;
            for (int k = t; k != -1; k = parent[k]) usage[k] += bytes;
          } catch (const vram::quota_exceeded& e) {
            VRAM_FUZZ_CHECK(!fits);
            VRAM_FUZZ_CHECK(e.usage() + bytes > e.limit());
          } catch (const vram::out_of_memory&) {
            VRAM_FUZZ_CHECK(upstream.failures() == failures + 1);  // only the injected failure
          }
          break;
        }
        case 3: case 4: {
          if (m.empty()) break;
          auto [p, b] = m.pick(in.ConsumeIntegral<std::size_t>());
          m.take(p, true);
          for (int k = owner[p]; k != -1; k = parent[k]) usage[k] -= b.bytes;
          owner.erase(p);
          q.deallocate(vram::stream_ref{}, p, b.bytes);
          break;
        }
        case 5: {
          int t = in.ConsumeIntegralInRange<int>(0, 4);
          limit[t] = in.ConsumeBool() ? vram::quota_adaptor<source>::unlimited
                                      : in.ConsumeIntegralInRange<std::size_t>(0, 4 << 20);
          q.set_hard_limit(tenants[t], limit[t]);
          break;
        }
        case 6:
          upstream.set_plan({.fail_call = in.ConsumeIntegralInRange<std::size_t>(0, 3)});
          break;
      }
      q.check_invariants();
      for (int k = 0; k < 5; ++k) VRAM_FUZZ_CHECK(q.usage(tenants[k]) == usage[k]);
      VRAM_FUZZ_CHECK(upstream.live_bytes() == m.bytes());
    }
    m.verify_all();
    for (const auto& [p, b] : m.blocks()) q.deallocate(vram::stream_ref{}, p, b.bytes);
    for (int k = 0; k < 5; ++k) VRAM_FUZZ_CHECK(q.usage(tenants[k]) == 0);
    VRAM_FUZZ_CHECK(misuse_counter::reports == 0);
  }
  VRAM_FUZZ_CHECK(upstream.live_bytes() == 0);
  return 0;
}

// Per-tenant quotas on one (simulated) GPU: a job with two models under it, hard limits that
// refuse before the device is touched, a soft limit that warns once per crossing, and a
// limit lowered at run time. Runs anywhere: the "GPU" is a simulated_device_source.
#include <cstdio>
#include <memory>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/core/error.hpp>
#include <vram/source/simulated_device_source.hpp>

int main() {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  auto registry = std::make_shared<vram::tenant_registry>();
  vram::tenant job = registry->create("job");
  vram::tenant llm = registry->create("llm", job);
  vram::tenant vision = registry->create("vision", job);

  vram::simulated_device_source gpu(vram::simulated_device_options{.capacity = 1024 * MiB, .granularity = 2 * MiB});
  vram::quota_adaptor<vram::simulated_device_source> mr(gpu, registry);
  mr.set_hard_limit(job, 512 * MiB);     // the whole job
  mr.set_hard_limit(llm, 384 * MiB);     // one model within it
  mr.set_soft_limit(vision, 96 * MiB);   // a warning, not a refusal
  mr.set_soft_limit_callback([&](vram::tenant t, std::size_t soft, std::size_t usage) {
    std::printf("soft limit: %s uses %zu MiB (soft limit %zu MiB)\n", registry->name(t), usage / MiB, soft / MiB);
  });

  std::vector<std::pair<void*, std::size_t>> held;
  {
    vram::tenant_scope scope(llm);  // everything this thread allocates now is the llm's
    for (int i = 0; i < 3; ++i) held.emplace_back(mr.allocate_sync(100 * MiB), 100 * MiB);
    try {
      (void)mr.allocate_sync(100 * MiB);  // 400 MiB > the llm's 384 MiB
    } catch (const vram::quota_exceeded& e) {
      std::printf("refused: %s\n", e.what());
    }
  }
  // An explicit tenant argument overrides the scope.
  held.emplace_back(mr.allocate(vram::stream_ref{}, 128 * MiB, 256, vision), 128 * MiB);
  std::printf("usage: job %zu MiB, llm %zu MiB, vision %zu MiB\n", mr.usage(job) / MiB, mr.usage(llm) / MiB,
              mr.usage(vision) / MiB);

  // Lower the job's limit below its usage: new requests are refused, frees still work.
  mr.set_hard_limit(job, 256 * MiB);
  try {
    (void)mr.allocate(vram::stream_ref{}, MiB, 256, vision);
  } catch (const vram::quota_exceeded& e) {
    std::printf("refused after lowering the job limit: tenant %s, limit %zu MiB, usage %zu MiB\n", e.tenant_name(),
                e.limit() / MiB, e.usage() / MiB);
  }
  for (auto [p, n] : held) mr.deallocate_sync(p, n);  // no tenant needed: recorded per pointer
  std::printf("after frees: job %zu MiB (peak %zu MiB)\n", mr.usage(job) / MiB, mr.peak_usage(job) / MiB);
  return mr.usage(job) == 0 ? 0 : 1;
}

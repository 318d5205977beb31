// docs/quotas.md: hierarchical hard and soft limits.
#include <cstdio>
#include <memory>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/source/cuda_async_source.hpp>

void use(vram::stream_ref stream, std::size_t bytes) {
  // [snippet]
  auto reg = std::make_shared<vram::tenant_registry>();
  auto job = reg->create("job"), llm = reg->create("llm", job);
  vram::quota_adaptor<vram::cuda_async_source> mr(vram::cuda_async_source{}, reg);
  mr.set_hard_limit(job, 60ull << 30);      // refuse beyond 60 GiB for the whole job
  mr.set_hard_limit(llm, 40ull << 30);      // and 40 GiB for the llm inside it
  mr.set_soft_limit(llm, 32ull << 30);      // warn above 32 GiB
  mr.set_soft_limit_callback([](vram::tenant, std::size_t soft, std::size_t usage) {
    std::fprintf(stderr, "llm above its soft limit: %zu of %zu bytes\n", usage, soft);
  });
  {
    vram::tenant_scope s(llm);              // allocations in this scope count for llm (and job)
    void* p = mr.allocate(stream, bytes);   // vram::quota_exceeded beyond a hard limit
    mr.deallocate(stream, p, bytes);
  }
  // [/snippet]
}

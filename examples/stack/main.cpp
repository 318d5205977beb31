// The stack a CUDA program or a framework assembles: one pool, then statistics, per-tenant
// quotas and a tracker over it, all built by value over vram::ref(pool), and the top of the
// stack handed to code that wants an allocator (a thrust allocator here; cuda::mr with CUDA).
// Two tenants allocate on several streams; the top of the stack reports everything the pool
// knows (reserved bytes, free blocks) with the tenants' usage, releases through every layer,
// and writes a PyTorch memory snapshot.
//
//   stack [output-directory]     (default: the current directory)
#include <cstdio>
#include <string>
#include <vector>

#include <vram/adaptor/quota_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/core/ref.hpp>
#include <vram/interop/thrust.hpp>
#include <vram/source/simulated_device_source.hpp>

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  constexpr std::size_t MiB = std::size_t{1} << 20;

  // An 80 GiB "GPU" that grows in place like cuda_vmm_source (expandable segments), so free
  // space never strands between segments; on a GPU use vram::cuda_vmm_source instead.
  vram::simulated_device_source gpu(
      vram::simulated_device_options{.capacity = std::size_t{80} << 30, .granularity = 2 * MiB, .contiguous = true});
  vram::stream_pool<vram::simulated_device_source> pool(gpu);

  auto tenants = std::make_shared<vram::tenant_registry>();
  vram::tenant serving = tenants->create("serving");
  vram::tenant batch = tenants->create("batch");

  // pool <- statistics <- quota <- tracker: each layer holds the one below by value.
  vram::tracker_adaptor top{vram::quota_adaptor{vram::statistics_adaptor{vram::ref(pool)}, tenants},
                            vram::tracker_options{.registry = tenants}};
  auto& quotas = top.upstream();
  quotas.set_hard_limit(batch, 8 * MiB);  // batch work may not crowd out serving

  vram::host_stream streams[3];
  struct block {
    void* p;
    std::size_t bytes;
    vram::host_stream* stream;
  };
  std::vector<block> held;
  for (int i = 0; i < 24; ++i) {
    vram::tenant_scope who(i % 2 == 0 ? serving : batch);
    vram::host_stream& s = streams[i % 3];
    std::size_t bytes = (i % 4 == 0 ? 6 : 1) * MiB + 4096 * i;
    try {
      held.push_back({top.allocate(s, bytes), bytes, &s});
    } catch (const vram::quota_exceeded& e) {
      std::printf("refused: %s\n", e.what());
    }
  }
  // Temporary storage for a thrust/CUB algorithm, from the same stack, on one stream.
  vram::thrust_allocator temp(top, streams[0]);
  char* scratch = temp.allocate(256 * 1024);
  temp.deallocate(scratch, 256 * 1024);

  vram::stats st = top.stats();
  std::printf("top of the stack: %zu live allocations, %.1f MiB requested, %.1f MiB reserved by the pool, "
              "%zu free blocks\n",
              st.live_allocations, st.requested_bytes / double(MiB), st.reserved_bytes / double(MiB), st.free_blocks);
  std::printf("usage: serving %.1f MiB, batch %.1f MiB (limit 8 MiB, %zu refusals)\n",
              quotas.usage(serving) / double(MiB), quotas.usage(batch) / double(MiB), quotas.refusals(batch));

  const std::string snapshot = dir + "/stack-snapshot.pickle";
  if (!top.dump(snapshot)) {
    std::printf("cannot write %s\n", snapshot.c_str());
    return 1;
  }
  std::printf("wrote %s (open it at pytorch.org/memory_viz)\n", snapshot.c_str());

  for (const block& b : held) top.deallocate(*b.stream, b.p, b.bytes);  // on the stream that used it
  for (auto& s : streams) s.synchronize();
  std::size_t released = top.release();  // through tracker, quota and statistics to the pool
  std::printf("released %.1f MiB through the stack; the pool now reserves %.1f MiB\n", released / double(MiB),
              pool.stats().reserved_bytes / double(MiB));
  top.check_invariants();
  return st.reserved_bytes > 0 && pool.stats().reserved_bytes == 0 ? 0 : 1;
}

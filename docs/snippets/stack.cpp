// docs/observability.md: the adaptor stack over one pool, each layer by value.
#include <ostream>

#include <vram/adaptor/retry_adaptor.hpp>
#include <vram/adaptor/statistics_adaptor.hpp>
#include <vram/adaptor/tracker_adaptor.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/ref.hpp>
#include <vram/source/cuda_device_source.hpp>

void use(vram::stream_ref stream, std::size_t bytes) {
  // [snippet]
  vram::stream_pool<vram::cuda_device_source> pool{vram::cuda_device_source{}};
  vram::tracker_adaptor tracker{vram::statistics_adaptor{vram::ref(pool)}};
  vram::retry_adaptor mr{tracker, {.dump_path = "oom.txt",
                                   .dump_writer = [tracker](std::ostream& out) { tracker.write_report(out); }}};
  mr.add_release(pool);                          // on OOM: give the pool's free memory back, retry
  void* p = mr.allocate(stream, bytes);
  mr.stats().reserved_bytes;                     // the pool's, seen from the top of the stack
  // [/snippet]
  mr.deallocate(stream, p, bytes);
}

// docs/observability.md: counting (and tracking) inside a pool through its Observer.
#include <vram/adaptor/statistics_observer.hpp>
#include <vram/adaptor/tracker_observer.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/observers.hpp>
#include <vram/source/cuda_device_source.hpp>

void use(vram::cuda_device_source src, vram::tenant tenant) {
  // [snippet]
  vram::statistics_observer obs;  // copies share the counters
  vram::stream_pool<vram::cuda_device_source, vram::statistics_observer> pool(src, {}, obs);
  obs.stats().peak_reserved_bytes;
  obs.stats(tenant).live_bytes;

  // Statistics and a tracker in one pool:
  vram::tracker_observer tracker;
  using both = vram::observers<vram::statistics_observer, vram::tracker_observer>;
  vram::stream_pool<vram::cuda_device_source, both> tracked(src, {}, {obs, tracker});
  // [/snippet]
}

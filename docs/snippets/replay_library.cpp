// docs/replay.md: the replay as a library.
// [snippet]
#include <vram/trace/allocators.hpp>
#include <vram/trace/read_trace.hpp>
#include <vram/trace/report.hpp>

// [/snippet]
#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>

void use(vram::stream_pool<vram::host_source>& my_resource) {
  // [snippet]
  auto t = vram::trace::read_trace("snapshot.pickle");            // throws vram::trace::trace_error
  auto r = vram::trace::pool_contiguous_config().run(t, {.capacity = std::size_t{24} << 30});
  vram::trace::replay(t, my_resource, [&] { return my_resource.stats(); }, {});  // any vram resource
  // [/snippet]
  (void)r;
}

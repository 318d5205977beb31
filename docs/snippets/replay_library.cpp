// docs/replay.md: the replay as a library.
// [snippet]
#include <vram/trace/read_trace.hpp>
#include <vram/trace/report.hpp>

// [/snippet]
#include <iostream>

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/host_source.hpp>

void use(vram::stream_pool<vram::host_source>& my_resource) {
  // [snippet]
  auto t = vram::trace::read_trace("snapshot.pickle");            // throws vram::trace::trace_error
  auto r = vram::trace::replay(t, my_resource, [&] { return my_resource.stats(); }, {});  // any vram resource
  vram::trace::print_table(std::cout, t, {r});
  // [/snippet]
}

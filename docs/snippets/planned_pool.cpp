// docs/planned_pool.md: a loop of steps served from a plan.
// [snippet]
#include <vram/alloc/planned_pool.hpp>
#include <vram/source/host_source.hpp>

int main() {
  vram::planned_pool<vram::host_source> pool;  // any upstream a stream_pool takes
  for (int step = 0; step < 10; ++step) {
    pool.mark_step();  // the first mark starts a recording, the second plans it
    void* activations = pool.allocate_sync(64 << 20);
    void* scratch = pool.allocate_sync(8 << 20);
    pool.deallocate_sync(scratch, 8 << 20);
    pool.deallocate_sync(activations, 64 << 20);
  }
  vram::plan_summary s = pool.mark_step();
  return s.last_step_planned == 2 ? 0 : 1;  // both blocks of the last step came from the plan
}
// [/snippet]

// [snippet]
// first_program.cpp: a pool over a simulated 80 GiB GPU (address space, never touched: runs
// anywhere), one allocation, and the pool's statistics.
#include <cstdio>

#include <vram/alloc/stream_pool.hpp>
#include <vram/source/simulated_device_source.hpp>

int main() {
  vram::simulated_device_source gpu(std::size_t{80} << 30);
  vram::stream_pool<vram::simulated_device_source> pool(gpu);

  void* p = pool.allocate_sync(std::size_t{3} << 20);  // 3 MiB
  vram::stats s = pool.stats();
  std::printf("live %zu bytes, reserved %zu bytes from the device, %zu free block(s)\n", s.live_bytes,
              s.reserved_bytes, s.free_blocks);
  pool.deallocate_sync(p, std::size_t{3} << 20);
}
// [/snippet]

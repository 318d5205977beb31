// The smallest tour of vram: a simulated 80 GiB device, host streams standing in for CUDA
// streams, stream-ordered allocation, events, typed errors and statistics.
#include <cstdio>

#include <vram/vram.hpp>

int main() {
  // A "GPU" of 80 GiB made of reserved address space (never touched): runs on any laptop.
  vram::simulated_device_source device(std::size_t{80} << 30);

  vram::host_stream compute, copy;
  void* weights = device.allocate(compute, std::size_t{14} << 30);  // 14 GiB of weights

  // Work on `copy` that must follow the compute stream's work: an event, no host sync.
  vram::event ready;
  ready.record(compute);
  vram::wait(copy, ready);

  try {
    (void)device.allocate(compute, std::size_t{100} << 30);  // more than the card has
  } catch (const vram::out_of_memory& e) {
    std::printf("expected: %s\n", e.what());
  }

  vram::stats s = device.stats();
  std::printf("reserved %zu MiB in %zu allocation(s), %zu OOM\n", s.reserved_bytes >> 20, s.live_allocations,
              s.ooms);
  device.deallocate(compute, weights, std::size_t{14} << 30);
  compute.synchronize();
  copy.synchronize();
  return device.stats().live_allocations == 0 ? 0 : 1;
}

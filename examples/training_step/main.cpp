// A training loop's memory plan: a stream_pool for what lives across steps (weights,
// gradients, optimizer state, the odd workspace) and an activation_arena for the
// activations, which the forward pass allocates in order and the backward pass frees in
// reverse, all dead at the end of the step (reset(): the first one re-sizes the step's
// chunks into one of its high-water, the later ones are O(1)). Runs on a simulated 80 GiB
// device (reserved address space, never touched), so it runs anywhere; on a GPU replace
// the sources with cuda_vmm_source / cuda_device_source and the host_stream with a CUDA stream.
#include <cstdio>
#include <vector>

#include <vram/alloc/activation_arena.hpp>
#include <vram/alloc/stream_pool.hpp>
#include <vram/core/event.hpp>
#include <vram/core/host_stream.hpp>
#include <vram/source/simulated_device_source.hpp>

int main() {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  vram::simulated_device_source gpu(vram::simulated_device_options{.capacity = std::size_t{80} << 30,
                                                                    .granularity = 2 * MiB,
                                                                    .contiguous = true});
  vram::host_stream compute;  // stands in for the CUDA stream of the training loop

  vram::stream_pool<vram::simulated_device_source> pool(gpu);  // shares the device with the arena
  vram::activation_arena<vram::simulated_device_source> arena(gpu, compute,
                                                              vram::activation_arena_options{.chunk_bytes = 512 * MiB});

  // Long-lived state: 24 layers of weights, gradients and two Adam moments.
  constexpr int layers = 24;
  constexpr std::size_t layer_bytes = 96 * MiB;
  std::vector<void*> state;
  for (int l = 0; l < layers * 4; ++l) state.push_back(pool.allocate(compute, layer_bytes));

  std::size_t after_first_step = 0;  // the arena's upstream calls once step one has ended
  for (int step = 0; step < 10; ++step) {
    // forward: activations per layer, in order
    std::vector<std::pair<void*, std::size_t>> acts;
    for (int l = 0; l < layers; ++l) {
      std::size_t bytes = (64 + 8 * (l % 3)) * MiB;
      acts.emplace_back(arena.allocate(compute, bytes), bytes);
    }
    // backward: a workspace per layer from the pool, activations freed in reverse
    for (int l = layers - 1; l >= 0; --l) {
      void* workspace = pool.allocate(compute, 32 * MiB);
      pool.deallocate(compute, workspace, 32 * MiB);  // reused on this stream at once
      arena.deallocate(compute, acts[std::size_t(l)].first, acts[std::size_t(l)].second);
    }
    arena.reset();  // end of step: the first re-sizes to one chunk of the step's size, the rest are O(1)
    if (step == 0) after_first_step = arena.stats().upstream_allocations;
  }
  compute.synchronize();

  vram::stats p = pool.stats(), a = arena.stats();
  vram::stats g = gpu.stats();
  std::printf("pool:  %zu MiB live, %zu MiB reserved, %zu upstream calls\n", p.live_bytes / MiB,
              p.reserved_bytes / MiB, p.upstream_allocations);
  std::printf("arena: peak %zu MiB of activations, %zu MiB reserved, %zu upstream calls over 10 steps\n",
              a.peak_live_bytes / MiB, a.reserved_bytes / MiB, a.upstream_allocations);
  std::printf("device: %zu MiB in use of 80 GiB\n", g.live_bytes / MiB);
  for (void* s : state) pool.deallocate(compute, s, layer_bytes);
  compute.synchronize();
  // The arena calls its upstream in the first step and the reset() that ends it only.
  return a.upstream_allocations == after_first_step && a.reserved_bytes * 100 <= a.peak_live_bytes * 102 &&
                 pool.stats().live_bytes == 0
             ? 0
             : 1;
}

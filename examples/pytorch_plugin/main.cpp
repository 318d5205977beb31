// libvram_c driven the way PyTorch's CUDAPluggableAllocator drives it: vram_malloc(size,
// device, stream) / vram_free(ptr, size, device, stream), an init hook, empty_cache, a memory
// fraction and record_stream. Runs everywhere: without a GPU the library uses host memory
// (VRAM_BACKEND=host), with one it uses the GPU. use_with_pytorch.py is the real thing.
#include <cstdio>
#include <vector>

#include <vram/vram_c.h>

int main() {
  std::printf("libvram_c: %s\n", VRAM_C_PATH);
  if (vram_init(0) != 0) {
    std::fprintf(stderr, "vram_init failed: %s\n", vram_last_error());
    return 1;
  }
  std::printf("device 0 allocator: %s\n", vram_describe(0));
  vram_stream_t stream = nullptr;  // the legacy default stream, as torch passes it

  // A "training step": activations of growing size, freed in reverse.
  std::vector<std::pair<void*, size_t>> live;
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 1; i <= 32; ++i) {
      size_t bytes = i << 20;
      void* p = vram_malloc(bytes, 0, stream);
      if (p == nullptr) {
        std::fprintf(stderr, "vram_malloc(%zu) failed: %s\n", bytes, vram_last_error());
        return 1;
      }
      live.emplace_back(p, bytes);
    }
    while (!live.empty()) {
      vram_free(live.back().first, live.back().second, 0, stream);
      live.pop_back();
    }
  }
  vram_stats_t s;
  vram_stats(0, &s);
  std::printf("after 3 steps: %zu allocations, %zu MiB reserved (peak live %zu MiB), %zu upstream calls\n",
              s.total_allocations, s.reserved_bytes >> 20, s.peak_live_bytes >> 20, s.upstream_allocations);

  // torch.cuda.set_per_process_memory_fraction(0.5) maps onto this:
  vram_set_memory_fraction(0.5, 0);
  vram_empty_cache();  // torch.cuda.empty_cache()
  vram_stats(0, &s);
  std::printf("after empty_cache: %zu MiB reserved, cap %zu MiB\n", s.reserved_bytes >> 20, s.limit_bytes >> 20);
  return s.live_bytes == 0 && s.reserved_bytes == 0 ? 0 : 1;
}

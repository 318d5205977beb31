// libvram_c driven the way CuPy's CFunctionAllocator drives it: malloc(param, size, device)
// and free(param, ptr, device), with no size on free. Two tenants share the device with a
// quota each. Runs everywhere: without a GPU the library uses host memory (VRAM_BACKEND=host).
// use_with_cupy.py is the real thing.
#include <cstdio>

#include <vram/vram_c.h>

int main() {
  std::printf("libvram_c: %s\n", VRAM_C_PATH);
  // Function pointers of exactly CuPy's types.
  void* (*cupy_malloc)(void*, size_t, int) = &vram_cupy_malloc;
  void (*cupy_free)(void*, void*, int) = &vram_cupy_free;

  vram_set_tenant_quota("inference", size_t{64} << 20, 0);  // 64 MiB for this tenant
  vram_set_tenant("inference");
  void* a = cupy_malloc(nullptr, size_t{48} << 20, 0);
  void* b = cupy_malloc(nullptr, size_t{32} << 20, 0);  // over the quota: NULL, not a crash
  std::printf("inference: 48 MiB %s, then 32 MiB %s (%s)\n", a ? "granted" : "refused", b ? "granted" : "refused",
              b ? "" : vram_last_error());
  std::printf("inference holds %zu MiB\n", vram_tenant_usage("inference", 0) >> 20);
  cupy_free(nullptr, a, 0);
  vram_set_tenant(nullptr);

  vram_stats_t s;
  vram_stats(0, &s);
  std::printf("device 0 (%s): %zu live, %zu allocations\n", vram_describe(0), s.live_allocations, s.total_allocations);
  return a != nullptr && b == nullptr && s.live_allocations == 0 ? 0 : 1;
}

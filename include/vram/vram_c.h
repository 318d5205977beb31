/* vram's C ABI: a shared library (libvram_c.so, CMake target vram::vram_c) that frameworks
 * load as their allocator.
 *
 *   PyTorch  torch.cuda.memory.CUDAPluggableAllocator(path, "vram_malloc", "vram_free")
 *   CuPy     cupy.cuda.memory.CFunctionAllocator(0, malloc_ptr, free_ptr, owner)
 *            with vram_cupy_malloc / vram_cupy_free
 *   C, C++, Rust, ... call the functions directly.
 *
 * Behaviour:
 * - Nothing here throws or aborts. An allocation that cannot be served returns NULL (out of
 *   memory, quota, memory fraction, bad configuration); vram_last_error() says why.
 * - Every function may be called from any thread.
 * - Each device gets its own allocator stack, created on first use (or by vram_init), from
 *   the environment read at that moment:
 *     VRAM_BACKEND        cuda | simulated | host   (default: cuda when a GPU is usable, else host)
 *                         host: ordinary host memory with fake device ids (for tests);
 *                         simulated: addresses from a reserved, never-touched range.
 *     VRAM_ALLOCATOR      pool (stream_pool, default) | slab (budget_slab) | direct (the source,
 *                         no caching: cudaMalloc/cudaFree per call)
 *     VRAM_POOL_INITIAL   pool bytes reserved up front (default 0)
 *     VRAM_POOL_MAX       the most bytes the pool holds (default: no cap)
 *     VRAM_POOL_STEP      growth step (default: the pool's own, 64 MiB)
 *     VRAM_DEVICE_BUDGET  slab: the device budget (required for slab); simulated: the capacity
 *                         (default 80 GiB)
 *     VRAM_TENANT         tenant name that allocations are charged to (default: "default")
 *     VRAM_TENANT_QUOTA   hard limit of that tenant, per device (default: none)
 *     VRAM_LEDGER         a quota ledger shared by processes (vram-quota create; docs/quotas.md):
 *                         a name in /dev/shm or a path, "%d" standing for the device id
 *                         (VRAM_LEDGER=vram-gpu%d). What the process holds from the device
 *                         (the pool's chunks, cached free bytes included) is charged to it.
 *     VRAM_LEDGER_TENANT  the tenant path charged in that ledger ("serving/llama"); required
 *                         with VRAM_LEDGER. An unknown tenant or a refused ledger fails vram_init.
 *     VRAM_DEVICE_COUNT   host/simulated backends: number of fake devices (default 8)
 *   Sizes accept suffixes K, M, G, T (powers of 1024), e.g. VRAM_POOL_MAX=40G.
 * - Streams: on the cuda backend, memory is stream-ordered on the given cudaStream_t (NULL is
 *   the legacy default stream); free on the stream the memory was last used on, or call
 *   vram_record_stream for the others first. The host and simulated backends ignore streams.
 */
#ifndef VRAM_VRAM_C_H
#define VRAM_VRAM_C_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(VRAM_C_BUILDING)
#  define VRAM_C_API __attribute__((visibility("default")))
#else
#  define VRAM_C_API
#endif

/* cudaStream_t is `struct CUstream_st*`; spelled so this header needs no CUDA headers. */
typedef struct CUstream_st* vram_stream_t;

/* Statistics of one device's allocator (see vram::stats). */
typedef struct vram_stats_t {
  size_t live_bytes;          /* bytes handed out and not yet freed (as rounded) */
  size_t peak_live_bytes;
  size_t reserved_bytes;      /* bytes held from the device */
  size_t peak_reserved_bytes;
  size_t live_allocations;
  size_t total_allocations;
  size_t total_deallocations;
  size_t free_bytes;          /* reserved but not live */
  size_t largest_free_block;
  size_t upstream_allocations;
  size_t ooms;                /* allocations that returned NULL for lack of memory */
  size_t spills;              /* slab: allocations served from host memory */
  size_t spilled_bytes;
  size_t limit_bytes;         /* the memory-fraction cap, 0 when none */
  size_t misuses;             /* frees of foreign pointers / wrong sizes (reported on stderr, ignored) */
  double fragmentation;       /* 1 - largest_free / free_bytes */
} vram_stats_t;

/* Where a planned pool stands (VRAM_PLAN=1; see vram::plan_summary and docs/planned_pool.md). */
typedef struct vram_plan_stats_t {
  int enabled;                /* 1 when the device's pool is planned (VRAM_PLAN=1), else 0 and the rest 0 */
  int phase;                  /* 0: before the first vram_mark_step, 1: recording a step, 2: serving from a plan */
  size_t plans_made;
  size_t plans_refused;       /* plans whose range the device could not hold */
  size_t steps_served;        /* steps closed while serving from a plan */
  size_t last_step_planned;   /* allocations of the last served step at their planned place */
  size_t last_step_off_plan;  /* requests of the last served step served online (off the plan) */
  size_t entries;             /* allocations of the recorded step */
  size_t planned_entries;     /* those placed in the plan's range */
  size_t range_bytes;         /* the plan's range */
  size_t plans_declined;      /* plans whose range would have raised the pool's peak reserve */
} vram_plan_stats_t;

/* ---- PyTorch CUDAPluggableAllocator -------------------------------------------------- */

/* Allocates `size` bytes on `device`, ordered on `stream`. NULL when it cannot (and for 0). */
VRAM_C_API void* vram_malloc(size_t size, int device, vram_stream_t stream);
/* Frees `ptr` (from vram_malloc, with its size) on `stream`. NULL is ignored; a pointer this
 * device's allocator did not hand out, or a wrong size, is reported on stderr, counted in
 * vram_stats_t.misuses and ignored. */
VRAM_C_API void vram_free(void* ptr, size_t size, int device, vram_stream_t stream);
/* Creates the allocator of `device` now (init hook); 0 on success, -1 on error. */
VRAM_C_API int vram_init(int device);
/* Returns cached free memory of every device to the driver (torch.cuda.empty_cache). */
VRAM_C_API void vram_empty_cache(void);
/* Caps `device`'s live bytes at fraction x its capacity (0 < fraction <= 1); 0 or -1. */
VRAM_C_API int vram_set_memory_fraction(double fraction, int device);
/* `ptr` is also used on `stream`: its free waits for the work enqueued on `stream` so far
 * (Tensor.record_stream). Not needed on host backends. */
VRAM_C_API void vram_record_stream(void* ptr, vram_stream_t stream);

/* ---- CuPy CFunctionAllocator ---------------------------------------------------------- */

/* `param` is unused (pass 0). Memory is ordered on the legacy default stream. */
VRAM_C_API void* vram_cupy_malloc(void* param, size_t size, int device);
VRAM_C_API void vram_cupy_free(void* param, void* ptr, int device);

/* ---- observability and control -------------------------------------------------------- */

/* Fills `out` for `device`; 0 on success, -1 when the device has no allocator yet or on error. */
VRAM_C_API int vram_stats(int device, vram_stats_t* out);
/* Fills `out` with where `device`'s planned pool stands; 0 on success (enabled = 0 when the
 * pool is not planned), -1 when the device has no allocator yet or on error. */
VRAM_C_API int vram_plan_stats(int device, vram_plan_stats_t* out);
/* Writes who holds memory on every device in use. The format follows the extension:
 * .pickle (PyTorch memory snapshot, for pytorch.org/memory_viz), .json, .csv (RMM log),
 * anything else a text report. Device d > 0 writes to `path` with ".dev<d>" before the
 * extension. 0 on success, -1 on error. */
VRAM_C_API int vram_snapshot(const char* path);
/* Marks the end of a step (a training or serving iteration) on every device in use: with
 * VRAM_PLAN=1 the planned pool's boundary (the first mark starts a recording, the second
 * plans it, later ones close a served step), a summary of the step, and leak detection (a tenant or tag whose live bytes reach a new high
 * at 8 consecutive marks, by 1 MiB or more; vram_snapshot's text report names them). Returns
 * the number of suspected leaks, or -1 on error. */
VRAM_C_API int vram_mark_step(void);
/* Charges the calling thread's later allocations to tenant `name` (created on first use);
 * NULL restores the default tenant. 0 or -1. */
VRAM_C_API int vram_set_tenant(const char* name);
/* Sets the hard limit of tenant `name` on `device` (bytes; 0: none). 0 or -1. */
VRAM_C_API int vram_set_tenant_quota(const char* name, size_t bytes, int device);
/* Live bytes of tenant `name` on `device` (0 when unknown). */
VRAM_C_API size_t vram_tenant_usage(const char* name, int device);
/* Why the calling thread's last failed call failed ("" when none). Valid until its next call. */
VRAM_C_API const char* vram_last_error(void);
/* The backend and allocator of `device` ("host/pool", "cuda/slab", ...), "" when not created. */
VRAM_C_API const char* vram_describe(int device);
/* Destroys every device's allocator (live allocations are reported and leaked). For tests
 * and orderly shutdown; the next call re-reads the environment. */
VRAM_C_API void vram_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* VRAM_VRAM_C_H */

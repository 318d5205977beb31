/* The CUDA stand-in's control API (tests/standin/cuda_standin.cpp): what a test asks of the
 * stand-in beside the CUDA calls it implements. C, so any test (and Python's ctypes) can call
 * it. Test-only: never installed, never linked into the library. */
#ifndef VRAM_TESTS_STANDIN_H
#define VRAM_TESTS_STANDIN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Calls of the CUDA runtime or driver function `name` ("cudaMalloc", "cuMemMap", ...) since
 * the start or the last vram_standin_reset_counts(). */
size_t vram_standin_calls(const char* name);
/* Calls that block the calling thread until device work completes: cudaStreamSynchronize,
 * cudaDeviceSynchronize, cudaEventSynchronize, and the synchronous copies and frees that wait
 * for the device (cudaMemcpy, cudaMemset, cudaFree, cudaFreeHost). */
size_t vram_standin_blocking_calls(void);
void vram_standin_reset_counts(void);

/* Fails the `nth` (1-based, counted from this call) call of `name` with its documented error
 * for exhaustion (cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY) or, where a function
 * cannot run out of memory, cudaErrorUnknown / CUDA_ERROR_UNKNOWN. 0 clears. One plan at a
 * time. */
void vram_standin_fail_call(const char* name, size_t nth);

/* What is still held: device, pinned, managed and pool allocations, VMM handles, mappings
 * and reservations, streams, events, pools. Writes one line per kind with a non-zero count to
 * stderr when `report` is non-zero. */
size_t vram_standin_leaks(int report);

#ifdef __cplusplus
}
#endif

#endif

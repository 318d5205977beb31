"""vram as CuPy's memory allocator (needs CuPy and a GPU; imported only when called)."""

import ctypes

import vram


def use(library=None, plan=False):
    """Makes vram CuPy's allocator (cupy.cuda.set_allocator). Memory is ordered on the
    legacy default stream. plan=True makes the pool planned (VRAM_PLAN=1): call
    vram.mark_step() at every iteration. Returns the CFunctionAllocator."""
    import cupy  # the framework, not this module: absolute import

    if plan:
        vram.enable_plan()
    vram.load(library)
    lib = vram._c()
    malloc = ctypes.cast(lib.vram_cupy_malloc, ctypes.c_void_p).value
    free = ctypes.cast(lib.vram_cupy_free, ctypes.c_void_p).value
    allocator = cupy.cuda.memory.CFunctionAllocator(0, malloc, free, lib)  # owner: keeps the library loaded
    cupy.cuda.set_allocator(allocator.malloc)
    return allocator

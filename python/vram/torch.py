"""vram as PyTorch's CUDA allocator (needs PyTorch and a GPU; imported only when called)."""

import vram


def use(library=None, plan=False):
    """Makes vram PyTorch's CUDA caching allocator for this process. Call it before the first
    CUDA allocation (PyTorch refuses to swap allocators after). plan=True makes the pool
    planned (VRAM_PLAN=1): call vram.mark_step() at every iteration. Returns the allocator object."""
    import torch  # the framework, not this module: absolute import

    if plan:
        vram.enable_plan()
    path = vram.load(library)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "vram_malloc", "vram_free")
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator

"""Use vram as PyTorch's CUDA allocator (not run in CI: needs a GPU and PyTorch).

    VRAM_ALLOCATOR=pool VRAM_POOL_MAX=40G python use_with_pytorch.py /path/to/libvram_c.so

The allocator must be swapped before the first CUDA allocation of the process.
"""
import ctypes
import sys

import torch

lib_path = sys.argv[1] if len(sys.argv) > 1 else "libvram_c.so"

allocator = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "vram_malloc", "vram_free")
torch.cuda.memory.change_current_allocator(allocator)

# The same library, for statistics and snapshots.
vram = ctypes.CDLL(lib_path)


class VramStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "live_bytes", "peak_live_bytes", "reserved_bytes", "peak_reserved_bytes",
        "live_allocations", "total_allocations", "total_deallocations", "free_bytes",
        "largest_free_block", "upstream_allocations", "ooms", "spills", "spilled_bytes",
        "limit_bytes", "misuses")] + [("fragmentation", ctypes.c_double)]


vram.vram_stats.argtypes = [ctypes.c_int, ctypes.POINTER(VramStats)]
vram.vram_snapshot.argtypes = [ctypes.c_char_p]
vram.vram_set_tenant.argtypes = [ctypes.c_char_p]
vram.vram_describe.restype = ctypes.c_char_p

model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
opt = torch.optim.AdamW(model.parameters())
for step in range(5):
    x = torch.randn(256, 4096, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

torch.cuda.synchronize()
device = torch.cuda.current_device()
s = VramStats()
vram.vram_stats(device, ctypes.byref(s))
print(f"vram ({vram.vram_describe(device).decode()}): live {s.live_bytes >> 20} MiB, "
      f"reserved {s.reserved_bytes >> 20} MiB, peak live {s.peak_live_bytes >> 20} MiB, "
      f"fragmentation {s.fragmentation:.3f}")
# Who holds memory, viewable at https://pytorch.org/memory_viz
vram.vram_snapshot(b"vram_snapshot.pickle")
print("wrote vram_snapshot.pickle")

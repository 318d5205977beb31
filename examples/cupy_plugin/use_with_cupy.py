"""Use vram as CuPy's allocator (not run in CI: needs a GPU and CuPy).

    VRAM_ALLOCATOR=pool python use_with_cupy.py /path/to/libvram_c.so
"""
import ctypes
import sys

import cupy

lib_path = sys.argv[1] if len(sys.argv) > 1 else "libvram_c.so"
vram = ctypes.CDLL(lib_path)

malloc_ptr = ctypes.cast(vram.vram_cupy_malloc, ctypes.c_void_p).value
free_ptr = ctypes.cast(vram.vram_cupy_free, ctypes.c_void_p).value
# param 0: vram keeps its own state; `vram` keeps the library loaded while CuPy uses it.
allocator = cupy.cuda.memory.CFunctionAllocator(0, malloc_ptr, free_ptr, vram)
cupy.cuda.set_allocator(allocator.malloc)

x = cupy.random.random((8192, 8192), dtype=cupy.float32)
y = x @ x.T
print("checksum", float(y.sum()))
del x, y

vram.vram_describe.restype = ctypes.c_char_p
print("allocator:", vram.vram_describe(cupy.cuda.Device().id).decode())
vram.vram_snapshot(b"vram_cupy_snapshot.json")
print("wrote vram_cupy_snapshot.json")

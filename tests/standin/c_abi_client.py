"""libvram_c's cuda backend driven as PyTorch and CuPy drive it, over the CUDA stand-in.

PyTorch's torch.cuda.memory.CUDAPluggableAllocator calls `malloc(ssize_t size, int device,
cudaStream_t stream)` and `free(void* ptr, ssize_t size, int device, cudaStream_t stream)`
from whichever threads allocate tensors, each on its current stream; CuPy's
cupy.cuda.memory.CFunctionAllocator calls `malloc(param, size, device)` and
`free(param, ptr, device)`. This client does both from several threads on several real
(stand-in) streams, writes every block on its stream, then reads the statistics and a
PyTorch snapshot back through the C API and checks the stand-in for host-blocking calls and
leaks.

Then it runs a training loop with the plan on (VRAM_PLAN=1): mark_step drives the planned
pool, gradients cross the step boundary, and the last step is served from the plan.

Then it joins a quota ledger as a PyTorch process would, by setting VRAM_LEDGER and
VRAM_LEDGER_TENANT: the ledger (made with vram-quota) charges what the pool holds from the
(stand-in) device, refuses past the tenant's limit, and is given back at shutdown.

Run: python3 c_abi_client.py LIBVRAM_C_BUILT_AGAINST_THE_STANDIN LIBVRAM_CUDA_STANDIN VRAM_QUOTA
(CTest: standin.c_abi_python)."""

import ctypes
import json
import os
import pickle
import sys
import subprocess
import tempfile
import threading

os.environ["VRAM_BACKEND"] = "cuda"
os.environ["VRAM_ALLOCATOR"] = "pool"
for name in ("VRAM_TENANT", "VRAM_TENANT_QUOTA", "VRAM_DEVICE_COUNT", "VRAM_LEDGER", "VRAM_LEDGER_TENANT"):
    os.environ.pop(name, None)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import vram  # noqa: E402  (the package's ctypes declarations, loaded on the stand-in build)

vram.load(sys.argv[1])
c = vram._c()
cuda = ctypes.CDLL(sys.argv[2])  # the same library libvram_c was linked against
cuda.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
cuda.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
cuda.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
cuda.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
cuda.vram_standin_blocking_calls.restype = ctypes.c_size_t
cuda.vram_standin_leaks.restype = ctypes.c_size_t
cuda.vram_standin_leaks.argtypes = [ctypes.c_int]
c.vram_cupy_malloc.argtypes, c.vram_cupy_malloc.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_void_p
c.vram_cupy_free.argtypes, c.vram_cupy_free.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int], None

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what, flush=True)


leaks_before = cuda.vram_standin_leaks(0)
vram.init(0)
check(b"cuda" in c.vram_describe(0), "the cuda backend is chosen: " + c.vram_describe(0).decode())

SIZES = [512, 4096, 100_000, 1 << 20, 3 << 20, 300]


def torch_like(rounds, stream, errors):
    """A thread allocating and freeing on its own stream, as tensors come and go."""
    live = []
    for r in range(rounds):
        for size in SIZES:
            p = c.vram_malloc(size, 0, stream)
            if not p:
                errors.append(c.vram_last_error())
                return
            if cuda.cudaMemsetAsync(p, r & 0xFF, size, stream) != 0:  # the block is device memory
                errors.append(b"cudaMemsetAsync on a vram block failed")
            live.append((p, size))
        for p, size in live[::2]:
            c.vram_free(p, size, 0, stream)
        live = live[1::2]
    for p, size in live:
        c.vram_free(p, size, 0, stream)


def cupy_like(rounds, errors):
    """CuPy's allocator calls: no stream (the legacy default stream)."""
    for _ in range(rounds):
        ps = [(c.vram_cupy_malloc(None, size, 0), size) for size in SIZES]
        if not all(p for p, _ in ps):
            errors.append(c.vram_last_error())
            return
        for p, _ in ps:
            c.vram_cupy_free(None, p, 0)


streams = []
for _ in range(4):
    s = ctypes.c_void_p()
    check(cuda.cudaStreamCreate(ctypes.byref(s)) == 0, "cudaStreamCreate")
    streams.append(s.value)

torch_like(2, streams[0], [])  # warm: the pool has grown, the lanes exist
blocking_before = cuda.vram_standin_blocking_calls()
errors = []
threads = [threading.Thread(target=torch_like, args=(40, s, errors)) for s in streams]
threads.append(threading.Thread(target=cupy_like, args=(40, errors)))
for t in threads:
    t.start()
for t in threads:
    t.join()
check(not errors, f"allocation errors: {errors[:3]}")
check(cuda.vram_standin_blocking_calls() == blocking_before,
      f"{cuda.vram_standin_blocking_calls() - blocking_before} host-blocking CUDA calls in malloc/free")

for s in streams:
    check(cuda.cudaStreamSynchronize(s) == 0, "cudaStreamSynchronize")
st = vram.stats(0)
check(st["live_bytes"] == 0, f"live bytes after every free: {st['live_bytes']}")
check(st["allocated_bytes.all.current"] == 0, "PyTorch's name for live bytes")
check(st["total_allocations"] == st["total_deallocations"], "allocations and frees balance")
check(st["total_allocations"] >= 4 * 40 * len(SIZES), f"allocations counted: {st['total_allocations']}")
check(st["reserved_bytes"] > 0, "the pool holds memory")

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "snapshot.pickle")
    vram.snapshot(path)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    check(isinstance(snap.get("segments"), list) and isinstance(snap.get("device_traces"), list),
          "a PyTorch snapshot: segments and device_traces")

vram.empty_cache()
vram.shutdown()

# ---- the planned pool, driven by mark_step as a PyTorch training loop would --------------


marks_blocked = 0


def mark_step_blocking():
    """vram.mark_step(), counting its host-blocking calls apart: a mark may wait (a plan's range
    given back at a mark is ordered after every stream that used it), malloc and free never."""
    global marks_blocked
    before = cuda.vram_standin_blocking_calls()
    vram.mark_step()
    marks_blocked += cuda.vram_standin_blocking_calls() - before


def training_loop(steps, compute, side):
    """zero_grad frees last step's gradients; forward on `compute` with temporaries on `side`;
    backward frees the activations and makes the gradients, which cross into the next step."""
    grads = []
    for step in range(steps):
        mark_step_blocking()
        for p, size in grads:
            c.vram_free(p, size, 0, compute)
        acts = []
        for layer in range(4):
            tmp = c.vram_malloc(1 << 20, 0, side)
            check(bool(tmp) and cuda.cudaMemsetAsync(tmp, layer, 1 << 20, side) == 0, "a temporary on the side stream")
            c.vram_free(tmp, 1 << 20, 0, side)
            a = c.vram_malloc((2 << 20) + 4096 * layer, 0, compute)
            check(bool(a) and cuda.cudaMemsetAsync(a, layer, 2 << 20, compute) == 0, "an activation on the compute stream")
            acts.append((a, (2 << 20) + 4096 * layer))
        grads = []
        for a, size in reversed(acts):
            c.vram_free(a, size, 0, compute)
            g = c.vram_malloc(1 << 19, 0, compute)
            check(bool(g), "a gradient")
            grads.append((g, 1 << 19))
    return grads


os.environ["VRAM_PLAN"] = "1"
try:
    vram.init(0)
    check(vram.describe(0) == "cuda/pool+plan", "the plan is on: " + vram.describe(0))
    blocking_before = cuda.vram_standin_blocking_calls()
    grads = training_loop(6, streams[0], streams[1])
    mark_step_blocking()
    plan = vram.plan_stats(0)
    check(plan["enabled"] and plan["phase"] == "serving", f"serving from a plan: {plan}")
    check(plan["last_step_planned"] == 12 and plan["last_step_off_plan"] == 0,
          f"every allocation of the last step from the plan, gradients included: {plan}")
    blocked = cuda.vram_standin_blocking_calls() - blocking_before - marks_blocked
    check(blocked == 0, f"{blocked} host-blocking CUDA calls in malloc and free of the planned loop")
    for p, size in grads:
        c.vram_free(p, size, 0, streams[0])
    for s in streams[:2]:
        check(cuda.cudaStreamSynchronize(s) == 0, "cudaStreamSynchronize")
    check(vram.stats(0)["live_bytes"] == 0, "the planned loop frees everything")
    check(vram.stats(0)["misuses"] == 0, "no misuse in the planned loop")
finally:
    os.environ.pop("VRAM_PLAN")
    vram.shutdown()

# ---- a quota ledger, joined by two variables ----------------------------------------------
quota = sys.argv[3] if len(sys.argv) > 3 else None  # absent where the tools are not built
ledger = "vram-standin-%d" % os.getpid()


def vram_quota(*args):
    r = subprocess.run([quota, *args], capture_output=True, text=True)
    check(r.returncode == 0, "vram-quota %s: %s" % (" ".join(args), r.stderr))
    return r.stdout


def usage_of(tenant):
    listing = json.loads(vram_quota("list", ledger, "--json"))
    return next(t["usage"] for t in listing["tenants"] if t["tenant"] == tenant), listing["processes"]


def join_ledger():
    """The pool charges the ledger for its chunks, is refused past the limit, gives back."""
    vram_quota("set", ledger, "serving", "--hard", "8M")
    vram_quota("set", ledger, "serving/llama")
    os.environ.update(VRAM_LEDGER=ledger, VRAM_LEDGER_TENANT="serving/llama", VRAM_POOL_STEP="2M")
    vram.init(0)
    p = c.vram_malloc(1 << 20, 0, None)
    check(bool(p), "an allocation within the ledger's limit: " + c.vram_last_error().decode())
    charged, processes = usage_of("serving/llama")
    reserved = vram.stats(0)["reserved_bytes"]
    check(charged == reserved and charged > 0,
          "the ledger charges what the pool holds from the device: %d vs %d" % (charged, reserved))
    check(len(processes) == 1 and processes[0]["alive"], "this process holds a slot")
    check(not c.vram_malloc(8 << 20, 0, None), "refused past serving's 8 MiB")
    why = c.vram_last_error()
    check(b"quota ledger" in why and b"'serving'" in why, "the refusal names the ledger's tenant: " + why.decode())
    c.vram_free(p, 1 << 20, 0, None)
    check(usage_of("serving/llama")[0] == charged, "a freed block stays cached, and charged")
    check(cuda.cudaStreamSynchronize(None) == 0, "cudaStreamSynchronize")  # the free's stream is idle
    vram.empty_cache()
    check(usage_of("serving")[0] == 0, "emptying the cache gives the charge back")
    vram.shutdown()
    check(usage_of("serving")[1] == [], "the slot went with the allocator")


if quota is None:
    print("the quota ledger part needs vram-quota, which this build (VRAM_BUILD_TOOLS=OFF) lacks")
else:
    vram_quota("create", ledger)
    try:
        join_ledger()
    finally:
        for name in ("VRAM_LEDGER", "VRAM_LEDGER_TENANT", "VRAM_POOL_STEP"):
            os.environ.pop(name, None)
        vram_quota("remove", ledger)

for s in streams:
    check(cuda.cudaStreamDestroy(s) == 0, "cudaStreamDestroy")
check(cuda.vram_standin_leaks(1) == leaks_before, "nothing held on the stand-in after shutdown")

print(f"{len(failures)} failure(s)" if failures else "c_abi_client: every check passed")
sys.exit(1 if failures else 0)

"""A handle on vram's C ABI (libvram_c) through ctypes.

Every function loads the library on first use (see load()). Errors from the library raise
VramError with the library's own message (vram_last_error)."""

import ctypes
import ctypes.util
import os
import sys

__all__ = [
    "VramError", "load", "library_path", "stats", "snapshot", "set_tenant", "set_tenant_quota",
    "tenant_usage", "mark_step", "plan_stats", "empty_cache", "set_memory_fraction", "describe", "init",
    "shutdown", "enable_plan",
]


class VramError(RuntimeError):
    """A call into libvram_c failed; the message is the library's."""


class _Stats(ctypes.Structure):
    # vram_stats_t, field for field (include/vram/vram_c.h).
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "live_bytes", "peak_live_bytes", "reserved_bytes", "peak_reserved_bytes", "live_allocations",
        "total_allocations", "total_deallocations", "free_bytes", "largest_free_block", "upstream_allocations",
        "ooms", "spills", "spilled_bytes", "limit_bytes", "misuses")] + [("fragmentation", ctypes.c_double)]


class _PlanStats(ctypes.Structure):
    # vram_plan_stats_t, field for field (include/vram/vram_c.h).
    _fields_ = [("enabled", ctypes.c_int), ("phase", ctypes.c_int)] + [(name, ctypes.c_size_t) for name in (
        "plans_made", "plans_refused", "steps_served", "last_step_planned", "last_step_off_plan", "entries",
        "planned_entries", "range_bytes", "plans_declined")]


_PHASES = ("online", "recording", "serving")


# The names torch.cuda.memory_stats() uses, for the figures that mean the same thing there.
_TORCH_NAMES = {
    "allocated_bytes.all.current": "live_bytes",
    "allocated_bytes.all.peak": "peak_live_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "reserved_bytes.all.peak": "peak_reserved_bytes",
    "allocation.all.current": "live_allocations",
    "allocation.all.allocated": "total_allocations",
    "allocation.all.freed": "total_deallocations",
    "num_ooms": "ooms",
}

_lib = None
_path = None


def _candidates():
    env = os.environ.get("VRAM_C_LIBRARY")
    if env:  # the one asked for, and no other
        yield env
        return
    found = ctypes.util.find_library("vram_c")
    if found:
        yield found
    for prefix in (sys.prefix, os.path.expanduser("~/opt/vram"), "/usr/local", "/opt/vram"):
        for lib in ("lib", "lib64"):
            yield os.path.join(prefix, lib, "libvram_c.so")


def load(path=None):
    """Loads libvram_c (once): `path`, else $VRAM_C_LIBRARY, else the dynamic loader's search,
    else <prefix>/lib of this Python, ~/opt/vram, /usr/local and /opt/vram. Returns the path."""
    global _lib, _path
    if _lib is not None and (path is None or path == _path):
        return _path
    tried = [path] if path else list(_candidates())
    # Each candidate that was there but did not load, with the loader's reason: such a path
    # (a file that is not a library, a library missing its own dependencies or of another
    # architecture) is reported as what it is, never as "not found".
    failed, missing = [], []
    for candidate in tried:
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as e:
            if os.path.sep in candidate and not os.path.exists(candidate):
                missing.append(candidate)
            else:
                failed.append(f"{candidate}: {e}")
            continue
        try:
            _declare(lib)
        except AttributeError as e:
            failed.append(f"{candidate}: loaded, but it is not libvram_c or not this version of it ({e})")
            continue
        _lib, _path = lib, candidate
        return candidate
    if failed:
        also = f" (not found: {', '.join(missing)})" if missing else ""
        raise VramError("libvram_c could not be loaded: " + "; ".join(failed) + also)
    raise VramError("libvram_c not found (tried: " + ", ".join(tried) + "); set VRAM_C_LIBRARY to its path")


def library_path():
    """The path of the loaded libvram_c (loading it if needed)."""
    return load()


def _declare(lib):
    c = ctypes
    lib.vram_malloc.argtypes, lib.vram_malloc.restype = [c.c_size_t, c.c_int, c.c_void_p], c.c_void_p
    lib.vram_free.argtypes, lib.vram_free.restype = [c.c_void_p, c.c_size_t, c.c_int, c.c_void_p], None
    lib.vram_init.argtypes, lib.vram_init.restype = [c.c_int], c.c_int
    lib.vram_empty_cache.argtypes, lib.vram_empty_cache.restype = [], None
    lib.vram_set_memory_fraction.argtypes, lib.vram_set_memory_fraction.restype = [c.c_double, c.c_int], c.c_int
    lib.vram_stats.argtypes, lib.vram_stats.restype = [c.c_int, c.POINTER(_Stats)], c.c_int
    lib.vram_snapshot.argtypes, lib.vram_snapshot.restype = [c.c_char_p], c.c_int
    lib.vram_set_tenant.argtypes, lib.vram_set_tenant.restype = [c.c_char_p], c.c_int
    lib.vram_set_tenant_quota.argtypes, lib.vram_set_tenant_quota.restype = [c.c_char_p, c.c_size_t, c.c_int], c.c_int
    lib.vram_tenant_usage.argtypes, lib.vram_tenant_usage.restype = [c.c_char_p, c.c_int], c.c_size_t
    lib.vram_last_error.argtypes, lib.vram_last_error.restype = [], c.c_char_p
    lib.vram_describe.argtypes, lib.vram_describe.restype = [c.c_int], c.c_char_p
    lib.vram_shutdown.argtypes, lib.vram_shutdown.restype = [], None
    lib.vram_mark_step.argtypes, lib.vram_mark_step.restype = [], c.c_int
    lib.vram_plan_stats.argtypes, lib.vram_plan_stats.restype = [c.c_int, c.POINTER(_PlanStats)], c.c_int


def _c():
    if _lib is None:
        load()
    return _lib


def _check(rc, what):
    if rc != 0:
        reason = _c().vram_last_error().decode(errors="replace")
        raise VramError(f"{what} failed: {reason or 'no reason given'}")


def init(device=0):
    """Creates `device`'s allocator now, from the environment as it is."""
    _check(_c().vram_init(device), f"vram_init({device})")


def stats(device=0):
    """`device`'s allocator statistics as a dict: vram's names (live_bytes, reserved_bytes,
    fragmentation, ...) and, for the figures that mean the same, torch.cuda.memory_stats()'s
    names (allocated_bytes.all.current, reserved_bytes.all.peak, num_ooms, ...)."""
    s = _Stats()
    _check(_c().vram_stats(device, ctypes.byref(s)), f"vram_stats({device})")
    out = {name: getattr(s, name) for name, _ in _Stats._fields_}
    out.update({torch_name: out[ours] for torch_name, ours in _TORCH_NAMES.items()})
    return out


def snapshot(path):
    """Writes who holds memory on every device in use; the extension picks the format
    (.pickle: PyTorch memory snapshot, .json, .csv: RMM log, else a text report)."""
    _check(_c().vram_snapshot(os.fsencode(path)), f"vram_snapshot({path!r})")


def set_tenant(name):
    """Charges this thread's later allocations to tenant `name`; None: the default tenant."""
    _check(_c().vram_set_tenant(None if name is None else name.encode()), f"vram_set_tenant({name!r})")


def set_tenant_quota(name, limit_bytes, device=0):
    """Sets tenant `name`'s hard limit on `device` (0: none)."""
    _check(_c().vram_set_tenant_quota(name.encode(), limit_bytes, device), f"vram_set_tenant_quota({name!r})")


def tenant_usage(name, device=0):
    """Live bytes of tenant `name` on `device`."""
    return _c().vram_tenant_usage(name.encode(), device)


def mark_step():
    """Marks the end of a training or serving step on every device; returns the number of
    tenants and tags suspected of leaking (live bytes at a new high at 8 consecutive marks).
    With the plan on (enable_plan(), VRAM_PLAN=1), it also drives the planned pool: the first
    mark starts recording a step, the second plans it, the later ones close served steps."""
    n = _c().vram_mark_step()
    _check(0 if n >= 0 else -1, "vram_mark_step()")
    return n


def enable_plan():
    """Makes the pools of devices created from now on planned (VRAM_PLAN=1): call it before
    the first allocation, then mark_step() at every iteration (docs/planned_pool.md)."""
    os.environ["VRAM_PLAN"] = "1"


def plan_stats(device=0):
    """Where `device`'s planned pool stands, as a dict: enabled (False unless VRAM_PLAN=1),
    phase ("online", "recording", "serving"), plans_made, plans_refused, steps_served,
    last_step_planned and last_step_off_plan (allocations of the last served step from the
    plan and off it), entries and planned_entries (of the recorded step), range_bytes,
    plans_declined."""
    s = _PlanStats()
    _check(_c().vram_plan_stats(device, ctypes.byref(s)), f"vram_plan_stats({device})")
    out = {name: getattr(s, name) for name, _ in _PlanStats._fields_}
    out["enabled"] = bool(out["enabled"])
    out["phase"] = _PHASES[out["phase"]]
    return out


def empty_cache():
    """Returns cached free memory of every device to the driver (like torch.cuda.empty_cache)."""
    _c().vram_empty_cache()


def set_memory_fraction(fraction, device=0):
    """Caps `device`'s live bytes at `fraction` of its capacity (like torch.cuda.set_per_process_memory_fraction)."""
    _check(_c().vram_set_memory_fraction(fraction, device), f"vram_set_memory_fraction({fraction})")


def describe(device=0):
    """The backend and allocator of `device` ("cuda/pool", "host/slab", ...); "" before it exists."""
    return _c().vram_describe(device).decode()


def shutdown():
    """Destroys every device's allocator; the next call reads the environment again."""
    _c().vram_shutdown()

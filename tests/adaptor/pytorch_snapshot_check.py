#!/usr/bin/env python3
"""Checks the tracker's PyTorch memory snapshots the way PyTorch's own tools use them.

Usage: pytorch_snapshot_check.py TEST_BINARY OUT_DIR
       pytorch_snapshot_check.py SNAPSHOT.pickle...   (checks the given files)

Runs TEST_BINARY's [snapshot] tests with VRAM_SNAPSHOT_DIR=OUT_DIR (they write one pickle
per scenario), then loads each pickle with Python's pickle module (refusing any global, as a
snapshot holds only built-in values) and asserts what torch/cuda/_memory_viz.py and
MemoryViz.js rely on:
  - the keys and value types torch.cuda.memory._snapshot() writes; an oom trace entry has
    device_free (printed by `_memory_viz.py trace` and by the viewer), not addr;
  - the block states PyTorch knows; blocks cover their segment in address order (the viewer
    computes block addresses as a running sum) and the segment sizes add up as in PyTorch
    (the accounting `_memory_viz.py stats` asserts);
  - per block: alloc -> free_requested -> free_completed, with no alloc overlapping a block
    that is allocated or pending in between;
  - the Allocator State History replay, backwards from the final segments, never looks up a
    missing block or segment, and keeps every block inside a segment;
  - the Active Memory Timeline's allocations still open at the end are the final blocks.
"""
import bisect
import os
import pickle
import subprocess
import sys

KNOWN_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap", "oom", "snapshot"}
BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}


class BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")


def need(d, key, types):
    assert key in d, f"missing key {key!r} in {sorted(d)}"
    v = d[key]
    assert isinstance(v, types) and not (types is int and isinstance(v, bool)), \
        f"{key!r} is {type(v).__name__}"
    return v


def check_frames(owner):
    for f in need(owner, "frames", list):
        need(f, "name", str)
        need(f, "filename", str)
        need(f, "line", int)


def check(snap):
    assert isinstance(snap, dict)
    segments = need(snap, "segments", list)
    traces = need(snap, "device_traces", list)
    need(snap, "allocator_settings", dict)

    final_blocks = {}   # address -> (size, pending)
    final_segs = []     # (address, size), by address
    devices = set()
    end = 0
    for seg in segments:
        devices.add(need(seg, "device", int))
        addr, total = need(seg, "address", int), need(seg, "total_size", int)
        assert addr >= end, "segments overlap or are out of order"
        end = addr + total
        need(seg, "stream", int)
        assert need(seg, "segment_type", str) in ("small", "large")
        pool = need(seg, "segment_pool_id", tuple)
        assert len(pool) == 2 and all(isinstance(x, int) for x in pool)
        need(seg, "is_expandable", bool)
        check_frames(seg)
        at = addr
        allocated = active = requested = 0
        used = internal = external = 0
        for b in need(seg, "blocks", list):
            assert need(b, "address", int) == at, "block address is not the running sum"
            size, req, state = need(b, "size", int), need(b, "requested_size", int), need(b, "state", str)
            assert state in BLOCK_STATES, state
            check_frames(b)
            if state == "active_allocated":
                allocated += size
                used += req
                internal += size - req
            else:
                external += size
            if state != "inactive":
                active += size
                requested += req
                final_blocks[at] = (size, state == "active_pending_free")
            at += size
        assert at == addr + total, "blocks do not cover the segment"
        assert used + internal + external == total
        assert need(seg, "allocated_size", int) == allocated
        assert need(seg, "active_size", int) == active
        assert need(seg, "requested_size", int) == requested
        final_segs.append((addr, total))

    events = []
    for dev, trace in enumerate(traces):
        assert isinstance(trace, list)
        if trace:
            devices.add(dev)
        for e in trace:
            action = need(e, "action", str)
            assert action in KNOWN_ACTIONS, action
            need(e, "size", int)
            need(e, "stream", int)
            need(e, "time_us", int)
            check_frames(e)
            if action == "oom":
                need(e, "device_free", int)
                assert "addr" not in e
            else:
                need(e, "addr", int)
            events.append(e)
    assert len(devices) <= 1, "one device per tracker"

    # Forward, per block.
    open_blocks = {}  # address -> [size, pending]
    starts = []       # sorted addresses of open_blocks

    def overlaps(a, n):
        i = bisect.bisect_left(starts, a + n)
        return i > 0 and starts[i - 1] + open_blocks[starts[i - 1]][0] > a

    def add(a, n, pending):
        bisect.insort(starts, a)
        open_blocks[a] = [n, pending]

    for i, e in enumerate(events):
        a, n = e.get("addr"), e["size"]
        where = f"event {i} {e['action']} at {a}"
        if e["action"] == "alloc":
            assert not overlaps(a, n), f"{where}: overlaps a block allocated or pending"
            add(a, n, False)
        elif e["action"] == "free_requested":
            if a in open_blocks:
                assert not open_blocks[a][1], f"{where}: freed twice"
                assert open_blocks[a][0] == n, f"{where}: size differs from its alloc"
                open_blocks[a][1] = True
            else:
                assert not overlaps(a, n), f"{where}: overlaps another block"
                add(a, n, True)
        elif e["action"] == "free_completed" and a in open_blocks:
            assert open_blocks[a][1], f"{where}: completed before it was requested"
            del open_blocks[a]
            starts.remove(a)
    for a, (n, pending) in open_blocks.items():
        assert a in final_blocks, f"block at {a} open at the end of the trace is not in the segments"
        assert final_blocks[a] == (n, pending), f"block at {a}: trace and segments disagree"

    # Backward, as the Allocator State History replays it.
    blocks = {a: [n, p] for a, (n, p) in final_blocks.items()}
    segs = dict(final_segs)
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        a, n = e.get("addr"), e["size"]
        where = f"replaying event {i} {e['action']} at {a}"
        if e["action"] == "free_completed":
            blocks[a] = [n, True]
        elif e["action"] == "free_requested":
            assert a in blocks, f"{where}: no block to un-free"
            blocks[a][1] = False
        elif e["action"] == "alloc":
            blocks.pop(a, None)
        elif e["action"] == "segment_free":
            segs[a] = n
        elif e["action"] == "segment_alloc":
            assert segs.get(a) == n, f"{where}: no such segment"
            del segs[a]
        seg_starts = sorted(segs)
        for b, (bn, _) in blocks.items():
            k = bisect.bisect_right(seg_starts, b)
            assert k > 0 and b + bn <= seg_starts[k - 1] + segs[seg_starts[k - 1]], \
                f"{where}: block at {b} outside every segment"
    return len(events), sum(1 for _, p in final_blocks.values() if p)


def main():
    if all(a.endswith(".pickle") for a in sys.argv[1:]):
        for f in sys.argv[1:]:
            with open(f, "rb") as fh:
                events, pending = check(BuiltinsOnly(fh).load())
            print(f"{f}: {events} events, {pending} pending frees: as PyTorch reads it")
        return
    binary, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".pickle"):
            os.remove(os.path.join(out, f))
    env = dict(os.environ, VRAM_SNAPSHOT_DIR=out)
    subprocess.run([binary, "[snapshot]"], env=env, check=True, stdout=subprocess.DEVNULL)
    files = sorted(f for f in os.listdir(out) if f.endswith(".pickle"))
    assert len(files) >= 4, files
    for f in files:
        with open(os.path.join(out, f), "rb") as fh:
            snap = BuiltinsOnly(fh).load()
        events, pending = check(snap)
        assert pending > 0, f"{f}: no free pending at the dump"
        print(f"{f}: {events} events, {pending} pending frees: as PyTorch reads it")


if __name__ == "__main__":
    main()

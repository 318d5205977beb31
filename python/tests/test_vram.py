"""The ctypes handle on libvram_c, on its host backend (no GPU needed).

Run: VRAM_C_LIBRARY=<build>/capi/libvram_c.so python3 -m unittest discover -s python/tests
(the CTest test python.vram does this against the build's library)."""

import ctypes
import ctypes.util
import importlib
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

os.environ["VRAM_BACKEND"] = "host"  # read when a device's allocator is created
os.environ["VRAM_ALLOCATOR"] = "pool"
os.environ.pop("VRAM_TENANT_QUOTA", None)

import vram  # noqa: E402


class VramTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        vram.load()
        vram.shutdown()  # a fresh allocator from the environment above

    def setUp(self):
        vram.set_tenant(None)

    def malloc(self, size, device=0):
        # The signature PyTorch's CUDAPluggableAllocator calls: (ssize_t size, int device, cudaStream_t).
        p = vram._c().vram_malloc(size, device, None)
        self.assertTrue(p, vram._c().vram_last_error())
        return p

    def free(self, p, size, device=0):
        vram._c().vram_free(p, size, device, None)

    def test_stats_use_vram_and_pytorch_names(self):
        p = self.malloc(1 << 20)
        s = vram.stats(0)
        self.assertEqual(vram.describe(0), "host/pool")
        self.assertGreaterEqual(s["live_bytes"], 1 << 20)
        self.assertEqual(s["allocated_bytes.all.current"], s["live_bytes"])
        self.assertEqual(s["reserved_bytes.all.current"], s["reserved_bytes"])
        self.assertGreaterEqual(s["reserved_bytes"], s["live_bytes"])
        self.assertEqual(s["allocation.all.current"], s["live_allocations"])
        self.free(p, 1 << 20)
        s = vram.stats(0)
        self.assertEqual(s["allocated_bytes.all.current"], 0)
        self.assertGreaterEqual(s["allocated_bytes.all.peak"], 1 << 20)
        self.assertIsInstance(s["fragmentation"], float)

    def test_tenants_and_quotas(self):
        vram.set_tenant("model_a")
        vram.set_tenant_quota("model_a", 4 << 20, device=0)
        p = self.malloc(3 << 20)
        self.assertEqual(vram.tenant_usage("model_a", 0), 3 << 20)
        self.assertFalse(vram._c().vram_malloc(2 << 20, 0, None))  # over the 4 MiB quota
        self.assertIn("model_a", vram._c().vram_last_error().decode())
        self.free(p, 3 << 20)
        self.assertEqual(vram.tenant_usage("model_a", 0), 0)
        vram.set_tenant_quota("model_a", 0, device=0)

    def test_step_marks_find_memory_that_grows_every_step(self):
        vram.set_tenant("leaky")
        kept = [self.malloc(512 << 10)]
        counts = [vram.mark_step()]
        for _ in range(11):
            kept.append(self.malloc(512 << 10))
            counts.append(vram.mark_step())
        self.assertEqual(counts[:7], [0] * 7)  # fewer than 8 marks of growth
        self.assertGreaterEqual(counts[-1], 1)
        for p in kept:
            self.free(p, 512 << 10)
        vram.set_tenant(None)

    def test_snapshot_is_a_pytorch_memory_snapshot(self):
        p = self.malloc(4096)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "snapshot.pickle")
            vram.snapshot(path)
            with open(path, "rb") as f:
                snap = pickle.load(f)
        self.free(p, 4096)
        # The top-level keys torch.cuda._memory_viz reads.
        self.assertIn("segments", snap)
        self.assertIn("device_traces", snap)
        self.assertTrue(any(b["state"] == "active_allocated" for seg in snap["segments"] for b in seg["blocks"]))

    def test_errors_raise_vram_error_with_the_library_reason(self):
        with self.assertRaises(vram.VramError):
            vram.set_memory_fraction(2.0, 0)  # a fraction above 1
        with self.assertRaises(vram.VramError):
            vram.snapshot("/nonexistent-directory/x.pickle")
        with self.assertRaises(vram.VramError):
            vram.load("/nonexistent/libvram_c.so")

    def test_framework_hooks_name_symbols_the_library_has(self):
        lib = vram._c()
        for symbol in ("vram_malloc", "vram_free", "vram_cupy_malloc", "vram_cupy_free"):
            self.assertTrue(ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value)
        torch_hook = importlib.import_module("vram.torch")  # importing them needs neither framework
        cupy_hook = importlib.import_module("vram.cupy")
        self.assertTrue(callable(torch_hook.use) and callable(cupy_hook.use))

    def test_a_training_loop_with_the_plan_on_is_served_from_the_plan(self):
        vram.shutdown()
        vram.enable_plan()
        try:
            vram.init(0)
            self.assertEqual(vram.describe(0), "host/pool+plan")
            self.assertEqual(vram.plan_stats(0)["phase"], "online")
            weights = self.malloc(1 << 20)
            grads = []
            for step in range(5):
                vram.mark_step()
                for g in grads:  # zero_grad(set_to_none=True): last step's gradients go
                    self.free(g, 256 << 10)
                acts = [self.malloc((64 << 10) + 512 * i) for i in range(6)]  # forward
                grads = []
                for i in reversed(range(6)):  # backward: activations go, gradients come
                    self.free(acts[i], (64 << 10) + 512 * i)
                    grads.append(self.malloc(256 << 10))
                tmp = self.malloc(128 << 10)  # the optimizer's temporary
                self.free(tmp, 128 << 10)
            plan = vram.plan_stats(0)
            self.assertTrue(plan["enabled"])
            self.assertEqual(plan["phase"], "serving")
            self.assertEqual(plan["plans_made"], 2)  # the first step frees no gradients: recorded again
            vram.mark_step()
            plan = vram.plan_stats(0)
            # Every allocation of the last step from the plan, the gradients across the boundary too.
            self.assertEqual(plan["last_step_planned"], 13)
            self.assertEqual(plan["last_step_off_plan"], 0)
            self.assertEqual(plan["planned_entries"], 13)
            for g in grads:
                self.free(g, 256 << 10)
            self.free(weights, 1 << 20)
            self.assertEqual(vram.stats(0)["live_bytes"], 0)
            self.assertEqual(vram.stats(0)["misuses"], 0)
        finally:
            os.environ.pop("VRAM_PLAN")
            vram.shutdown()

    def test_a_bad_plan_setting_is_refused(self):
        vram.shutdown()
        for value, allocator in (("yes", "pool"), ("1", "slab"), (" 1", "pool")):
            os.environ["VRAM_PLAN"], os.environ["VRAM_ALLOCATOR"] = value, allocator
            try:
                with self.assertRaises(vram.VramError) as e:
                    vram.init(0)
                self.assertIn("VRAM_PLAN", str(e.exception))
            finally:
                os.environ.pop("VRAM_PLAN")
                os.environ["VRAM_ALLOCATOR"] = "pool"
                vram.shutdown()


class LoadTest(unittest.TestCase):
    """What load() says when VRAM_C_LIBRARY (or its path) is not a loadable libvram_c."""

    def load_in_child(self, library):
        # A fresh interpreter: this one has libvram_c loaded already.
        env = dict(os.environ, VRAM_C_LIBRARY=library)
        code = "import vram\ntry:\n    vram.load()\nexcept vram.VramError as e:\n    print(e)\nelse:\n    print('loaded')"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout

    def test_a_file_that_is_not_a_library_is_reported_with_the_loaders_reason(self):
        with tempfile.NamedTemporaryFile("w", suffix=".so") as f:
            f.write("not a shared library\n")
            f.flush()
            message = self.load_in_child(f.name)
            try:
                ctypes.CDLL(f.name)
                self.fail("ctypes loaded a text file")
            except OSError as e:
                loader_says = str(e)
        self.assertIn("could not be loaded", message)
        self.assertIn(f.name, message)
        self.assertIn(loader_says, message)  # the dynamic loader's own words, e.g. "invalid ELF header"
        self.assertNotIn("not found", message)

    def test_a_path_that_does_not_exist_is_not_found(self):
        missing = os.path.join(tempfile.gettempdir(), f"vram-no-such-{os.getpid()}", "libvram_c.so")
        message = self.load_in_child(missing)
        self.assertIn("libvram_c not found", message)
        self.assertIn(missing, message)

    def test_a_library_that_is_not_libvram_c_says_so(self):
        libc = ctypes.util.find_library("c")
        message = self.load_in_child(libc)
        self.assertIn("could not be loaded", message)
        self.assertIn("not libvram_c", message)

    def test_an_explicit_path_that_fails_keeps_the_loaded_library(self):
        before = vram.load()
        with tempfile.NamedTemporaryFile("w", suffix=".so") as f:
            f.write("garbage")
            f.flush()
            with self.assertRaises(vram.VramError) as e:
                vram.load(f.name)
        self.assertIn("could not be loaded", str(e.exception))
        self.assertEqual(vram.library_path(), before)


if __name__ == "__main__":
    unittest.main()

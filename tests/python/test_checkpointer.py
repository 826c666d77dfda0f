"""The Python API on one rank: round trips, dtypes, consistency under mutation, failures.

Run by ctest with Debian's /usr/bin/python3 and PYTHONPATH=build/python.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

import lifeline


def scratch_dir():
    # /var/tmp is on disk: tmpfs (/tmp on many machines) has no O_DIRECT.
    base = os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp")
    return tempfile.mkdtemp(prefix="lifeline-py-", dir=base)


def tiny_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 16)).pow(2).mean().backward()
        opt.step()
    return model, opt


class RoundTrip(unittest.TestCase):
    def setUp(self):
        self.dir = scratch_dir()

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_model_and_adam_state(self):
        model, opt = tiny_model(1)
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "note": "warmup done"}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            ticket = ckpt.save(10, state)
            ticket.wait()
            # The caller's time, part by part: the parts add up to the stall.
            progress = ticket.progress()
            parts = progress["stall_breakdown_seconds"]
            self.assertEqual(sorted(parts), ["plan", "slot", "stage", "submit", "wait"])
            self.assertGreater(parts["plan"], 0)
            self.assertAlmostEqual(sum(parts.values()), progress["stall_seconds"], places=6)

        # A different model and optimizer, trained differently: the load must overwrite all of it.
        model2, opt2 = tiny_model(2)
        state2 = {"model": model2.state_dict(), "optim": opt2.state_dict(), "epoch": 0, "note": ""}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            self.assertEqual(ckpt.load(state2), 10)
        opt2.load_state_dict(state2["optim"])
        for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
            self.assertTrue(torch.equal(a, b), k)
        s1, s2 = opt.state_dict(), opt2.state_dict()
        for pid in s1["state"]:
            for key in ("exp_avg", "exp_avg_sq", "step"):
                self.assertTrue(torch.equal(s1["state"][pid][key], s2["state"][pid][key]), (pid, key))
        self.assertEqual(s1["param_groups"], s2["param_groups"])
        self.assertEqual(state2["epoch"], 3)
        self.assertEqual(state2["note"], "warmup done")

        # Both optimizers now take the same step from the same state.
        x = torch.randn(4, 16)
        for m, o in ((model, opt), (model2, opt2)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
        for a, b in zip(model.parameters(), model2.parameters()):
            self.assertTrue(torch.equal(a, b))

    def test_every_dtype_and_layout(self):
        g = torch.Generator().manual_seed(5)
        tensors = {
            "f64": torch.randn(7, 3, dtype=torch.float64, generator=g),
            "f32": torch.randn(1000, generator=g),
            "f16": torch.randn(33, generator=g).half(),
            "bf16": torch.randn(5, 9, generator=g).bfloat16(),
            "i64": torch.randint(-2**40, 2**40, (17,), generator=g),
            "i32": torch.randint(-2**30, 2**30, (4, 4), dtype=torch.int32, generator=g),
            "i16": torch.randint(-300, 300, (9,), dtype=torch.int16, generator=g),
            "i8": torch.randint(-100, 100, (3,), dtype=torch.int8, generator=g),
            "u8": torch.randint(0, 255, (11,), dtype=torch.uint8, generator=g),
            "bool": torch.rand(13, generator=g) > 0.5,
            "scalar": torch.tensor(2.5),
            "empty": torch.zeros(0, 4),
            "transposed": torch.randn(6, 4, generator=g).t(),  # not contiguous
            "numpy": np.arange(12, dtype=np.float32).reshape(3, 4),
        }
        for name in ("float8_e4m3fn", "float8_e5m2"):
            if hasattr(torch, name):
                tensors[name] = torch.randn(8, generator=g).to(getattr(torch, name))
        objects = {"none": None, "flag": True, "int": 2**70, "float": 0.1, "inf": float("inf"),
                   "bytes": bytes(range(256)), "str": "héllo", "tuple": (1, (2, "x")), "dict": {1: "a", "b": [2]}}
        state = {"t": tensors, "o": objects, "mixed": [tensors["f32"][:3].clone(), "label", (4, 5)]}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            ckpt.save(1, state).wait()

        def blank(x):
            if isinstance(x, torch.Tensor):
                return torch.zeros_like(x) if x.is_contiguous() else torch.zeros_like(x.t()).t()
            if isinstance(x, np.ndarray):
                return np.zeros_like(x)
            return None
        target = {"t": {k: blank(v) for k, v in tensors.items()}, "o": {k: None for k in objects},
                  "mixed": [torch.zeros(3), None, None]}
        self.assertFalse(target["t"]["transposed"].is_contiguous())
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            self.assertEqual(ckpt.load(target), 1)
            self.assertEqual(ckpt.last_load["missing_objects"], [])
        for k, v in tensors.items():
            got = target["t"][k]
            if isinstance(v, np.ndarray):
                self.assertTrue(np.array_equal(v, got), k)
            else:
                self.assertEqual(got.dtype, v.dtype, k)
                self.assertEqual(got.shape, v.shape, k)
                if "float8" in str(v.dtype):  # no comparison kernels for float8 in every torch
                    v, got = v.float(), got.float()
                self.assertTrue(torch.equal(v, got), k)
        self.assertEqual(target["o"], objects)
        self.assertEqual(target["mixed"][1:], ["label", (4, 5)])
        self.assertTrue(torch.equal(target["mixed"][0], tensors["f32"][:3]))

    def test_load_without_checkpoint_returns_none(self):
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            self.assertIsNone(ckpt.load({"w": torch.zeros(3)}))
            self.assertIsNone(ckpt.latest_step())

    def test_load_a_step_and_shape_mismatch(self):
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            ckpt.save(1, {"w": torch.full((4,), 1.0)}).wait()
            ckpt.save(2, {"w": torch.full((4,), 2.0)}).wait()
            w = torch.zeros(4)
            self.assertEqual(ckpt.load({"w": w}, step=1), 1)
            self.assertTrue(torch.equal(w, torch.full((4,), 1.0)))
            self.assertEqual(ckpt.load({"w": w}), 2)
            self.assertTrue(torch.equal(w, torch.full((4,), 2.0)))
            with self.assertRaises(lifeline.Error) as e:
                ckpt.load({"w": torch.zeros(5)})
            self.assertIn("w", str(e.exception))
            with self.assertRaises(lifeline.Error) as e:
                ckpt.load({"nope": torch.zeros(4)})
            self.assertIn("nope", str(e.exception))
            self.assertEqual(e.exception.code, "NotInCheckpoint")

    def test_bad_state_is_refused_with_the_path(self):
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            with self.assertRaisesRegex(TypeError, r"layer\.weird"):
                ckpt.save(1, {"layer": {"w": torch.zeros(2), "weird": object()}})
            with self.assertRaisesRegex(TypeError, "complex"):
                ckpt.save(1, {"c": torch.zeros(2, dtype=torch.complex64)})
            with self.assertRaisesRegex(ValueError, "flat_range"):
                lifeline.Shard(torch.zeros(3), global_shape=(10,), flat_range=(0, 4))
            with self.assertRaisesRegex(ValueError, "replica"):
                lifeline.Shard(torch.zeros(3), replica=(2, 2))
            with self.assertRaisesRegex(TypeError, "unknown option 'keep'"):
                lifeline.Checkpointer(self.dir, rank=0, world_size=1, keep=3)


class Consistency(unittest.TestCase):
    """What is persisted is the state at save() time, whatever happens after wait_snapshot()."""

    def setUp(self):
        self.dir = scratch_dir()

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_mutation_after_wait_snapshot_never_leaks(self):
        g = torch.Generator().manual_seed(9)
        state = {f"p{i}": torch.randn(1 << 20, generator=g) for i in range(8)}  # 32 MiB
        expected = {k: v.clone() for k, v in state.items()}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1, copy_threads=1) as ckpt:
            ticket = ckpt.save(5, state)
            ticket.wait_snapshot()
            for v in state.values():  # the optimizer's step, right after the snapshot
                v.mul_(-3.0).add_(1.0)
            ticket.wait()
        loaded = {k: torch.empty_like(v) for k, v in state.items()}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            ckpt.load(loaded)
        for k in state:
            self.assertTrue(torch.equal(loaded[k], expected[k]), k)
            self.assertFalse(torch.equal(loaded[k], state[k]), k)

    def test_guard_optimizer_waits_for_the_snapshot(self):
        model, opt = tiny_model(3)
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            lifeline.guard_optimizer(opt, ckpt)
            saved = {k: v.clone() for k, v in model.state_dict().items()}
            ticket = ckpt.save(1, {"model": model.state_dict()})
            opt.zero_grad()
            model(torch.randn(4, 16)).pow(2).mean().backward()
            opt.step()  # must not change the parameters before their copy is complete
            self.assertNotEqual(ticket.phase, "copying")
            ticket.wait()
        loaded = {k: torch.empty_like(v) for k, v in saved.items()}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            ckpt.load({"model": loaded})
        for k in saved:
            self.assertTrue(torch.equal(loaded[k], saved[k]), k)

    def test_wait_tensor(self):
        state = {"a": torch.ones(1 << 18), "b": torch.ones(1 << 18)}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            t = ckpt.save(1, state)
            t.wait_tensor("a")
            state["a"].zero_()
            t.wait()
            with self.assertRaises(KeyError):
                t.wait_tensor("c")
        out = {"a": torch.zeros(1 << 18), "b": torch.zeros(1 << 18)}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1) as ckpt:
            ckpt.load(out)
        self.assertTrue(torch.equal(out["a"], torch.ones(1 << 18)))


class Failures(unittest.TestCase):
    """A failed save raises lifeline.Error, harms no earlier checkpoint, and training goes on."""

    def setUp(self):
        self.dir = scratch_dir()

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_names_and_paths_that_are_not_utf8(self):
        # Issue 32, item 14: such a name got pybind11's "incompatible function arguments".
        odd = os.fsdecode(b"run-\xff")  # undecodable bytes, as os.listdir gives them back
        c = lifeline.Checkpointer(os.path.join(self.dir, odd), rank=0, world_size=1)
        with self.assertRaises(ValueError) as e:
            c.save(1, {"w": torch.ones(4), odd: torch.zeros(2)})
        self.assertIn("is not valid UTF-8", str(e.exception))
        self.assertIn("run-", str(e.exception))
        # The directory itself is fine: a path is bytes to the OS.
        c.save(2, {"w": torch.ones(4)}).wait()
        c.close()
        self.assertTrue(os.path.isdir(os.path.join(os.fsencode(self.dir), b"run-\xff", b"step-00000000000000000002")))
        back = {"w": torch.zeros(4)}
        c = lifeline.Checkpointer(os.path.join(os.fsencode(self.dir), b"run-\xff"), rank=0, world_size=1)
        self.assertEqual(c.load(back), 2)
        self.assertTrue(torch.equal(back["w"], torch.ones(4)))
        c.close()

    def test_directory_that_cannot_be_created(self):
        blocker = os.path.join(self.dir, "file")
        open(blocker, "w").close()
        with self.assertRaises(lifeline.Error) as e:
            lifeline.Checkpointer(os.path.join(blocker, "ckpt"), rank=0, world_size=1)
        self.assertIn(blocker, str(e.exception))

    def check_disk_full(self, ckpt, state):
        good = {k: v.clone() for k, v in state.items()}
        ckpt.save(1, state).wait()
        for v in state.values():
            v.add_(1.0)
        ckpt.inject_faults(fail_writes_after_bytes=4096)  # "disk full" a little way into the next save
        ticket = ckpt.save(2, state)
        with self.assertRaises(lifeline.Error) as e:
            ticket.wait()
        self.assertIn("No space left", str(e.exception))
        self.assertEqual(ticket.phase, "failed")
        self.assertEqual(ckpt.latest_step(), 1)
        # The earlier checkpoint still loads, exactly.
        out = {k: torch.empty_like(v) for k, v in state.items()}
        self.assertEqual(ckpt.load(out), 1)
        for k in out:
            self.assertTrue(torch.equal(out[k], good[k]), k)
        # Space comes back; training goes on and the next save works.
        ckpt.inject_faults()
        for v in state.values():
            v.add_(1.0)
        ckpt.save(3, state).wait()
        self.assertEqual(ckpt.latest_step(), 3)
        self.assertEqual(ckpt.load(out), 3)
        for k in out:
            self.assertTrue(torch.equal(out[k], state[k]), k)

    def test_disk_full_injected(self):
        state = {"w": torch.randn(1 << 16), "b": torch.randn(100)}
        with lifeline.Checkpointer(self.dir, rank=0, world_size=1, fault_injection=True) as ckpt:
            self.check_disk_full(ckpt, state)

    def test_disk_full_on_a_tiny_tmpfs(self):
        mnt = os.path.join(self.dir, "tiny")
        os.mkdir(mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); "
                          f"the injected disk-full test covers the same path")
        try:
            state = {"w": torch.randn(96 << 10)}  # 384 KiB per save: the third one cannot fit in 2 MiB
            good = state["w"].clone()
            # tmpfs has no O_DIRECT: the library falls back to buffered writes.
            with lifeline.Checkpointer(mnt, rank=0, world_size=1, keep_last=0) as ckpt:
                ckpt.save(1, state).wait()
                filler = os.path.join(mnt, "filler")
                with open(filler, "wb") as f:  # leave less room than one more checkpoint needs
                    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
                    f.write(b"\0" * max(0, free - (128 << 10)))
                state["w"].add_(1.0)
                with self.assertRaises(lifeline.Error) as e:
                    ckpt.save(2, state).wait()
                self.assertIn("No space left", str(e.exception))
                out = {"w": torch.empty_like(good)}
                self.assertEqual(ckpt.load(out), 1)
                self.assertTrue(torch.equal(out["w"], good))
                os.unlink(filler)
                ckpt.save(3, state).wait()
                self.assertEqual(ckpt.latest_step(), 3)
        finally:
            subprocess.run(["umount", mnt])


class MemoryTierOnExit(unittest.TestCase):
    """A process that ends on an exception is not the end of the job: its memory-tier snapshots stay
    for the relaunch, as after a crash. An orderly close() removes those already on disk."""

    def setUp(self):
        self.dir = scratch_dir()

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def tier_steps(self):
        c = lifeline.Checkpointer(self.dir, rank=0, world_size=1, memory_tier=True)
        steps = [i["step"] for i in c.list(memory_tier=True) if i["complete"]]
        c.close(keep_memory_tier=True)
        return steps

    def run_child(self, step, ending):
        code = ("import sys, torch, lifeline\n"
                f"c = lifeline.Checkpointer({self.dir!r}, rank=0, world_size=1, memory_tier=True)\n"
                f"c.save({step}, {{'w': torch.ones(64)}}).wait()\n" + ending)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, LIFELINE_LAUNCH_ID=""))

    def test_an_exception_keeps_the_snapshots_and_close_removes_them(self):
        r = self.run_child(1, "raise RuntimeError('peer died')\n")
        self.assertIn("peer died", r.stderr)
        self.assertIn(1, self.tier_steps(), r.stderr)
        r = self.run_child(2, "with c:\n    raise RuntimeError('peer died')\n")
        self.assertIn("peer died", r.stderr)
        self.assertIn(2, self.tier_steps(), r.stderr)
        r = self.run_child(3, "c.close()\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn(3, self.tier_steps(), r.stderr)


class MemoryTierHygiene(unittest.TestCase):
    """Issue 32, item 3: deleted steps came back from memory, and tier roots piled up with no
    command to see or free them. Runs on a tier of its own (LIFELINE_MEMORY_TIER_DIR)."""

    def setUp(self):
        self.base = scratch_dir()
        self.dir = os.path.join(self.base, "ckpt")
        self.env = dict(os.environ, LIFELINE_LAUNCH_ID="", LIFELINE_MEMORY_TIER_DIR=os.path.join(self.base, "shm"))
        self.cli = os.path.join(os.environ["LIFELINE_BIN"], "lifeline")

    def tearDown(self):
        shutil.rmtree(self.base, ignore_errors=True)

    def python(self, code):
        r = subprocess.run([sys.executable, "-c", "import sys, torch, lifeline\n" + code], capture_output=True,
                           text=True, env=self.env, timeout=120)
        return r

    def tier(self, *args):
        r = subprocess.run([self.cli, "tier", *args, "--json"], capture_output=True, text=True, env=self.env,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return json.loads(r.stdout)

    def test_deleted_steps_stay_deleted_and_tier_gc_frees_what_nobody_can_load(self):
        # A job that crashes after step 2 leaves its snapshots in memory for its relaunch.
        r = self.python(f"c = lifeline.Checkpointer({self.dir!r}, memory_tier=True)\n"
                        "for s in (1, 2): c.save(s, {'w': torch.full((4096,), float(s))}).wait()\n"
                        "c.close(keep_memory_tier=True)\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        roots = self.tier("ls")["roots"]
        self.assertEqual(len(roots), 1, roots)
        self.assertEqual((roots[0]["state"], roots[0]["offered"], roots[0]["in_use"]), ("current", 2, False))
        self.assertGreater(roots[0]["bytes"], 2 * 4096 * 4)

        # The user deletes the steps to start over: a new job starts fresh, not from memory.
        for name in os.listdir(self.dir):
            if name.startswith("step-"):
                shutil.rmtree(os.path.join(self.dir, name))
        self.assertEqual(self.tier("ls")["roots"][0]["offered"], 0)
        r = self.python(f"c = lifeline.Checkpointer({self.dir!r}, memory_tier=True)\n"
                        "w = torch.zeros(4096)\n"
                        "print('loaded', c.load({'w': w}))\n"
                        "c.close()\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("loaded None", r.stdout)
        # Its orderly end left no folder behind.
        self.assertEqual(self.tier("ls")["roots"], [])

        # A crashed job's tier whose directory was then removed: gc frees it, a dry run first.
        r = self.python(f"c = lifeline.Checkpointer({self.dir!r}, memory_tier=True)\n"
                        "c.save(5, {'w': torch.ones(4096)}).wait()\n"
                        "c.close(keep_memory_tier=True)\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        shutil.rmtree(self.dir)
        roots = self.tier("ls")["roots"]
        self.assertEqual([(x["state"], x["steps"]) for x in roots], [("gone", 1)])
        dry = self.tier("gc", "--dry-run")
        self.assertEqual(len(dry["removed_roots"]), 1)
        self.assertEqual(len(self.tier("ls")["roots"]), 1)
        freed = self.tier("gc")  # (see below for what is left)
        self.assertEqual([x["root"] for x in freed["removed_roots"]], [roots[0]["root"]])
        self.assertGreater(freed["bytes_freed"], 4096 * 4)
        self.assertEqual(self.tier("ls")["roots"], [])

    def test_a_memory_tier_too_small_for_the_snapshot_is_said(self):
        # A container's /dev/shm is 64 MB: the tier then held nothing, and nobody said so.
        shm = os.path.join(self.base, "small-shm")
        os.makedirs(shm)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", shm], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("cannot mount a small tmpfs: " + r.stderr.strip())
        try:
            env = dict(self.env, LIFELINE_MEMORY_TIER_DIR=shm)
            r = subprocess.run([sys.executable, "-c", "import torch, lifeline\n"
                                f"c = lifeline.Checkpointer({self.dir!r}, memory_tier=True)\n"
                                "c.save(1, {'w': torch.ones(1024, 1024)}).wait()\n"
                                "c.save(2, {'w': torch.ones(1024, 1024)}).wait()\n"
                                "c.close()\n"], capture_output=True, text=True, env=env, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stderr.count("is not in the memory tier"), 1, r.stderr)
            self.assertIn("step 1 is not in the memory tier: cannot stage the snapshot in shared memory", r.stderr)
            self.assertIn("shared memory is full", r.stderr)
        finally:
            subprocess.run(["umount", shm])


if __name__ == "__main__":
    unittest.main()

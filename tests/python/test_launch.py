"""A step belongs to one launch, and all ranks of a launch resume from one step (issue 17).

Ranks here are processes joined by torch.distributed (gloo), with no agent and no torchrun: the
Python Checkpointer agrees a launch id over the process group, and load() agrees the resume step,
even when the ranks see different checkpoints (one rank's memory tier holds a newer one). A load
that falls back from a damaged checkpoint says so in last_load["skipped"] and as a warning; one
that asks for a tensor the newest checkpoint lacks stops on every rank instead of falling back.
"""
import os
import shutil
import tempfile
import unittest
import warnings

import torch

import gloo_ranks
import lifeline

ROWS, COLS = 8, 16
def rows_of(rank, world):
    per = ROWS // world
    return rank * per, per


def state_for(rank, world, step, bias=False):
    begin, n = rows_of(rank, world)
    t = torch.arange(begin * COLS, (begin + n) * COLS, dtype=torch.float32).reshape(n, COLS) + 1000 * step
    state = {"w": lifeline.Shard(t, global_shape=(ROWS, COLS), offsets=(begin, 0)), "step": step}
    if bias:  # a parameter only some steps have
        state["bias"] = lifeline.Shard(torch.full((1, COLS), float(step)), global_shape=(world, COLS), offsets=(rank, 0))
    return state


def worker(args):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank,
                            world_size=args.world)
    opts = {}
    if args.tier:
        opts = {"memory_tier": True, "memory_tier_directory": args.tier}
    ckpt = lifeline.Checkpointer(args.dir, rank=args.rank, world_size=args.world, **opts)
    out = {}
    if args.role == "save":
        for step in args.steps:
            ckpt.save(step, state_for(args.rank, args.world, step, step in args.bias_steps)).wait()
        out["saved"] = args.steps
    elif args.role == "load_bias":
        state = state_for(args.rank, args.world, 0, bias=True)
        try:
            out["loaded"] = ckpt.load(state)
        except lifeline.Error as e:
            out["error"], out["code"] = str(e), e.code
        out["bias_untouched"] = bool(torch.all(state["bias"].tensor == 0))
    else:
        state = state_for(args.rank, args.world, 0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["loaded"] = ckpt.load(state)
        out["warnings"] = [str(w.message) for w in caught]
        out["skipped"] = ckpt.last_load["skipped"] if ckpt.last_load else []
        expected = state_for(args.rank, args.world, out["loaded"])["w"].tensor if out["loaded"] is not None else None
        out["data_ok"] = expected is not None and torch.equal(state["w"].tensor, expected)
    ckpt.close()
    dist.destroy_process_group()
    gloo_ranks.finish(out)


def run_ranks(directory, role, world=2, steps=(), tiers=None, bias_steps=()):
    def args(r):
        a = ["--role", role, "--dir", directory]
        a += ["--steps"] + [str(x) for x in steps] if steps else []
        a += ["--bias-steps"] + [str(x) for x in bias_steps] if bias_steps else []
        return a + (["--tier", tiers[r]] if tiers and tiers[r] else [])
    return gloo_ranks.run_ranks(__file__, world, args)


class Launch(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lifeline-launch-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
        self.dir = os.path.join(self.tmp, "ckpt")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_ranks_agree_on_a_launch_id_without_agent_or_torchrun(self):
        results, out = run_ranks(self.dir, "save", steps=[1, 2])
        self.assertTrue(all(results), out)
        complete = [c["step"] for c in lifeline.Checkpointer(self.dir, rank=0, world_size=1).list() if c["complete"]]
        self.assertEqual(sorted(complete), [1, 2])
        # Two launches never share an id: a second launch's files carry another run hash.
        run_ranks(self.dir, "save", steps=[3])
        names = {n.split(".")[0] for s in ("step-00000000000000000002", "step-00000000000000000003")
                 for n in os.listdir(os.path.join(self.dir, s)) if n.endswith(".index")}
        self.assertEqual(len(names), 2, names)

    def test_ranks_resume_from_one_step_when_their_views_differ(self):
        results, out = run_ranks(self.dir, "save", steps=[1, 2])
        self.assertTrue(all(results), out)
        # Rank 0's memory tier holds a complete step 3 that rank 1 cannot see.
        tier = os.path.join(self.tmp, "tier0")
        results, out = run_ranks(tier, "save", steps=[3])
        self.assertTrue(all(results), out)
        results, out = run_ranks(self.dir, "load", tiers=[tier, None])
        self.assertTrue(all(results), out)
        self.assertEqual([r["loaded"] for r in results], [2, 2], out)
        self.assertTrue(all(r["data_ok"] for r in results), out)

    def test_a_fallback_is_reported_and_warned(self):
        results, out = run_ranks(self.dir, "save", steps=[1, 2])
        self.assertTrue(all(results), out)
        step2 = os.path.join(self.dir, "step-00000000000000000002")
        for name in os.listdir(step2):
            if name.endswith(".data"):
                path = os.path.join(step2, name)
                with open(path, "r+b") as f:
                    f.seek(4096 + 8)
                    b = f.read(1)
                    f.seek(4096 + 8)
                    f.write(bytes([b[0] ^ 0x10]))
                break
        results, out = run_ranks(self.dir, "load")
        self.assertTrue(all(results), out)
        for r in results:
            self.assertEqual(r["loaded"], 1, out)
            self.assertTrue(r["data_ok"], out)
            self.assertEqual([s["step"] for s in r["skipped"]], [2], out)
            self.assertIn("checksum", " ".join(s["reason"] for s in r["skipped"]).lower(), out)
            self.assertTrue(any("step 2" in w and "loaded step 1" in w for w in r["warnings"]), r["warnings"])


    def test_a_tensor_the_newest_step_lacks_stops_every_rank_instead_of_resuming_the_past(self):
        # Step 1 has "bias", step 2 (the newest) does not: a model that asks for "bias" is the
        # caller's mismatch, decided by its code on every rank, not a reason to load step 1.
        results, out = run_ranks(self.dir, "save", steps=[1, 2], bias_steps=[1])
        self.assertTrue(all(results), out)
        results, out = run_ranks(self.dir, "load_bias")
        for r in results:
            self.assertNotIn("loaded", r, out)
            self.assertEqual(r["code"], "NotInCheckpoint", out)
            self.assertIn("'bias' is not in the checkpoint of step 2", r["error"], out)
            self.assertTrue(r["bias_untouched"], out)


def _worker_arguments(p):
    p.add_argument("--steps", type=int, nargs="*", default=[])
    p.add_argument("--bias-steps", type=int, nargs="*", default=[])
    p.add_argument("--tier", default=None)


if __name__ == "__main__":
    gloo_ranks.main(worker, _worker_arguments)

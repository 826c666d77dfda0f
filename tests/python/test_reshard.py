"""Resharding through the Python API alone, across real processes.

4 processes save a tensor-parallel x data-parallel state (tp=2, dp=2) with ZeRO-style flat shards of
the optimizer state; 2 processes (tp=1, dp=2) load it, check every element, change it and save it in
their own layout; 3 processes (tp=3) load that and check it; 1 process loads both steps whole.
Per-rank objects (an RNG state, a data position) follow their rank.

Run by ctest: /usr/bin/python3 test_reshard.py (the test); it runs itself with --role for each rank.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import lifeline

# name -> (global shape, dtype, the dimension split by tensor parallelism, or None: replicated)
PARAMS = {
    "embed": ((40, 16), torch.float32, None),
    "attn.qkv": ((48, 16), torch.float32, 0),   # column parallel: rows split
    "attn.proj": ((16, 48), torch.bfloat16, 1),  # row parallel: columns split
    "norm": ((16,), torch.float32, None),
}


def global_value(name, shape, dtype, delta):
    n = 1
    for d in shape:
        n *= d
    base = sum(map(ord, name)) % 97
    t = (torch.arange(n, dtype=torch.float64) * 0.25 + base + delta).reshape(shape)
    return t.to(dtype)


def box(shape, split_dim, tp, tp_index):
    """(offsets, shape) of tensor-parallel piece `tp_index` of `tp`."""
    offsets, piece = [0] * len(shape), list(shape)
    if split_dim is not None and tp > 1:
        assert shape[split_dim] % tp == 0
        piece[split_dim] = shape[split_dim] // tp
        offsets[split_dim] = piece[split_dim] * tp_index
    return offsets, piece


def region(t, offsets, shape):
    return t[tuple(slice(o, o + s) for o, s in zip(offsets, shape))]


def build_state(rank, world, tp, delta, fill):
    """This rank's state in layout (tp, dp = world // tp). fill=True: the values of step `delta`,
    else zeros (a load target). Also returns the expected values of every piece."""
    dp = world // tp
    tp_i, dp_i = rank % tp, rank // tp
    model, optim, expected = {}, {}, {}
    for name, (shape, dtype, split) in PARAMS.items():
        full = global_value(name, shape, dtype, delta)
        offsets, piece = box(shape, split, tp, tp_i)
        p = region(full, offsets, piece).contiguous()
        t = p.clone() if fill else torch.zeros_like(p)
        if split is None:
            model[name] = lifeline.Shard(t, replica=(rank, world))
        else:
            model[name] = lifeline.Shard(t, global_shape=shape, offsets=offsets, replica=(dp_i, dp))
        expected["model." + name] = p
        # Adam moments: ZeRO over the data-parallel ranks, a flat range of this tensor-parallel piece.
        n = p.numel()
        b, e = n * dp_i // dp, n * (dp_i + 1) // dp
        moments = {}
        for k, scale in (("exp_avg", 0.5), ("exp_avg_sq", 2.0)):
            fullm = (global_value(name, shape, torch.float32, delta) * scale)
            flat = region(fullm, offsets, piece).reshape(-1)[b:e].contiguous()
            # A parameter that tensor parallelism does not split has the same moments on every
            # tensor-parallel rank: replicas, written once.
            moments[k] = lifeline.Shard(flat.clone() if fill else torch.zeros_like(flat), global_shape=shape,
                                        offsets=offsets, shape=piece, flat_range=(b, e),
                                        replica=(tp_i, tp) if split is None else None)
            expected[f"optim.{name}.{k}"] = flat
        step_t = torch.tensor(float(delta))
        moments["step"] = lifeline.Shard(step_t.clone() if fill else torch.zeros(()), replica=(rank, world))
        expected[f"optim.{name}.step"] = step_t
        optim[name] = moments
    state = {"model": model, "optim": optim,
             "rng": f"rng-of-rank-{rank}-step-{delta}" if fill else None,
             "data_position": 1000 * rank + delta if fill else None}
    return state, expected


def tensor_at(state, path):
    node = state
    parts = path.split(".")
    # Parameter names contain dots ("attn.qkv"): match the longest key first.
    i = 0
    while i < len(parts):
        for j in range(len(parts), i, -1):
            key = ".".join(parts[i:j])
            if isinstance(node, dict) and key in node:
                node, i = node[key], j
                break
        else:
            raise KeyError(path)
    return node.tensor if isinstance(node, lifeline.Shard) else node


def role(args):
    rank, world, tp = args.rank, args.world, args.tp
    ckpt = lifeline.Checkpointer(args.dir, rank=rank, world_size=world)
    if args.role == "save":
        state, _ = build_state(rank, world, tp, args.step, fill=True)
        ckpt.save(args.step, state).wait()
        ckpt.close()
        return 0
    state, expected = build_state(rank, world, tp, args.step, fill=False)
    got = ckpt.load(state, step=args.step, objects_of_rank=args.objects_of)
    if got != args.step:
        print(f"rank {rank}: loaded step {got}, wanted {args.step}")
        return 1
    bad = []
    for path, want in expected.items():
        have = tensor_at(state, path)
        if have.dtype != want.dtype or not torch.equal(have, want):
            bad.append(f"{path}: max |diff| {(have.double() - want.double()).abs().max().item()}")
    owner = rank if args.objects_of is None else args.objects_of
    if owner < args.saved_world:
        if state["rng"] != f"rng-of-rank-{owner}-step-{args.saved_step}" or \
                state["data_position"] != 1000 * owner + args.saved_step:
            bad.append(f"per-rank objects: {state['rng']!r}, {state['data_position']!r} (owner {owner})")
    if bad:
        print(f"rank {rank}/{world} tp={tp}: {len(bad)} mismatches:\n  " + "\n  ".join(bad))
        return 1
    if args.resave is not None:
        # Training goes on in this layout: change everything, save it as a new step.
        new_state, _ = build_state(rank, world, tp, args.resave, fill=True)
        new_state["rng"] = f"rng-of-rank-{rank}-step-{args.resave}"
        ckpt.save(args.resave, new_state).wait()
    ckpt.close()
    return 0


def run_ranks(directory, world, tp, role_name, step, saved_world=None, saved_step=None, resave=None,
              objects_of=None):
    procs = []
    # Ranks started by hand (no agent, no torchrun, no torch.distributed) need a launch id of their
    # own, the same on every rank and new for every launch, as the README says.
    env = dict(os.environ, LIFELINE_LAUNCH_ID=f"reshard-{role_name}-{step}-{os.urandom(4).hex()}")
    for r in range(world):
        cmd = [sys.executable, os.path.abspath(__file__), "--role", role_name, "--dir", directory, "--rank", str(r),
               "--world", str(world), "--tp", str(tp), "--step", str(step),
               "--saved-world", str(saved_world or world), "--saved-step", str(saved_step or step)]
        if resave is not None:
            cmd += ["--resave", str(resave)]
        if objects_of is not None:
            cmd += ["--objects-of", str(objects_of)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], outputs


class Reshard(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lifeline-reshard-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def expect_ok(self, what, result):
        codes, outputs = result
        self.assertEqual(codes, [0] * len(codes), f"{what}:\n" + "".join(outputs))

    def test_4_to_2_to_3_to_1(self):
        self.expect_ok("save from 4 ranks (tp=2, dp=2)", run_ranks(self.dir, 4, 2, "save", 10))
        # 2 ranks, tp=1 dp=2: whole tensors replicated, moments ZeRO-split in halves of the whole tensor.
        self.expect_ok("load into 2 ranks (tp=1, dp=2), then save step 20",
                       run_ranks(self.dir, 2, 1, "load", 10, saved_world=4, saved_step=10, resave=20))
        # 3 ranks, tp=3: tensor-parallel pieces of another size, and ranks with no per-rank objects.
        self.expect_ok("load step 20 into 3 ranks (tp=3)",
                       run_ranks(self.dir, 3, 3, "load", 20, saved_world=2, saved_step=20))
        self.expect_ok("load step 10 into 3 ranks (tp=3)",
                       run_ranks(self.dir, 3, 3, "load", 10, saved_world=4, saved_step=10))
        self.expect_ok("load step 10 into 1 rank, rank 3's objects",
                       run_ranks(self.dir, 1, 1, "load", 10, saved_world=4, saved_step=10, objects_of=3))
        self.expect_ok("load step 20 into 1 rank",
                       run_ranks(self.dir, 1, 1, "load", 20, saved_world=2, saved_step=20))


if __name__ == "__main__":
    if "--role" in sys.argv:
        p = argparse.ArgumentParser()
        p.add_argument("--role", choices=["save", "load"])
        p.add_argument("--dir")
        p.add_argument("--rank", type=int)
        p.add_argument("--world", type=int)
        p.add_argument("--tp", type=int)
        p.add_argument("--step", type=int)
        p.add_argument("--saved-world", type=int)
        p.add_argument("--saved-step", type=int)
        p.add_argument("--resave", type=int)
        p.add_argument("--objects-of", type=int)
        torch.set_num_threads(1)
        sys.exit(role(p.parse_args()))
    unittest.main()

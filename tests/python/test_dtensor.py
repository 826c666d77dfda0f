"""DTensors natively (issue 31): FSDP2, tensor parallel and both on a 2-D mesh, saved as boxes of
their global tensors straight from the local shards and loaded into any other layout.

Four gloo ranks train an MLP sharded with tensor parallelism (ColwiseParallel, RowwiseParallel) and
FSDP2 (fully_shard) on a 2x2 mesh with Adam, with dimensions that do not divide evenly (FSDP2's
strided sharding of TP's shards, uneven and empty chunks), and save it through
lifeline.torch.state_dict and, separately, the dict torch's get_state_dict returns. Each checkpoint
loads into 2 FSDP2 ranks, into one plain process and into 3 DDP ranks, with parameters and Adam
state elementwise equal to get_state_dict(..., full_state_dict=True) of the saving job, and the
replicas are stored once. DTensors of mixed placements saved on the 2x2 mesh load into a 1-D mesh
of 3 ranks exactly; a Partial DTensor is refused naming it. Needs torch >= 2.6 (DTensor and FSDP2
public): skipped, saying so, under older torch (Debian 12's 1.13).
"""
import json
import os
import subprocess
import sys
import unittest

import torch

import gloo_ranks
import lifeline
import lifeline.torch
from lifeline import _dtensor

from torch_versions import NO_FSDP2

if not NO_FSDP2:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

STEPS = 3
BIN = os.environ.get("LIFELINE_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin"))
IN, HIDDEN, OUT = 10, 14, 6  # 14 rows over 2x2 shards: 4, 4, 3, 3 (uneven); 6 over 4: 2, 2, 2, 0


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(IN, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, OUT)
        self.register_buffer("calls", torch.zeros(2))

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def make_model():
    torch.manual_seed(1234)
    return MLP()


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.95), weight_decay=0.01)


def init(args, world):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank, world_size=world)


def full_state(model, optimizer):
    """get_state_dict(..., full_state_dict=True): plain tensors by parameter name, on every rank."""
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    out = {f"model.{k}": v.detach().clone() for k, v in msd.items()}
    for name, s in osd["state"].items():
        for k, v in s.items():
            out[f"optim.{name}.{k}"] = v.clone() if isinstance(v, torch.Tensor) else v
    out["lr"] = osd["param_groups"][0]["lr"]
    return out


def differences(got, want):
    if sorted(got) != sorted(want):
        return [f"keys {sorted(got)} != {sorted(want)}"]
    out = []
    for k, v in want.items():
        g = got[k]
        if isinstance(v, torch.Tensor):
            if not (g.dtype == v.dtype and g.shape == v.shape and torch.equal(g, v)):
                out.append(k)
        elif g != v:
            out.append(f"{k}: {g} != {v}")
    return out


def batch(step, rank=0):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, IN, generator=g)


def train_fsdp_tp(args):
    """4 ranks, mesh (dp=2, tp=2): TP inside, FSDP2 over it; Adam; saves both ways at STEPS."""
    init(args, 4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = make_model()
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = make_optimizer(model)
    for step in range(1, STEPS + 1):
        model(batch(step, mesh["dp"].get_local_rank())).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    placements = {n: [str(p) for p in t.placements] for n, t in model.state_dict().items() if _dtensor.is_dtensor(t)}
    with lifeline.Checkpointer(os.path.join(args.dir, "torch"), rank=args.rank, world_size=4) as ckpt:
        ckpt.save(STEPS, lifeline.torch.state_dict(model, optimizer)).wait()
    msd, osd = get_state_dict(model, optimizer)
    with lifeline.Checkpointer(os.path.join(args.dir, "sd"), rank=args.rank, world_size=4) as ckpt:
        ckpt.save(STEPS, {"model": msd, "optim": osd}).wait()
    want = full_state(model, optimizer)
    if args.rank == 0:
        torch.save(want, os.path.join(args.dir, "want.pt"))
    gloo_ranks.finish({"placements": placements})


def load_into(args):
    """Loads the saved job into `args.into`: fsdp2 (2 ranks), plain (1), ddp (3), and compares."""
    world = {"fsdp2": 2, "plain": 1, "ddp": 3}[args.into]
    init(args, world)
    model = make_model()
    with torch.no_grad():  # not the saved values
        for p in model.parameters():
            p.fill_(7.0)
    if args.into == "fsdp2":
        fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    elif args.into == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = make_optimizer(model.module if args.into == "ddp" else model)
    with lifeline.Checkpointer(os.path.join(args.dir, args.source), rank=args.rank, world_size=world) as ckpt:
        if args.source == "torch":
            step = lifeline.torch.load(ckpt, model, optimizer)
        else:  # torch's own state dict, as get_state_dict gives it (optimizer state initialised)
            msd, osd = get_state_dict(model, optimizer)
            step = ckpt.load({"model": msd, "optim": osd})
            set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
    got = full_state(model, optimizer)
    want = torch.load(os.path.join(args.dir, "want.pt"))
    gloo_ranks.finish({"step": step, "differences": differences(got, want)})


# The DTensors of the mixed-placement test: (name, global shape, placements on the 2x2 mesh,
# placements on the 1-D mesh of 3).
MIXED = [
    ("rows_cols", (7, 5), "S0 S1", "S1"),
    ("cols_replicated", (6, 9), "S1 R", "S0"),
    ("replicated_rows", (5, 4), "R S0", "R"),
    ("rows_rows", (9, 3), "S0 S0", "S0"),
    ("all_replicated", (4, 4), "R R", "S1"),
    ("cube", (3, 5, 4), "S2 S0", "S1"),
    ("tiny", (1, 6), "S0 S1", "S0"),
    ("scalar", (), "R R", "R"),
]


def placements_of(text):
    return [Replicate() if p == "R" else Shard(int(p[1:])) for p in text.split()]


def global_value(i, shape):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float64) + 1000.0 * i).reshape(shape)


def mixed_save(args):
    init(args, 4)
    mesh = init_device_mesh("cpu", (2, 2))
    state = {name: distribute_tensor(global_value(i, shape), mesh, placements_of(p2))
             for i, (name, shape, p2, _p1) in enumerate(MIXED)}
    with lifeline.Checkpointer(os.path.join(args.dir, "mixed"), rank=args.rank, world_size=4) as ckpt:
        ckpt.save(1, state).wait()
    gloo_ranks.finish({})


def mixed_load(args):
    init(args, 3)
    mesh = init_device_mesh("cpu", (3,))
    state = {name: distribute_tensor(torch.full(shape, -1.0, dtype=torch.float64), mesh, placements_of(p1))
             for name, shape, _p2, p1 in MIXED}
    with lifeline.Checkpointer(os.path.join(args.dir, "mixed"), rank=args.rank, world_size=3) as ckpt:
        step = ckpt.load(state)
    wrong = [name for i, (name, shape, _p2, _p1) in enumerate(MIXED)
             if not torch.equal(state[name].full_tensor(), global_value(i, shape))]
    gloo_ranks.finish({"step": step, "wrong": wrong})


def partial(args):
    init(args, 1)
    mesh = init_device_mesh("cpu", (1,))
    state = {"w": DTensor.from_local(torch.ones(3), mesh, [Partial()])}
    try:
        with lifeline.Checkpointer(os.path.join(args.dir, "partial"), rank=0, world_size=1) as ckpt:
            ckpt.save(1, state).wait()
        error = None
    except TypeError as e:
        error = str(e)
    gloo_ranks.finish({"error": error})


def worker(args):
    {"train": train_fsdp_tp, "load": load_into, "mixed_save": mixed_save, "mixed_load": mixed_load,
     "partial": partial}[args.role](args)


def add_arguments(parser):
    parser.add_argument("--into")
    parser.add_argument("--source")


@unittest.skipIf(NO_FSDP2, NO_FSDP2)
class DTensorPieces(unittest.TestCase):
    """The boxes each rank's local tensor holds are the elements torch itself gives that rank."""

    def test_runs_match_torch_splitting(self):
        from torch.distributed.tensor.placement_types import _StridedShard
        cases = [(14, [("s", None)], [2]), (14, [("s", 2), ("s", None)], [2, 2]), (6, [("s", None), ("s", None)], [2, 2]),
                 (7, [("s", 3), ("s", None)], [2, 3]), (1, [("s", None)], [3]), (0, [("s", None)], [2]),
                 (10, [("r",), ("s", None)], [2, 4]), (9, [("s", 2), ("r",), ("s", None)], [2, 2, 2])]
        for n, kinds, mesh in cases:
            placements = [Replicate() if k[0] == "r" else Shard(0) if k[1] is None else
                          _StridedShard(0, split_factor=k[1]) for k in kinds]
            mine = [("replicate",) if k[0] == "r" else ("shard", 0, k[1]) for k in kinds]
            for coordinate in _coordinates(mesh):
                held = torch.arange(n)
                for p, m, c in zip(placements, mesh, coordinate):
                    if not isinstance(p, Replicate):
                        held = p._split_tensor(held, m, with_padding=False)[0][c]
                runs = _dtensor.dim_runs(n, mesh, coordinate, mine, 0)
                expected = [i for b, e in runs for i in range(b, e)]
                self.assertEqual(expected, held.tolist(), f"n={n} {placements} mesh {mesh} at {coordinate}")


def _coordinates(shape):
    if not shape:
        yield ()
        return
    for c in range(shape[0]):
        for rest in _coordinates(shape[1:]):
            yield (c,) + rest


@unittest.skipIf(NO_FSDP2, NO_FSDP2)
class DTensorCheckpoints(gloo_ranks.TrainedRanks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.train_once(__file__, "lifeline-dtensor-")

    def test_fsdp2_tp_job_saved_with_strided_and_uneven_shards_and_replicas_once(self):
        self.assertTrue(all(r is not None for r in self.trained), self.output)
        placements = self.trained[0]["placements"]
        self.assertIn("_S(0, 2)", "".join(placements["up.weight"]))  # FSDP2 over TP's row shards
        self.assertIn("R", "".join(placements["down.bias"]))  # replicated across the TP ranks
        # Every element of every tensor is stored once: each tensor's stored bytes are its size.
        # Parameters, Adam's two moments and the buffer are f32; Adam's step a f32 scalar per
        # parameter, the same on every rank.
        sizes = {"up.weight": HIDDEN * IN, "up.bias": HIDDEN, "down.weight": OUT * HIDDEN, "down.bias": OUT}
        expected = {f"model.{n}": 4 * k for n, k in sizes.items()}
        expected["model.calls"] = 8
        for n, k in sizes.items():
            expected.update({f"optim.state.{n}.exp_avg": 4 * k, f"optim.state.{n}.exp_avg_sq": 4 * k,
                             f"optim.state.{n}.step": 4})
        self.assertEqual(stored(os.path.join(self.dir, "torch")), expected)

    def test_loads_into_fsdp2_plain_and_ddp_equal_to_the_full_state_dict(self):
        self.assertTrue(all(r is not None for r in self.trained), self.output)
        for source in ("torch", "sd"):
            for into, world in (("fsdp2", 2), ("plain", 1), ("ddp", 3)):
                with self.subTest(source=source, into=into):
                    for r in self.ranks(world, "--role", "load", "--into", into, "--source", source):
                        self.assertEqual(r["step"], STEPS)
                        self.assertEqual(r["differences"], [])

    def test_mixed_placements_on_2x2_load_into_a_1d_mesh_of_3(self):
        self.ranks(4, "--role", "mixed_save")
        self.assertEqual(stored(os.path.join(self.dir, "mixed")),  # replicas once
                         {name: 8 * _numel(shape) for name, shape, _a, _b in MIXED})
        for r in self.ranks(3, "--role", "mixed_load"):
            self.assertEqual(r["step"], 1)
            self.assertEqual(r["wrong"], [])

    def test_partial_is_refused_naming_the_tensor(self):
        [r] = self.ranks(1, "--role", "partial")
        self.assertIsNotNone(r["error"])
        self.assertIn("'w'", r["error"])
        self.assertIn("Partial", r["error"])


def stored(directory):
    """Tensor name -> the bytes the newest checkpoint in `directory` stores of it (`lifeline inspect`)."""
    out = subprocess.run([os.path.join(BIN, "lifeline"), "inspect", "--json", directory],
                         capture_output=True, text=True, check=True).stdout
    return {t["name"]: t["bytes"] for t in json.loads(out)["checkpoint"]["tensors"]}


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    gloo_ranks.main(worker, add_arguments)

"""DTensors on a slice of the job (issue 50, item 2): every layout DCP saves, saved natively.

Four gloo ranks train, with Adam, a model of two residual blocks (up, down) and a head in three
layouts whose DTensors do not all span the job:
  tp      a (dp=2, tp=2) mesh: the blocks' up/down tensor parallel (ColwiseParallel,
          RowwiseParallel), the head not; fully_shard(model, mesh=mesh["dp"]). The head's DTensors
          live on the dp slice: copies across tp.
  pp      pipeline stages as torchtitan lays them on a (pp=2, dp=2) mesh: each stage keeps the
          model's names, drops the other stage's layers and fully_shards its own on its dp slice.
          Stage 0's DTensors and Adam's step scalars are on ranks 0 and 1 only: other tensors than
          stage 1's, not copies.
  hsdp_tp HSDP on a slice: a (dp_replicate=2, dp_shard=1, tp=2) mesh, tensor parallel blocks,
          fully_shard(model, mesh=mesh["dp_replicate", "dp_shard"]): the head is Replicate x Shard
          on a slice, so 2 copies inside its mesh times 2 meshes.
Each is saved through Checkpointer.save(step, lifeline.torch.state_dict(model, opt)), every element
stored once (`lifeline inspect --json`: each tensor's stored bytes are its size), and loads into
2 FSDP2 ranks and into one plain process equal elementwise to get_state_dict(...,
full_state_dict=True) at save time, and through dcp.load with lifeline.dcp.StorageReader. The same
4-rank job also loads the pp checkpoint into pipeline stages again, the tp one into pipeline
stages and the pp one into the tp layout; and pp's dcp.async_save through lifeline.dcp (its stager
takes the pieces itself) loads through dcp.load. Each stage trains its own layers on batches of
its own (no pipeline schedule: the layout of the state is what is tested).

Needs torch >= 2.6 (DTensor and FSDP2 public): skipped, saying so, under older torch.
"""
import glob
import json
import os
import subprocess
import unittest

import torch

import gloo_ranks
import lifeline
import lifeline.torch
from lifeline import _dtensor, _state

# get_state_dict(full_state_dict=True) as plain tensors, the optimizer and the ranks' gloo group
from test_dtensor import differences, full_state, init, make_optimizer
from torch_versions import NO_FSDP2

if not NO_FSDP2:
    import torch.distributed.checkpoint as dcp
    import lifeline.dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

STEPS = 3
BIN = os.environ.get("LIFELINE_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin"))
IN, HIDDEN, OUT = 10, 14, 6  # 14 over 2: 7 each; the head's 6 rows over 2 dp ranks: 3 each
LAYOUTS = ("tp", "pp", "hsdp_tp")
STAGES = ({"0"}, {"1"})  # the layers of pipeline stage 0 and 1; stage 1 also has the head
WATCHED = ("model.head.weight", "optim.state.head.weight.step", "model.layers.0.scale", "model.layers.0.up.weight")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(IN, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, IN)
        self.register_buffer("scale", torch.full((2,), 0.5))

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x))) * self.scale[0]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleDict({"0": Block(), "1": Block()})
        self.head = torch.nn.Linear(IN, OUT)

    def forward(self, x):
        for layer in self.layers.values():
            x = layer(x)
        return self.head(x) if self.head is not None else x


def make_model():
    torch.manual_seed(1234)
    return Net()


def laid_out(layout):
    """A fresh model in `layout` on the 4 ranks, and this rank's data-parallel coordinate."""
    import torch.distributed as dist
    model = make_model()
    if layout == "pp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
        stage = mesh["pp"].get_local_rank()
        for name in list(model.layers):  # torchtitan's pipeline_llm: drop what the stage does not run
            if name not in STAGES[stage]:
                del model.layers[name]
        if stage == 0:
            model.head = None
        for block in model.layers.values():
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        return model, mesh["dp"].get_local_rank()
    if layout == "tp":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        dp = mesh["dp"]
    else:
        mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
        dp = mesh["dp_replicate", "dp_shard"]
    for name in model.layers:
        parallelize_module(model.layers[name], mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=dp)
    assert dist.get_world_size() == 4
    return model, mesh["dp" if layout == "tp" else "dp_replicate"].get_local_rank()


def wanted(directory, layout):
    """The full state at save time: the union of what every saving rank's get_state_dict gave."""
    want = {}
    for path in sorted(glob.glob(os.path.join(directory, f"want-{layout}-*.pt"))):
        want.update(torch.load(path))
    return want


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, IN, generator=g)


def train_and_save(args):
    """4 ranks: each layout trained and saved; then loads across layouts on the same ranks."""
    init(args, 4)
    replicas = {}
    for layout in LAYOUTS:
        model, dp_rank = laid_out(layout)
        optimizer = make_optimizer(model)
        for step in range(1, STEPS + 1):
            model(batch(step, dp_rank)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        state = lifeline.torch.state_dict(model, optimizer)
        with lifeline.Checkpointer(os.path.join(args.dir, layout), rank=args.rank, world_size=4) as ckpt:
            ckpt.save(STEPS, state).wait()
        # How the pieces of a few tensors were marked (the same structure: no collective again).
        replicas[layout] = {path: (tuple(leaf.device_mesh.shape) if _dtensor.is_dtensor(leaf) else None,
                                   sorted({p.replica for p in parts}))
                            for path, leaf, parts in _state.leaves(state, args.rank, 4) if path in WATCHED}
        if layout == "pp":  # DCP's async_save through Lifeline's stager
            msd, osd = get_state_dict(model, optimizer)
            writer = lifeline.dcp.StorageWriter(os.path.join(args.dir, "pp-dcp"), step=STEPS)
            dcp.async_save({"model": msd, "optim": osd}, storage_writer=writer).upload_completion.result()
            writer.close()
        torch.save(full_state(model, optimizer), os.path.join(args.dir, f"want-{layout}-{args.rank}.pt"))
    import torch.distributed as dist
    dist.barrier()
    across = {}
    for source, into in (("pp", "pp"), ("tp", "pp"), ("pp", "tp")):
        model, _dp = laid_out(into)
        optimizer = make_optimizer(model)
        with lifeline.Checkpointer(os.path.join(args.dir, source), rank=args.rank, world_size=4) as ckpt:
            step = lifeline.torch.load(ckpt, model, optimizer)
        got = full_state(model, optimizer)
        # What this rank holds in layout `into` (its stage's names in pp), valued as `source` saved it.
        source_state = wanted(args.dir, source)
        want = {k: source_state[k] for k in torch.load(os.path.join(args.dir, f"want-{into}-{args.rank}.pt"))}
        across[f"{source}->{into}"] = {"step": step, "differences": differences(got, want), "keys": len(got)}
    gloo_ranks.finish({"across": across, "replicas": replicas})


def load_into(args):
    """Loads every layout's checkpoint into 2 FSDP2 ranks (fsdp2) or one plain process (plain,
    also through dcp.load) and compares with the full state at save time."""
    world = {"fsdp2": 2, "plain": 1}[args.into]
    init(args, world)
    out = {}
    for layout in LAYOUTS:
        model = make_model()
        with torch.no_grad():  # not the saved values
            for p in model.parameters():
                p.fill_(7.0)
        if args.into == "fsdp2":
            mesh = init_device_mesh("cpu", (2,))
            for block in model.layers.values():
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        optimizer = make_optimizer(model)
        with lifeline.Checkpointer(os.path.join(args.dir, layout), rank=args.rank, world_size=world) as ckpt:
            step = lifeline.torch.load(ckpt, model, optimizer)
        want = wanted(args.dir, layout)
        out[layout] = {"step": step, "differences": differences(full_state(model, optimizer), want)}
        if args.into == "plain":
            for source in (layout, "pp-dcp") if layout == "pp" else (layout,):
                out[f"dcp.load {source}"] = dcp_load(os.path.join(args.dir, source), want)
    gloo_ranks.finish(out)


def dcp_load(directory, want):
    """dcp.load through lifeline.dcp.StorageReader into a plain state dict shaped as `want`."""
    state = {"model": {}, "optim": {"state": {}}}
    for k, v in want.items():
        if not isinstance(v, torch.Tensor):
            continue
        part, name = k.split(".", 1)
        if part == "model":
            state["model"][name] = torch.full_like(v, -3.0)
        else:
            param, key = name.rsplit(".", 1)
            state["optim"]["state"].setdefault(param, {})[key] = torch.full_like(v, -3.0)
    dcp.load(state, storage_reader=lifeline.dcp.StorageReader(directory))
    got = {f"model.{k}": v for k, v in state["model"].items()}
    for param, s in state["optim"]["state"].items():
        got.update({f"optim.{param}.{k}": v for k, v in s.items()})
    return differences(got, {k: v for k, v in want.items() if isinstance(v, torch.Tensor)})


def worker(args):
    {"train": train_and_save, "load": load_into}[args.role](args)


def add_arguments(parser):
    parser.add_argument("--into")


@unittest.skipIf(NO_FSDP2, NO_FSDP2)
class SubmeshCheckpoints(gloo_ranks.TrainedRanks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.train_once(__file__, "lifeline-submesh-")

    def saved(self):
        self.assertTrue(all(r is not None for r in self.trained), self.output)

    def test_every_element_stored_once(self):
        self.saved()
        for layout in LAYOUTS + ("pp-dcp",):
            with self.subTest(layout=layout):
                want = wanted(self.dir, "pp" if layout == "pp-dcp" else layout)
                expected = {(k if k.startswith("model.") else "optim.state." + k[6:]): v.numel() * v.element_size()
                            for k, v in want.items() if isinstance(v, torch.Tensor)}
                self.assertEqual(stored(os.path.join(self.dir, layout)), expected)
        # The pipeline's stages hold other layers: stage 0 has no head, stage 1 no layer 0.
        self.assertFalse(any(k.startswith("model.head") for k in torch.load(os.path.join(self.dir, "want-pp-0.pt"))))
        self.assertFalse(any(".layers.0." in k for k in torch.load(os.path.join(self.dir, "want-pp-2.pt"))))

    def test_copies_counted_among_the_ranks_holding_each_tensor(self):
        self.saved()
        # (mesh shape or None for a plain tensor, the replicas (index, count) of its pieces) by rank.
        seen = {layout: [r["replicas"][layout] for r in self.trained] for layout in LAYOUTS}
        for r in range(4):
            # tp: the head on the dp slice (2 ranks), copied across the 2 tp slices; a buffer and
            # Adam's step on all 4 ranks; TP'd weights on the whole (dp, tp) mesh, no copies.
            self.assertEqual(seen["tp"][r]["model.head.weight"], [[2], [[r % 2, 2]]])
            self.assertEqual(seen["tp"][r]["optim.state.head.weight.step"], [None, [[r, 4]]])
            self.assertEqual(seen["tp"][r]["model.layers.0.scale"], [None, [[r, 4]]])
            self.assertEqual(seen["tp"][r]["model.layers.0.up.weight"], [[2, 2], [[0, 1]]])
            # hsdp_tp: the head Replicate x Shard on a (2, 1) slice: 2 copies in it, 2 slices.
            self.assertEqual(seen["hsdp_tp"][r]["model.head.weight"], [[2, 1], [[2 * (r % 2) + r // 2, 4]]])
        # pp: each stage's tensors on its 2 ranks only, not copies of the other stage's.
        for r in (0, 1):
            self.assertNotIn("model.head.weight", seen["pp"][r])
            self.assertEqual(seen["pp"][r]["model.layers.0.up.weight"], [[2], [[0, 1]]])
            self.assertEqual(seen["pp"][r]["model.layers.0.scale"], [None, [[r, 2]]])
        for r in (2, 3):
            self.assertEqual(seen["pp"][r]["model.head.weight"], [[2], [[0, 1]]])
            self.assertEqual(seen["pp"][r]["optim.state.head.weight.step"], [None, [[r - 2, 2]]])
            self.assertNotIn("model.layers.0.up.weight", seen["pp"][r])

    def test_loads_into_pipeline_stages_and_across_layouts_on_the_saving_ranks(self):
        self.saved()
        for r, result in enumerate(self.trained):
            for what, got in result["across"].items():
                with self.subTest(rank=r, what=what):
                    self.assertEqual(got["step"], STEPS)
                    self.assertEqual(got["differences"], [])
                    self.assertGreater(got["keys"], 5)

    def test_loads_into_fsdp2_and_one_process_and_through_dcp_load(self):
        self.saved()
        for into, world in (("fsdp2", 2), ("plain", 1)):
            for r, result in enumerate(self.ranks(world, "--role", "load", "--into", into)):
                for what, got in result.items():
                    with self.subTest(into=into, rank=r, what=what):
                        if what.startswith("dcp.load"):
                            self.assertEqual(got, [])
                        else:
                            self.assertEqual(got["step"], STEPS)
                            self.assertEqual(got["differences"], [])


def stored(directory):
    """Tensor name -> the bytes the newest checkpoint in `directory` stores of it (`lifeline inspect`)."""
    out = subprocess.run([os.path.join(BIN, "lifeline"), "inspect", "--json", directory],
                         capture_output=True, text=True, check=True).stdout
    return {t["name"]: t["bytes"] for t in json.loads(out)["checkpoint"]["tensors"]}


if __name__ == "__main__":
    gloo_ranks.main(worker, add_arguments)

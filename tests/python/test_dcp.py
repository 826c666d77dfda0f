"""Lifeline as DCP's storage backend (lifeline.dcp, issue 33): torch.distributed.checkpoint's own
dcp.save, dcp.async_save and dcp.load write and read Lifeline checkpoints.

Four gloo ranks train an MLP sharded with tensor parallelism and FSDP2 on a 2x2 mesh (the model of
test_dtensor.py: uneven and empty chunks, FSDP2's strided shards of TP's shards) and save
get_state_dict's model and optimizer state, a nested dict of plain values and a bytes item through
dcp.save (step 0), then after one more step through dcp.async_save, which returns before the state
is copied (step 1). Each step loads into 2 FSDP2 ranks of another placement, both through dcp.load
with lifeline.dcp.StorageReader and through lifeline.Checkpointer.load, equal elementwise to the
saving job's get_state_dict(full_state_dict=True); `lifeline verify` passes on the directory. A
checkpoint saved by lifeline.Checkpointer loads through dcp.load; DTensors of mixed placements
saved with dcp.save on the 2x2 mesh load through dcp.load into a 1-D mesh of 3 exactly. Needs
torch >= 2.6 (DTensor, FSDP2 and DCP's current interfaces): skipped, saying so, under older torch.
"""
import io
import os
import shutil
import subprocess
import tempfile
import threading
import unittest

import torch

import gloo_ranks
import lifeline

from torch_versions import NO_FSDP2

if not NO_FSDP2:
    import torch.distributed.checkpoint as dcp
    import lifeline.dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from test_dtensor import (MIXED, STEPS, batch, differences, full_state, global_value, init, make_model,
                              make_optimizer, placements_of)

BIN = os.environ.get("LIFELINE_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin"))
EXTRA = {"epoch": 3, "schedule": {"warmup": 10, "names": ["a", "b"]}}


def state_of(model, optimizer, blob=b"a bytes item"):
    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd, "extra": {"epoch": EXTRA["epoch"], "schedule": dict(EXTRA["schedule"])},
            "blob": io.BytesIO(blob)}


def train_step(model, optimizer, step, dp_rank):
    model(batch(step, dp_rank)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def save(args):
    """4 ranks, mesh (dp=2, tp=2): dcp.save at STEPS, dcp.async_save one step later, and the same
    state through lifeline.Checkpointer; the full states as the loads must find them."""
    init(args, 4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = make_model()
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = make_optimizer(model)
    dp = mesh["dp"].get_local_rank()
    for step in range(1, STEPS + 1):
        train_step(model, optimizer, step, dp)
    writer = lifeline.dcp.StorageWriter(os.path.join(args.dir, "dcp"))
    dcp.save(state_of(model, optimizer), storage_writer=writer)
    want = [full_state(model, optimizer)]
    with lifeline.Checkpointer(os.path.join(args.dir, "native"), rank=args.rank, world_size=4) as ckpt:
        native = state_of(model, optimizer)
        native["blob"] = native["blob"].getvalue()  # lifeline.Checkpointer keeps plain data: bytes, not a BytesIO
        ckpt.save(7, native).wait()

    train_step(model, optimizer, STEPS + 1, dp)
    want.append(full_state(model, optimizer))
    response = dcp.async_save(state_of(model, optimizer, b"the second"), storage_writer=writer)
    returned_as = type(response).__name__
    response.staging_completion.result()
    # The state may change once the snapshot is taken: the checkpoint holds it as it was.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1000.0)
    response.upload_completion.result()
    writer.close()

    mixed = {name: distribute_tensor(global_value(i, shape), mesh, placements_of(p2))
             for i, (name, shape, p2, _p1) in enumerate(MIXED)}
    dcp.save(mixed, storage_writer=lifeline.dcp.StorageWriter(os.path.join(args.dir, "mixed")))
    if args.rank == 0:
        torch.save(want, os.path.join(args.dir, "want.pt"))
    gloo_ranks.finish({"async_save_returned": returned_as})


def fresh_fsdp2():
    """The model on 2 FSDP2 ranks (another placement than the saving job's), holding other values."""
    model = make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(7.0)
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    return model, make_optimizer(model)


def load(args):
    """2 FSDP2 ranks: each step through dcp.load and through lifeline.Checkpointer.load, and the
    Checkpointer's own save through dcp.load."""
    init(args, 2)
    want = torch.load(os.path.join(args.dir, "want.pt"))
    out = {}
    for name, directory, step, expected, blob in (("dcp.load step 0", "dcp", 0, 0, b"a bytes item"),
                                                  ("dcp.load step 1", "dcp", 1, 1, b"the second"),
                                                  ("dcp.load native", "native", None, 0, b"a bytes item")):
        model, optimizer = fresh_fsdp2()
        state = state_of(model, optimizer, b"")
        state["extra"] = {"epoch": 0, "schedule": {"warmup": 0, "names": None}}
        if directory == "native":
            state["blob"] = b""
        reader = lifeline.dcp.StorageReader(os.path.join(args.dir, directory), step=step)
        dcp.load(state, storage_reader=reader)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        got = state["blob"] if isinstance(state["blob"], bytes) else state["blob"].getvalue()
        out[name] = {"differences": differences(full_state(model, optimizer), want[expected]),
                     "extra": state["extra"], "blob": got.decode()}
    for step in (0, 1):
        model, optimizer = fresh_fsdp2()
        state = state_of(model, optimizer, b"")
        state["extra"] = {"epoch": 0, "schedule": {"warmup": 0, "names": None}}
        with lifeline.Checkpointer(os.path.join(args.dir, "dcp"), rank=args.rank, world_size=2) as ckpt:
            loaded = ckpt.load(state, step=step)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        out[f"Checkpointer.load step {step}"] = {
            "step": loaded, "differences": differences(full_state(model, optimizer), want[step]),
            "extra": state["extra"], "blob": state["blob"].getvalue().decode()}
    gloo_ranks.finish(out)


def mixed_load(args):
    init(args, 3)
    mesh = init_device_mesh("cpu", (3,))
    state = {name: distribute_tensor(torch.full(shape, -1.0, dtype=torch.float64), mesh, placements_of(p1))
             for name, shape, _p2, p1 in MIXED}
    dcp.load(state, storage_reader=lifeline.dcp.StorageReader(os.path.join(args.dir, "mixed")))
    wrong = [name for i, (name, shape, _p2, _p1) in enumerate(MIXED)
             if not torch.equal(state[name].full_tensor(), global_value(i, shape))]
    gloo_ranks.finish({"wrong": wrong})


def process_mode(args):
    """DCP's process mode cannot take Lifeline's snapshot: refused before anything is saved."""
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    init(args, 1)
    writer = lifeline.dcp.StorageWriter(os.path.join(args.dir, "process"))
    try:
        dcp.async_save({"w": torch.ones(3)}, storage_writer=writer, async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        error = None
    except ValueError as e:
        error = str(e)
    gloo_ranks.finish({"error": error, "steps": [c["step"] for c in writer.checkpointer.list()]})


def steps_of(directory, steps, n):
    """{step: its "w" (n floats) as dcp.load reads it}."""
    out = {}
    for step in steps:
        got = {"w": torch.zeros(n)}
        dcp.load(got, storage_reader=lifeline.dcp.StorageReader(directory, step=step))
        out[step] = got["w"].tolist()
    return out


def copy_staging_and_steps(args):
    """staging="copy": async_save returns DCP's plain Future once the state is copied. Steps: named
    by step= or writer.step, else the next after the newest; an existing step is refused and the
    checkpoint that holds it is left as it was. A dcp.save during an async_save of one writer."""
    init(args, 1)
    directory = os.path.join(args.dir, "steps")
    writer = lifeline.dcp.StorageWriter(directory, step=10, staging="copy")
    # The order that once let async_save return before the copy was done: DCP's upload thread takes
    # the save (set_up_storage_writer) before async_save synchronizes, while a 64 MiB copy runs.
    taken = threading.Event()
    set_up, synchronize = writer.set_up_storage_writer, writer.synchronize_staging
    writer.set_up_storage_writer = lambda *a, **k: (set_up(*a, **k), taken.set())[0]
    writer.synchronize_staging = lambda: (taken.wait(60), synchronize())[1]
    big = torch.arange(float(1 << 26))
    w = torch.arange(6.0)
    future = dcp.async_save({"w": w, "big": big}, storage_writer=writer)
    returned_as = type(future).__name__
    w.add_(100.0)  # after async_save returned: not in step 10
    big.add_(100.0)
    future.result()
    writer.set_up_storage_writer, writer.synchronize_staging = set_up, synchronize
    got = {"big": torch.zeros(1 << 26)}
    dcp.load(got, storage_reader=lifeline.dcp.StorageReader(directory, step=10))
    big_changed = int((got["big"] != torch.arange(float(1 << 26))).sum())
    del big, got
    dcp.save({"w": w}, storage_writer=writer)  # step 11
    writer.step = 10
    try:
        dcp.save({"w": torch.zeros(6)}, storage_writer=writer)
        refused = None
    except BaseException as e:  # noqa: B902 - DCP's CheckpointException is a BaseException
        refused = str(e)
    writer.close()
    loaded = steps_of(directory, (10, 11), 6)
    # A dcp.save while an async_save of the same writer is being uploaded saves its own state.
    both = os.path.join(args.dir, "both")
    writer = lifeline.dcp.StorageWriter(both)
    response = dcp.async_save({"w": torch.full((4,), 1.0)}, storage_writer=writer)
    response.staging_completion.result()
    dcp.save({"w": torch.full((4,), 2.0)}, storage_writer=writer)
    response.upload_completion.result()
    writer.close()
    interleaved = steps_of(both, (0, 1), 4)
    gloo_ranks.finish({"returned_as": returned_as, "refused": refused, "loaded": loaded, "interleaved": interleaved,
                       "big_changed": big_changed, "steps": [c["step"] for c in lifeline.Checkpointer(directory, run_id="t").list()]})


def whole_without_a_state_dict(args):
    """2 ranks save a DTensor sharded on a 1-D mesh, a nested dict with a list of tensors and a
    bytes item through dcp.save (step 0) and dcp.async_save (step 1); then rank 0, alone, loads each
    step as DCP's dcp_to_torch_save does, with no state dict to fill (_EmptyStateDictLoadPlanner):
    the nested structure comes back from the checkpoint (DCP's planner_data), whole tensors included.
    (A check of PyTorch's test_format_utils.py, made ours.)"""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    init(args, 2)
    rank = args.rank
    mesh = init_device_mesh("cpu", (2,))
    directory = os.path.join(args.dir, "whole")

    def state(k):
        w = torch.arange(15.0).reshape(5, 3) + k
        return {"model": {"w": distribute_tensor(w, mesh, placements_of("S0")), "b": torch.full((3,), 7.0 + k)},
                "optim": {"lr": 0.5 + k, "moments": [torch.ones(2) * k, torch.zeros(4)]},
                "blob": io.BytesIO(b"item %d" % k)}
    writer = lifeline.dcp.StorageWriter(directory)
    dcp.save(state(0), storage_writer=writer)
    response = dcp.async_save(state(1), storage_writer=writer)
    response.upload_completion.result()
    writer.close()
    torch.distributed.barrier()
    got = {}
    if rank == 0:
        for step in (0, 1):
            loaded = {}
            _load_state_dict(loaded, storage_reader=lifeline.dcp.StorageReader(directory, step=step),
                             planner=_EmptyStateDictLoadPlanner(), no_dist=True)
            blob = loaded.get("blob")
            got[step] = {"keys": sorted(loaded), "model": sorted(loaded.get("model", {})),
                         "w": loaded["model"]["w"].tolist(), "b": loaded["model"]["b"].tolist(),
                         "lr": loaded["optim"]["lr"], "moments": [t.tolist() for t in loaded["optim"]["moments"]],
                         "blob": blob.getvalue().decode() if isinstance(blob, io.BytesIO) else repr(blob)}
    gloo_ranks.finish(got)


def worker(args):
    {"save": save, "load": load, "mixed_load": mixed_load, "process_mode": process_mode,
     "copy_staging_and_steps": copy_staging_and_steps,
     "whole_without_a_state_dict": whole_without_a_state_dict}[args.role](args)


@unittest.skipIf(NO_FSDP2, NO_FSDP2)
class DcpWriterOptions(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lifeline-dcp-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def one_rank(self, role):
        return gloo_ranks.run_ranks_ok(self, __file__, 1, lambda r: ["--role", role, "--dir", self.tmp])[0][0]

    def test_process_mode_is_refused_before_anything_is_saved(self):
        result = self.one_rank("process_mode")
        self.assertIn("thread mode only", result["error"] or "")
        self.assertEqual(result["steps"], [])

    def test_copy_staging_and_named_steps(self):
        result = self.one_rank("copy_staging_and_steps")
        self.assertEqual(result["returned_as"], "Future")
        self.assertEqual(result["big_changed"], 0, "elements of step 10 changed after async_save returned")
        self.assertEqual(result["loaded"], {"10": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
                                            "11": [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]})
        self.assertIn("step 10", result["refused"] or "")
        self.assertEqual(result["steps"], [11, 10])
        self.assertEqual(result["interleaved"], {"0": [1.0] * 4, "1": [2.0] * 4})

    def test_a_load_with_no_state_dict_gets_the_nested_state_back(self):
        results = gloo_ranks.run_ranks_ok(self, __file__, 2,
                                          lambda r: ["--role", "whole_without_a_state_dict", "--dir", self.tmp])
        got = results[0][0]
        for k in (0, 1):
            self.assertEqual(got[str(k)], {
                "keys": ["blob", "model", "optim"], "model": ["b", "w"],
                "w": (torch.arange(15.0).reshape(5, 3) + k).tolist(), "b": [7.0 + k] * 3,
                "lr": 0.5 + k, "moments": [[float(k)] * 2, [0.0] * 4], "blob": f"item {k}"}, f"step {k}")


@unittest.skipIf(NO_FSDP2, NO_FSDP2)
class DcpBackend(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lifeline-dcp-", dir=os.environ.get("LIFELINE_TEST_TMPDIR", "/var/tmp"))
        cls.saved, cls.output = gloo_ranks.run_ranks(__file__, 4, lambda r: ["--role", "save", "--dir", cls.tmp])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ranks(self, world, role):
        return gloo_ranks.run_ranks_ok(self, __file__, world, lambda r: ["--role", role, "--dir", self.tmp])

    def test_async_save_returns_before_the_copy_and_every_step_is_a_lifeline_checkpoint(self):
        for r, result in enumerate(self.saved):
            self.assertIsNotNone(result, f"rank {r} failed:\n{self.output}")
            self.assertEqual(result["async_save_returned"], "AsyncSaveResponse")
        listed = lifeline.Checkpointer(os.path.join(self.tmp, "dcp"), rank=0, world_size=4, run_id="t").list()
        self.assertEqual([(c["step"], c["complete"], c["world_size"]) for c in listed], [(1, True, 4), (0, True, 4)])
        for directory in ("dcp", "mixed"):
            p = subprocess.run([os.path.join(BIN, "lifeline"), "verify", os.path.join(self.tmp, directory)],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)

    def test_each_step_loads_into_another_placement_through_dcp_and_lifeline(self):
        self.assertTrue(all(self.saved), self.output)
        results, output = self.ranks(2, "load")
        for r, result in enumerate(results):
            for name, got in result.items():
                self.assertEqual(got["differences"], [], f"rank {r}, {name}:\n{output}")
                self.assertEqual(got["extra"], EXTRA, f"rank {r}, {name}")
            self.assertEqual(result["dcp.load step 1"]["blob"], "the second")
            self.assertEqual(result["dcp.load native"]["blob"], "a bytes item")
            self.assertEqual(result["Checkpointer.load step 1"]["step"], 1)
            self.assertEqual(result["Checkpointer.load step 0"]["blob"], "a bytes item")

    def test_mixed_placements_on_2x2_load_through_dcp_into_a_1d_mesh_of_3(self):
        self.assertTrue(all(self.saved), self.output)
        results, _ = self.ranks(3, "mixed_load")
        for result in results:
            self.assertEqual(result["wrong"], [])


if __name__ == "__main__":
    gloo_ranks.main(worker)

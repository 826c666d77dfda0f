"""An FSDP2 x tensor-parallel training job with Lifeline added, as a torch 2.x user writes it: 4 gloo
ranks on a 2x2 mesh (TP inside, FSDP2 over it), Adam, a checkpoint every --ckpt-every steps through
lifeline.torch.state_dict. Under lifeline-agent (tests/python/test_dtensor_job.py); --kill-at N
SIGKILLs rank 1 at step N of the first launch. At the end rank 0 prints a digest of the full
parameters and Adam state (get_state_dict with full_state_dict=True), to compare runs bit for bit.
"""
import argparse
import hashlib
import os
import signal

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import lifeline
import lifeline.torch

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--ckpt-every", type=int, default=2)
p.add_argument("--kill-at", type=int, default=0)
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(12, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.Adam(model.parameters(), lr=1e-2)

ckpt = lifeline.Checkpointer(args.dir, keep_last=2, memory_tier=True)
start = lifeline.torch.load(ckpt, model, opt) or 0
print(f"rank {rank} resumed from step {start}", flush=True)
lifeline.guard_optimizer(opt, ckpt)
for step in range(start + 1, args.steps + 1):
    if args.kill_at == step and rank == 1 and os.environ.get("LIFELINE_RESTART", "0") == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    g = torch.Generator().manual_seed(1000 * step + mesh["dp"].get_local_rank())
    x, y = torch.randn(6, 12, generator=g), torch.randn(6, 5, generator=g)
    loss = (model(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % args.ckpt_every == 0:
        ckpt.save(step, lifeline.torch.state_dict(model, opt))
ckpt.close()

msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
digest = hashlib.sha256()
for name in sorted(msd):
    digest.update(name.encode() + msd[name].detach().numpy().tobytes())
for name in sorted(osd["state"]):
    for key in sorted(osd["state"][name]):
        digest.update(f"{name}.{key}".encode() + osd["state"][name][key].numpy().tobytes())
if rank == 0:
    print(f"digest {digest.hexdigest()}", flush=True)
dist.destroy_process_group()

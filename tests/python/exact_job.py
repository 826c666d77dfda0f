"""A data-parallel job with Adam, as a user writes it with Lifeline (lifeline.Checkpointer,
lifeline.torch.state_dict / load), for tests/python/test_multinode_exact.py: run under
lifeline-agent on two nodes of 2 ranks, a run restarted from a checkpoint must end with the
parameters and Adam state of a run never interrupted, bit for bit.

    lifeline-agent run ... -- python3 exact_job.py --dir D --model ddp|fsdp2 [--fault kill@R:S|hold@R:S]

Every step's batch is drawn from a generator seeded by the step and the rank. `--model ddp`: a
DistributedDataParallel MLP; `--model fsdp2`: the same MLP, each layer and the model under
fully_shard. `--fault kill@R:S`: at step S of the first launch, once the checkpoint before S is
committed, rank R SIGKILLs itself; `hold@R:S`: rank R writes D.hold-S then and sleeps (for a test
that loses the whole node meanwhile). Rank 0 prints `digest STEP HEX` after every
step (the parameters), and every rank prints `final RANK HEX` at the end: a SHA-256 of its
parameters' and optimizer state's bytes (its shards under FSDP2).
"""
import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import lifeline
import lifeline.torch

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--model", choices=["ddp", "fsdp2"], default="ddp")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--ckpt-every", type=int, default=10)
p.add_argument("--fault", default="")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
layers = [torch.nn.Linear(24, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48), torch.nn.Tanh(),
          torch.nn.Linear(48, 48), torch.nn.Tanh(), torch.nn.Linear(48, 6)]
model = torch.nn.Sequential(*layers)
if args.model == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model)
else:
    from torch.distributed.fsdp import fully_shard
    for layer in layers:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)

ckpt = lifeline.Checkpointer(args.dir, keep_last=2, memory_tier=True)
start = lifeline.torch.load(ckpt, model, opt) or 0
print(f"rank {rank} loaded step {start}", flush=True)
lifeline.guard_optimizer(opt, ckpt)


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def digest(with_optimizer):
    h = hashlib.sha256()
    for name, t in model.named_parameters():
        h.update(name.encode())
        h.update(local(t).detach().contiguous().numpy().tobytes())
    if with_optimizer:
        for state in opt.state.values():
            for key in sorted(state):
                h.update(key.encode())
                h.update(local(state[key]).detach().contiguous().numpy().tobytes())
    return h.hexdigest()


kind, _, where = args.fault.partition("@")
fault_rank, fault_step = (int(v) for v in where.split(":")) if where else (-1, -1)
first_launch = os.environ.get("LIFELINE_RESTART", "0") == "0"
for step in range(start + 1, args.steps + 1):
    if first_launch and rank == fault_rank and step == fault_step:
        # Once the checkpoint before this step is committed: the job resumes from it.
        ckpt.wait_for_commit((step - 1) // args.ckpt_every * args.ckpt_every)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hold":
            open(f"{args.dir}.hold-{step}", "w").close()
            while True:
                time.sleep(1)
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 24, generator=g)
    y = torch.randn(16, 6, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"digest {step} {digest(False)}", flush=True)
    if step % args.ckpt_every == 0:
        ckpt.save(step, lifeline.torch.state_dict(model, opt))
ckpt.close()
print(f"final {rank} {digest(True)}", flush=True)
dist.destroy_process_group()
sys.exit(0)

"""The tutorial DDP job (gloo, resnet18, SGD) with Lifeline added: five lines.

    lifeline-agent run --nproc 2 --checkpoint-dir D -- python3 ddp_resnet.py --dir D --steps N

Every step's batch depends only on the step, so a run that was killed and resumed prints the same
losses as one that never stopped. `--kill-at K` SIGKILLs rank 1 at step K on the first launch (a
fault, as a user's job would meet one); `--kill-after-seconds S` at its first step that begins S
seconds after its first step ended, and a relaunch then runs 3 steps past the one it resumed from. Rank 0 prints `step K loss X` (X exact, as hex), and each
rank prints timestamps of its start-up phases (`phase NAME T`, T in seconds since the epoch) for
the restart-time breakdown (tools/bench-restart).
"""
import argparse
import os
import signal
import sys
import time

print(f"phase process_start {time.time():.6f}", flush=True)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import resnet  # noqa: E402  (resnet18 as torchvision defines it, without torchvision)

import lifeline  # noqa: E402
import lifeline.torch  # noqa: E402

print(f"phase imports_done {time.time():.6f}", flush=True)

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--ckpt-every", type=int, default=2)
p.add_argument("--kill-at", type=int, default=0)
p.add_argument("--kill-after-seconds", type=float, default=0)
p.add_argument("--batch", type=int, default=4)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"phase process_group_ready {time.time():.6f}", flush=True)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(resnet.resnet18(num_classes=10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
print(f"phase model_ready {time.time():.6f}", flush=True)
ckpt = lifeline.Checkpointer(args.dir, keep_last=2, memory_tier=True)
start = lifeline.torch.load(ckpt, model, opt) or 0
print(f"phase loaded {time.time():.6f} step {start}", flush=True)
lifeline.guard_optimizer(opt, ckpt)
loss_fn = torch.nn.CrossEntropyLoss()
first_launch = os.environ.get("LIFELINE_RESTART", "0") == "0"
last = args.steps if first_launch or not args.kill_after_seconds else min(args.steps, start + 3)
first_step_done = None
for step in range(start + 1, last + 1):
    if rank == 1 and first_launch and (args.kill_at == step or (
            args.kill_after_seconds and first_step_done and time.time() - first_step_done >= args.kill_after_seconds)):
        os.kill(os.getpid(), signal.SIGKILL)
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    with lifeline.trace.step(step):
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if step == start + 1:
        first_step_done = time.time()
        print(f"phase first_step_done {first_step_done:.6f}", flush=True)
    if rank == 0:
        print(f"step {step} loss {loss.item().hex()}", flush=True)
    if step % args.ckpt_every == 0:
        ckpt.save(step, lifeline.torch.state_dict(model, opt))
ckpt.close()
dist.destroy_process_group()
sys.exit(0)

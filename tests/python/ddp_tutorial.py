"""A tutorial-style DDP training script, as a user writes it: gloo, a resnet18, SGD.
It knows nothing of Lifeline (test_autotrace.py runs it under lifeline-agent unchanged).

Environment: STEPS (default 8), BATCH (default 4), HANG_AT (rank 1 sleeps HANG_SECONDS, default 30,
before step HANG_AT: the "bug"), SEED (default 0), PRINT_CHECKSUM=1 (rank 0 prints a digest of
the trained parameters, to compare runs), COMM_HOOK=allreduce (register torch's allreduce_hook
as a user would).
"""

import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import resnet  # resnet18 as torchvision defines it (torchvision may not import beside torch)


def main():
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    steps = int(os.environ.get("STEPS", "8"))
    batch = int(os.environ.get("BATCH", "4"))
    hang_at = int(os.environ.get("HANG_AT", "-1"))
    hang_seconds = float(os.environ.get("HANG_SECONDS", "30"))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    torch.manual_seed(int(os.environ.get("SEED", "0")))
    model = resnet.resnet18(num_classes=10)
    ddp_model = DDP(model)
    if os.environ.get("COMM_HOOK") == "allreduce":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp_model.register_comm_hook(None, default_hooks.allreduce_hook)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)

    generator = torch.Generator().manual_seed(1000 + rank)
    for step in range(steps):
        if rank == 1 and step == hang_at:
            time.sleep(hang_seconds)  # the bug
        inputs = torch.randn(batch, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 10, (batch,), generator=generator)
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs), labels)
        loss.backward()
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f} time {time.time():.6f}", flush=True)

    if rank == 0 and os.environ.get("PRINT_CHECKSUM") == "1":
        digest = hashlib.sha256()
        for p in model.parameters():
            digest.update(p.detach().numpy().tobytes())
        print(f"checksum {digest.hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

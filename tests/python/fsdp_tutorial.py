"""A tutorial-style FSDP2 training script, as a torch 2.x user writes it: gloo, fully_shard on each
block and on the model, AdamW. It knows nothing of Lifeline (test_autotrace.py runs it under
lifeline-agent unchanged).

Environment: STEPS (default 8), BATCH (default 16), HANG_AT (rank 1 sleeps HANG_SECONDS, default 30, before step
HANG_AT: the "bug").
"""

import os
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main():
    rank = int(os.environ["RANK"])
    steps = int(os.environ.get("STEPS", "8"))
    batch = int(os.environ.get("BATCH", "16"))
    hang_at = int(os.environ.get("HANG_AT", "-1"))
    hang_seconds = float(os.environ.get("HANG_SECONDS", "30"))
    dist.init_process_group("gloo")

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4)],
                                torch.nn.Linear(64, 10))
    for block in model[:4]:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    generator = torch.Generator().manual_seed(1000 + rank)
    for step in range(steps):
        if rank == 1 and step == hang_at:
            time.sleep(hang_seconds)  # the bug
        inputs = torch.randn(batch, 64, generator=generator)
        labels = torch.randint(0, 10, (batch,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"rank {rank} step {step} loss {loss.item():.4f} time {time.time():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

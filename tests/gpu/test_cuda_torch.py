"""torch CUDA tensors through the lifeline Python package (ctest label `gpu`).

Exits 77 (skipped) when torch has no CUDA device or Lifeline was built without its CUDA copy engine.
Checks: a model and Adam state on the GPU round-trip; with guard_optimizer the optimizer's kernels
are ordered after the snapshot's copies on the GPU (no wait on the CPU) and never leak into it.
"""
import os
import sys
import tempfile
import shutil

import torch

import lifeline
from lifeline import _lifeline

if not torch.cuda.is_available():
    print("SKIP: torch sees no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)
if not _lifeline.cuda_built():
    print("SKIP: liblifeline was built without its CUDA copy engine")
    sys.exit(77)


def main():
    tmp = tempfile.mkdtemp(prefix="lifeline-cuda-", dir="/var/tmp")
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        ckpt = lifeline.Checkpointer(tmp, rank=0, world_size=1)
        lifeline.guard_optimizer(opt, ckpt)
        saved = {}
        for step in range(1, 6):
            x = torch.randn(64, 512, device="cuda")
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()  # guarded: the stream waits on the GPU for the previous save's copies
            if step % 2 == 0:
                state = {"model": model.state_dict(), "optim": opt.state_dict()}
                ckpt.save(step, state)
                # What the checkpoint must hold: the values at save() (copied after the fact on the
                # same stream, so ordered before the next optimizer step).
                saved[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        ckpt.flush()
        for step, expected in saved.items():
            fresh = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).cuda()
            got = ckpt.load({"model": fresh.state_dict()}, step=step)
            assert got == step, got
            for k, v in fresh.state_dict().items():
                assert torch.equal(v, expected[k]), f"step {step}: {k} differs from its value at save()"
        ckpt.close()
        print("OK: CUDA tensors saved lazily, fenced, and loaded back equal")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

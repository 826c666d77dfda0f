"""A 2-rank job checkpointing into an s3:// directory, for tests/python/test_s3.py.

    s3_agent_job.py --dir s3://bucket/prefix --steps N --every K [--kill-rank R --kill-at S]

Each rank holds half the rows of "w" (a lifeline.Shard), updates it every step by a rule that
depends on its previous value (so a lost or stale byte shows in the end), saves every K steps, and
on the first launch (LIFELINE_RESTART 0) rank R SIGKILLs itself in the middle of step S. Rank 0
prints "resumed from step N" when it loads a checkpoint, and "done" at the end.
"""
import argparse
import os
import signal
import sys

import torch

import lifeline

ROWS, COLS = 64, 32


def initial():
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) / 7.0


def advance(w, step):
    """One training step: w depends on every earlier step's value."""
    w.mul_(0.5).add_(float(step))


def trained(steps):
    """The whole tensor after `steps` steps, never interrupted: the reference of a resumed run."""
    w = initial()
    for step in range(1, steps + 1):
        advance(w, step)
    return w


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=-1)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rows = ROWS // world
    w = initial()[rank * rows:(rank + 1) * rows].clone()
    state = {"w": lifeline.Shard(w, global_shape=(ROWS, COLS), offsets=(rank * rows, 0)), "step": 0}
    ckpt = lifeline.Checkpointer(args.dir, keep_last=2)
    start = ckpt.load(state) or 0
    if start and rank == 0:
        print(f"resumed from step {start} ({'memory' if ckpt.last_load['from_memory_tier'] else 'bucket'})",
              flush=True)
    for step in range(start + 1, args.steps + 1):
        if step == args.kill_at and rank == args.kill_rank and os.environ.get("LIFELINE_RESTART") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        advance(w, step)
        if step % args.every == 0:
            state["step"] = step
            # Lock-step: no rank runs past a save the other has not finished, so the kill at
            # --kill-at always finds the same newest committed step.
            ckpt.save(step, state).wait_committed()
    ckpt.close()
    if rank == 0:
        print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A job that saves every step into an s3:// directory with the memory tier on, for
tests/python/test_s3_faults.py, while the test takes the bucket away and brings it back.

    s3_outage_job.py --dir s3://bucket/prefix --steps N --progress DIR --hold-at S --hold-file F

Each rank holds half the rows of "w" (a lifeline.Shard), joins the others in an all_reduce over gloo
every step (a training step no rank can take alone), updates w by s3_agent_job.advance, saves the
step (ckpt.save, then ckpt.wait_snapshot before the next update, as guard_optimizer does) and writes
the step it reached to DIR/rank<R>. At step S it waits until F exists, so that the test decides when
the last steps are saved (after the bucket is back). Rank R writes what its tickets said to
DIR/tickets<R>.json: per step, whether the save went to the memory tier and its error, if any.
Rank 0 prints "done" at the end.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import lifeline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s3_agent_job import COLS, ROWS, advance, initial  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--progress", required=True)
    p.add_argument("--hold-at", type=int, required=True)
    p.add_argument("--hold-file", required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = ROWS // world
    w = initial()[rank * rows:(rank + 1) * rows].clone()
    state = {"w": lifeline.Shard(w, global_shape=(ROWS, COLS), offsets=(rank * rows, 0)), "step": 0}
    ckpt = lifeline.Checkpointer(args.dir, memory_tier=True, keep_last=4)
    tickets = []
    for step in range(1, args.steps + 1):
        if step == args.hold_at:
            while not os.path.exists(args.hold_file):
                time.sleep(0.05)
        ones = torch.ones(1)
        dist.all_reduce(ones)
        assert ones.item() == world
        ckpt.wait_snapshot()  # the previous save has read w: it may change now
        advance(w, step)
        state["step"] = step
        tickets.append(ckpt.save(step, state))
        with open(os.path.join(args.progress, f"rank{rank}.tmp"), "w") as f:
            f.write(str(step))
        os.replace(os.path.join(args.progress, f"rank{rank}.tmp"), os.path.join(args.progress, f"rank{rank}"))
        time.sleep(0.3)  # the rest of a training step: the store keeps up while it is there
    ckpt.close()  # waits for the durable copies; raises if the last one failed
    said = {t.step: {"memory_tier": t.progress()["memory_tier"], "error": t.error()} for t in tickets}
    with open(os.path.join(args.progress, f"tickets{rank}.json"), "w") as f:
        json.dump(said, f)
    dist.destroy_process_group()
    if rank == 0:
        print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

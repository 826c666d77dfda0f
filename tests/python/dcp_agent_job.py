"""One FSDP2 job (2 gloo ranks, AdamW) saving every EVERY steps, through DCP or through Lifeline's
own API, for tests/python/test_dcp_agent.py: --path dcp saves with dcp.async_save through
lifeline.dcp.StorageWriter (its own process group, as docs/pytorch.md says) and resumes with dcp.load
through StorageReader; --path native saves with lifeline.Checkpointer and lifeline.torch. Rank 1 of
the first launch dies as it begins step --kill-at. At the end, its last save durable and its checkpointer
still open, rank 0 prints its parameters' digest ("final HEX"), and with --hold it writes
HOLD.holding and waits for HOLD to appear (so the test can read the agent's metrics of a job that
has not ended, or start a second job into the directory this one holds).

--close never|context|exception: how the DCP writer ends: never closed (the interpreter's end
closes it), closed, or (exception) the first launch ends on an uncaught exception once its save
of step 15 is durable (its relaunch should find the snapshots in memory).
"""
import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import lifeline
import lifeline.dcp
import lifeline.torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--path", choices=("dcp", "native"), required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--hold", default="")
    p.add_argument("--close", choices=("never", "context", "exception"), default="context")
    p.add_argument("--no-group", action="store_true",
                   help="async_save on the default group (each save waited for at once, so nothing races it)")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(3)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train(step):
        x = torch.randn(16, 128, generator=torch.Generator().manual_seed(1000 * step + rank))
        model(x).square().mean().backward()

    def end():
        """The final digest, and the hold (the last save durable, the writer not yet closed)."""
        digest = hashlib.sha256()
        for name, param in model.named_parameters():  # full_tensor() is collective: every rank digests
            digest.update(name.encode())
            digest.update(param.detach().full_tensor().numpy().tobytes())
        if rank == 0:
            print(f"final {digest.hexdigest()}", flush=True)
        if args.hold and rank == 0:
            open(args.hold + ".holding", "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(args.hold) and time.monotonic() < deadline:
                time.sleep(0.05)
        dist.barrier()

    first_launch = os.environ.get("LIFELINE_RESTART") == "0"

    def killed(step, wait_saved):
        # Once the last save is committed, so that the step resumed from does not depend on timing.
        if step == args.kill_at and rank == 1 and first_launch:
            wait_saved()
            os.kill(os.getpid(), 9)

    if args.path == "dcp":
        group = None if args.no_group else dist.new_group(backend="gloo")

        def state(step):
            model_sd, optim_sd = get_state_dict(model, optimizer)
            return {"model": model_sd, "optim": optim_sd, "step": step}

        start = 0
        if lifeline.dcp.resume_step(args.dir) is not None:
            sd = state(0)
            reader = lifeline.dcp.StorageReader(args.dir)
            dcp.load(sd, storage_reader=reader)
            set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            start = sd["step"] + 1
            print(f"rank {rank} loaded step {reader.last_load['step']} "
                  f"from {'memory' if reader.last_load['from_memory_tier'] else 'disk'}", flush=True)
        writer = lifeline.dcp.StorageWriter(args.dir, memory_tier=True, keep_last=2)
        saving = None
        for step in range(start, args.steps):
            killed(step, lambda: saving.upload_completion.result())
            train(step)
            if saving is not None:
                saving.staging_completion.result()
            optimizer.step()
            optimizer.zero_grad()
            if step % args.every == 0 or step == args.steps - 1:
                if saving is not None:  # one async_save in flight at a time (DCP's rule)
                    saving.upload_completion.result()
                saving = dcp.async_save(state(step), storage_writer=writer, process_group=group)
                if args.no_group:
                    saving.upload_completion.result()
                if args.close == "exception" and first_launch and step == 15:
                    saving.upload_completion.result()
                    raise RuntimeError("the script's own error after a save")
        if saving is not None:  # a relaunch of a job that had saved its last step saves nothing
            saving.upload_completion.result()
        end()
        if args.close == "context":
            writer.close()
    else:
        ckpt = lifeline.Checkpointer(args.dir, memory_tier=True, keep_last=2)
        loaded = lifeline.torch.load(ckpt, model, optimizer)
        start = 0 if loaded is None else loaded + 1
        saved = None
        for step in range(start, args.steps):
            killed(step, lambda: ckpt.wait_for_commit(saved))
            train(step)
            ckpt.wait_snapshot()
            optimizer.step()
            optimizer.zero_grad()
            if step % args.every == 0 or step == args.steps - 1:
                ckpt.save(step, lifeline.torch.state_dict(model, optimizer))
                saved = step
        ckpt.flush()
        end()
        ckpt.close()

    dist.destroy_process_group()


if __name__ == "__main__":
    main()

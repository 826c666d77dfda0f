"""One rank of a fault-injection job for tools/sdc-campaign (tests/campaign/sdc_campaign.py).

    sdc_job.py OUT SPEC_JSON

Run by lifeline-agent (RANK, WORLD_SIZE, LIFELINE_RESTART come from it). A small MLP trained with
Adam over gloo, either DDP (replicas) or FSDP2 (one shard per rank), checkpointed with
lifeline.torch every `ckpt_every` steps, its loss reported with lifeline.report and its gradient
norm by an unchanged clip_grad_norm_. The batch of a step is a function of the seed, the step and
the rank alone, so a relaunch after a rollback replays the same data, and the script follows the
skip recipe of docs/reliability.md (lifeline.skip_steps()).

SPEC_JSON: {"parallel": "ddp"|"fsdp2", "steps": N, "ckpt_every": K, "seed": S, "pause": seconds
slept after each step, "fault": null or {"class": C, "step": s, "rank": r, "bit": b, "u": [u0, u1]}};
u picks the tensor (weighted by size) and the element (a DDP gradient: u1 the element of the first
bucket reduced). The fault acts once, on the first launch only (a transient fault of the machine),
except a poisoned batch, which is data and comes back whenever its step is trained.
Classes (the injection step is s in each):

  param_exponent/param_mantissa   bit b of one element of rank r's parameters, before step s
  grad_pre_*/grad_post_*          bit b of one element of rank r's gradient in step s, before or
                                  after its all-reduce (DDP: in the communication hook; FSDP2:
                                  post only, in the rank's shard after the reduce-scatter)
  adam_m_exponent/adam_v_exponent/adam_mantissa
                                  bit b of one element of rank r's exp_avg / exp_avg_sq (mantissa:
                                  either, by u), before step s
  poisoned_batch                  rank r's batch of step s, inputs and targets scaled by 100
                                  (on every launch that trains step s)
  nan_loss                        rank r's loss of step s multiplied by NaN

This script only injects and trains; what happened is judged from the agent's events log and the
checkpoints. At the end of the launch that finishes it writes result.RESTART.RANK.json with a
digest of its parameters and optimizer state and params.RESTART.RANK.pt with its parameters (the
final state, compared with a clean run's); the faulty rank writes inject.RANK.json (each flipped
value before and after, the step's loss), which the campaign keeps for notes and never scores with.
"""

import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import lifeline
import lifeline.torch

torch.set_num_threads(1)


INJECTED = []  # (before, after) of each flip, written to inject.RANK.json for the report's notes


def flip_bit(t, index, bit):
    """Flips bit `bit` of element `index` of the float32 tensor t, in place."""
    with torch.no_grad():
        flat = t.view(-1)
        before = float(flat[index])
        ints = flat.view(torch.int32)
        mask = (1 << bit) if bit < 31 else -(1 << 31)
        ints[index] ^= mask
        INJECTED.append((before, float(flat[index])))


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def pick(tensors, u):
    """The (tensor, element) that u = [u0, u1] in [0, 1) picks: tensors weighted by their size."""
    sizes = [t.numel() for t in tensors]
    total = sum(sizes)
    at = min(int(u[0] * total), total - 1)
    for t, n in zip(tensors, sizes):
        if at < n:
            return t, min(int(u[1] * n), n - 1)
        at -= n
    raise AssertionError("no element")


def main():
    out, spec = sys.argv[1], json.loads(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("LIFELINE_RESTART", "0"))
    parallel, steps, every, seed = spec["parallel"], spec["steps"], spec["ckpt_every"], spec["seed"]
    pause = spec.get("pause", 0.0)
    fault = spec.get("fault") or {}
    cls = fault.get("class", "")
    # A transient fault acts on the first launch only; a poisoned batch is data and stays.
    armed = bool(cls) and (restart == 0 or cls == "poisoned_batch")
    mine = armed and fault["rank"] == rank

    dist.init_process_group("gloo")
    out_rank = os.path.join(out, f"inject.{rank}.json")
    torch.manual_seed(seed)
    width = 64
    # GELU, not tanh: a saturating activation would bound what an exploded weight does to the loss.
    net = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                              torch.nn.GELU(), torch.nn.Linear(width, 4))
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed + 7))
    pending = {}  # grad_pre/grad_post: set at the faulty step, consumed by the hook once

    if parallel == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(net)

        def allreduce_hook(_, bucket):
            buf = bucket.buffer()
            buf.div_(world)
            if pending.get("when") == "pre":
                flip_bit(buf, min(int(pending.pop("u")[1] * buf.numel()), buf.numel() - 1), pending.pop("bit"))
                pending.clear()
            fut = dist.all_reduce(buf, async_op=True).get_future()

            def reduced(f):
                t = f.value()[0]
                if pending.get("when") == "post":
                    flip_bit(t, min(int(pending.pop("u")[1] * t.numel()), t.numel() - 1), pending.pop("bit"))
                    pending.clear()
                return t
            return fut.then(reduced)
        params = list(model.parameters())
    elif parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in (net[0], net[2], net[4]):
            fully_shard(layer)
        model = fully_shard(net)
        params = list(model.parameters())
    else:
        raise SystemExit(f"unknown parallel {parallel!r}")
    opt = torch.optim.Adam(params, lr=3e-3)

    ckpt = lifeline.Checkpointer(os.path.join(out, "ckpt"), memory_tier=True)
    lifeline.guard_optimizer(opt, ckpt)
    loaded = lifeline.torch.load(ckpt, model, opt)
    if parallel == "ddp":
        # The same hook in every run, clean or not: the default one's arithmetic, with a seam for
        # the faults. Registered after the load, which lays DDP's buckets out as the saver had them
        # (only for DDP's plain reducer): with 3 or more ranks the order of the all-reduce's sums
        # depends on where a gradient sits in its bucket, and a replay is bit-exact only in the
        # saver's layout.
        model.register_comm_hook(None, allreduce_hook)
    start = 1 if loaded is None else int(loaded) + 1
    skip = lifeline.skip_steps()

    for step in range(start, steps + 1):
        g = torch.Generator().manual_seed(seed * 1000003 + step * 101 + rank)
        x = torch.randn(64, 16, generator=g)
        y = torch.tanh(x @ teacher)
        if step in skip:
            continue  # the recipe: the batch is drawn, not trained on
        here = mine and fault["step"] == step
        if here and cls.startswith("param_"):
            t, i = pick([local(p) for p in params], fault["u"])
            flip_bit(t, i, fault["bit"])
        if here and cls.startswith("adam_") and step > 1:
            states = [local(opt.state[p][key]) for p in params
                      for key in (("exp_avg",) if cls == "adam_m_exponent" else ("exp_avg_sq",)
                                  if cls == "adam_v_exponent" else ("exp_avg", "exp_avg_sq"))]
            t, i = pick(states, fault["u"])
            flip_bit(t, i, fault["bit"])
        if here and cls == "poisoned_batch":
            x, y = x * 100, y * 100  # garbage inputs and targets
        if here and parallel == "ddp" and cls.startswith("grad_"):
            pending.update(when="pre" if cls.startswith("grad_pre") else "post", u=fault["u"], bit=fault["bit"])
        with lifeline.trace.step(step):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if here and cls == "nan_loss":
                loss = loss * float("nan")
            opt.zero_grad()
            loss.backward()
            if here and parallel == "fsdp2" and cls.startswith("grad_post"):
                t, i = pick([local(p.grad) for p in params], fault["u"])
                flip_bit(t, i, fault["bit"])
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            lifeline.report(loss=loss)
        if here:
            with open(out_rank, "w") as f:
                json.dump({"step": step, "flips": INJECTED, "loss": float(loss)}, f)
        if step % every == 0:
            ckpt.save(step, lifeline.torch.state_dict(model, opt))
        time.sleep(pause)  # the rest of a real step: the agent judges a step before the job is far past it
    ckpt.close()

    digest = hashlib.sha256()
    finite = True
    for p in params:
        for t in [p] + [opt.state[p][k] for k in ("exp_avg", "exp_avg_sq") if k in opt.state[p]]:
            t = local(t).detach()
            digest.update(t.contiguous().numpy().tobytes())
            finite = finite and bool(torch.isfinite(t).all())
    torch.save(torch.cat([local(p).detach().reshape(-1) for p in params]),
               os.path.join(out, f"params.{restart}.{rank}.pt"))
    with open(os.path.join(out, f"result.{restart}.{rank}.json"), "w") as f:
        json.dump({"digest": digest.hexdigest(), "finite": finite, "skipped": sorted(s for s in skip if s <= steps),
                   "loaded": None if loaded is None else int(loaded)}, f)
    lifeline.trace.process_exit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

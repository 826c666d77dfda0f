#!/usr/bin/env python3
"""A small GPT trained on CPU with data and tensor parallelism, checkpointed through Lifeline.

The example training job of Lifeline: a decoder-only transformer (token and position embeddings,
pre-LN blocks of causal self-attention and a GELU MLP, final LayerNorm, LM head tied to the token
embedding) learns a synthetic task. Ranks form a dp x tp grid (rank = dp_rank * tp + tp_rank):
attention is split by heads and the MLP by its hidden units over the tensor-parallel (TP) group,
Megatron-style, and gradients are summed over the data-parallel (DP) group. Every few steps the
parameters and Adam's moments are saved lazily with lifeline.Checkpointer, as Shards of the
full-size tensors named by parameter, so a checkpoint can be resumed with any world size and TP.

    lifeline-agent run --nproc 4 -- python3 tools/train_gpt.py --dir /tmp/ckpt [--fault kill@1:23]
    torchrun --nproc_per_node 4 tools/train_gpt.py --dir /tmp/ckpt
    python3 tools/train_gpt.py --dir /tmp/ckpt                      # one rank
    python3 tools/train_gpt.py --compare /tmp/ckpt-a /tmp/ckpt-b    # bitwise comparison of two runs

A run that is killed and resumed ends with parameters and optimizer state bitwise equal to an
uninterrupted run of the same world size and TP: the model is initialised from --seed, the batch of
step s depends only on (--seed, s), every rank runs one thread, and gloo's all-reduce is
deterministic. Faults for drills (--fault, repeatable; each on the launch whose restart count,
LIFELINE_RESTART or TORCHELASTIC_RESTART_COUNT, equals RESTART, default 0):
    kill@RANK:STEP[:RESTART]   that rank SIGKILLs itself at the start of STEP
    raise@RANK:STEP[:RESTART]  that rank raises an exception at the start of STEP (exit status 1;
                               its peers' next collective fails and they exit too)
    hang@RANK:STEP[:RESTART]   that rank blocks forever in STEP before its first collective
"""

import argparse
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import lifeline

# Parameters split over the TP group, by the dimension they are split along; every other parameter
# is replicated. The attention's fused QKV weight is stored as (3, d_model, d_model) so that a
# rank's heads are one box of it (rows of q, k and v alike) and the checkpoint can describe it.
_SPLIT_DIM = {
    "attn.qkv.weight": 1,   # column parallel: this rank's heads
    "attn.qkv.bias": 1,
    "attn.proj.weight": 1,  # row parallel: input features from this rank's heads
    "mlp.fc1.weight": 0,    # column parallel: this rank's hidden units
    "mlp.fc1.bias": 0,
    "mlp.fc2.weight": 1,    # row parallel
}

# Trace communicator ids: the same number on every member of a group.
_COMM_WORLD, _COMM_TP_BASE, _COMM_DP_BASE = 0, 100, 200


class UsageError(Exception):
    """A bad argument or an impossible layout; reported on one line, exit status 2."""


class CompareError(Exception):
    """--compare cannot compare (no checkpoint, another model); reported on one line, exit status 1."""


# ---- arguments and faults ----------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", help="checkpoint directory (required unless --compare)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default 2 if the world size is even)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--global-batch", type=int, default=16, help="sequences per step, split evenly over dp ranks")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="kill@, raise@ or hang@RANK:STEP[:RESTART] (repeatable)")
    p.add_argument("--no-memory-tier", action="store_true", help="save to disk only, not also to /dev/shm")
    p.add_argument("--quiet", action="store_true", help="print every 10th step only")
    p.add_argument("--compare", nargs=2, metavar=("DIR1", "DIR2"),
                   help="compare the newest checkpoints of two directories bitwise and exit")
    args = p.parse_args(argv)
    if args.compare is None and not args.dir:
        p.error("--dir is required")
    for name in ("steps", "ckpt_every", "d_model", "layers", "heads", "seq", "vocab", "global_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    try:
        args.faults = [parse_fault(s) for s in args.fault]
    except ValueError as e:
        p.error(str(e))
    return args


def parse_fault(spec):
    """'kill@1:23' -> ("kill", 1, 23, 0); 'hang@2:41:1' -> ("hang", 2, 41, 1)."""
    kind, sep, rest = spec.partition("@")
    fields = rest.split(":")
    if kind not in ("kill", "raise", "hang") or not sep or len(fields) not in (2, 3):
        raise ValueError(f"--fault {spec!r}: expected kill@, raise@ or hang@RANK:STEP[:RESTART]")
    try:
        rank, step, restart = int(fields[0]), int(fields[1]), int(fields[2]) if len(fields) == 3 else 0
    except ValueError:
        raise ValueError(f"--fault {spec!r}: RANK, STEP and RESTART must be integers") from None
    return kind, rank, step, restart


def restart_count():
    for name in ("LIFELINE_RESTART", "TORCHELASTIC_RESTART_COUNT"):
        v = os.environ.get(name)
        if v not in (None, ""):
            return int(v)
    return 0


# ---- communication --------------------------------------------------------------------------------

class Comm:
    """The rank's place in the dp x tp grid and its traced all-reduces.

    Groups of one member skip the collective entirely. `step` is the step being run, for --fault hang."""

    def __init__(self, rank, world, tp):
        self.rank, self.world, self.tp = rank, world, tp
        self.dp = world // tp
        self.tp_rank, self.dp_rank = rank % tp, rank // tp
        self.tp_group = self.dp_group = None
        if world > 1:
            # Every rank creates every group, in the same order (new_group is collective).
            for d in range(self.dp):
                g = dist.new_group([d * tp + t for t in range(tp)]) if tp > 1 else None
                if d == self.dp_rank:
                    self.tp_group = g
            for t in range(tp):
                g = dist.new_group([d * tp + t for d in range(self.dp)]) if self.dp > 1 else None
                if t == self.tp_rank:
                    self.dp_group = g
        self.tp_comm_id = _COMM_TP_BASE + self.dp_rank
        self.dp_comm_id = _COMM_DP_BASE + self.tp_rank
        self.step = 0
        self.hang_steps = set()

    def all_reduce(self, t, group, size, comm_id):
        """Sums `t` in place over `group` (of `size` ranks), inside a trace scope."""
        if size == 1:
            return t
        if self.step in self.hang_steps:
            # --fault hang: stop before entering the collective (and its trace scope), so the agent
            # sees this rank never join while its peers wait inside it.
            sys.stdout.flush()
            while True:
                time.sleep(3600)
        with lifeline.trace.collective("allreduce", t.numel() * t.element_size(), comm=comm_id):
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t

    def tp_all_reduce(self, t):
        return self.all_reduce(t, self.tp_group, self.tp, self.tp_comm_id)

    def dp_all_reduce(self, t):
        return self.all_reduce(t, self.dp_group, self.dp, self.dp_comm_id)


class _CopyToTP(torch.autograd.Function):
    """Entry of a column-parallel layer: identity forward, gradient summed over the TP group backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.tp_all_reduce(grad.clone()), None


class _ReduceFromTP(torch.autograd.Function):
    """Exit of a row-parallel layer: partial outputs summed over the TP group forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm):
        return comm.tp_all_reduce(x.clone())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# ---- model --------------------------------------------------------------------------------------

def full_parameters(args):
    """The full-size initial parameters, name -> tensor, identical on every rank for a given seed."""
    d, v = args.d_model, args.vocab
    g = torch.Generator().manual_seed(args.seed)
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * args.layers)

    def normal(*shape, s=std):
        return torch.empty(shape).normal_(0.0, s, generator=g)

    params = {"wte": normal(v, d), "wpe": normal(args.seq, d)}
    for i in range(args.layers):
        h = f"h.{i}."
        params[h + "ln1.weight"], params[h + "ln1.bias"] = torch.ones(d), torch.zeros(d)
        params[h + "attn.qkv.weight"], params[h + "attn.qkv.bias"] = normal(3, d, d), torch.zeros(3, d)
        params[h + "attn.proj.weight"], params[h + "attn.proj.bias"] = normal(d, d, s=proj_std), torch.zeros(d)
        params[h + "ln2.weight"], params[h + "ln2.bias"] = torch.ones(d), torch.zeros(d)
        params[h + "mlp.fc1.weight"], params[h + "mlp.fc1.bias"] = normal(4 * d, d), torch.zeros(4 * d)
        params[h + "mlp.fc2.weight"], params[h + "mlp.fc2.bias"] = normal(d, 4 * d, s=proj_std), torch.zeros(d)
    params["ln_f.weight"], params["ln_f.bias"] = torch.ones(d), torch.zeros(d)
    return params


def split_dim(name):
    """The dimension `name` is split along over the TP group, or None when it is replicated."""
    for suffix, dim in _SPLIT_DIM.items():
        if name.endswith(suffix):
            return dim
    return None


def tp_piece(name, full_shape, tp, tp_rank):
    """(offsets, shape) of this TP rank's box of the parameter, or None when it is replicated."""
    dim = split_dim(name)
    if dim is None or tp == 1:
        return None
    if full_shape[dim] % tp:
        raise UsageError(f"{name}: dimension {dim} of {tuple(full_shape)} is not divisible by tp={tp}")
    part = full_shape[dim] // tp
    offsets = [0] * len(full_shape)
    offsets[dim] = tp_rank * part
    shape = list(full_shape)
    shape[dim] = part
    return tuple(offsets), tuple(shape)


class TinyGPT:
    """This rank's parameters (name -> leaf tensor, its TP pieces) and the forward pass."""

    def __init__(self, args, comm):
        self.args, self.comm = args, comm
        self.heads_local = args.heads // comm.tp
        self.head_dim = args.d_model // args.heads
        self.full_shapes, self.params = {}, {}
        for name, full in full_parameters(args).items():
            self.full_shapes[name] = tuple(full.shape)
            piece = tp_piece(name, full.shape, comm.tp, comm.tp_rank)
            if piece is not None:
                offsets, shape = piece
                full = full[tuple(slice(o, o + n) for o, n in zip(offsets, shape))]
            self.params[name] = full.clone().contiguous().requires_grad_(True)
        mask = torch.ones(args.seq, args.seq, dtype=torch.bool).tril()
        self.causal_mask = mask.view(1, 1, args.seq, args.seq)

    def _layer_norm(self, x, prefix):
        return F.layer_norm(x, (self.args.d_model,), self.params[prefix + ".weight"], self.params[prefix + ".bias"])

    def _attention(self, x, h):
        p, comm = self.params, self.comm
        B, T, D = x.shape
        hl, hd = self.heads_local, self.head_dim
        x = _CopyToTP.apply(x, comm) if comm.tp > 1 else x
        w, b = p[h + "attn.qkv.weight"], p[h + "attn.qkv.bias"]
        qkv = F.linear(x, w.reshape(3 * hl * hd, D), b.reshape(3 * hl * hd))
        q, k, v = qkv.view(B, T, 3, hl, hd).permute(2, 0, 3, 1, 4)          # each (B, hl, T, hd)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.causal_mask[:, :, :T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, hl * hd)
        y = F.linear(y, p[h + "attn.proj.weight"])
        y = _ReduceFromTP.apply(y, comm) if comm.tp > 1 else y
        return y + p[h + "attn.proj.bias"]

    def _mlp(self, x, h):
        p, comm = self.params, self.comm
        x = _CopyToTP.apply(x, comm) if comm.tp > 1 else x
        x = F.gelu(F.linear(x, p[h + "mlp.fc1.weight"], p[h + "mlp.fc1.bias"]))
        x = F.linear(x, p[h + "mlp.fc2.weight"])
        x = _ReduceFromTP.apply(x, comm) if comm.tp > 1 else x
        return x + p[h + "mlp.fc2.bias"]

    def loss(self, inputs, targets):
        p = self.params
        T = inputs.shape[1]
        x = F.embedding(inputs, p["wte"]) + p["wpe"][:T]
        for i in range(self.args.layers):
            h = f"h.{i}."
            x = x + self._attention(self._layer_norm(x, h + "ln1"), h)
            x = x + self._mlp(self._layer_norm(x, h + "ln2"), h)
        x = self._layer_norm(x, "ln_f")
        logits = F.linear(x, p["wte"])  # the LM head is the token embedding, replicated
        return F.cross_entropy(logits.reshape(-1, self.args.vocab), targets.reshape(-1))


def make_batch(args, step, dp, dp_rank):
    """This dp rank's slice of the global batch of `step`: (inputs, targets), each (batch, seq).

    Each sequence follows x[t+1] = (a * x[t] + b) mod vocab with its own (a, b) from a small set, so
    after a few tokens the rest is predictable. The whole global batch is drawn on every rank from a
    generator seeded by (seed, step) alone: the data does not depend on the layout or on restarts."""
    g = torch.Generator().manual_seed(args.seed * 1000003 + step)
    n, length = args.global_batch, args.seq + 1
    a = torch.tensor([1, 3, 5, 7])[torch.randint(0, 4, (n,), generator=g)]
    b = torch.tensor([1, 2, 5, 11])[torch.randint(0, 4, (n,), generator=g)]
    x = torch.empty(n, length, dtype=torch.int64)
    x[:, 0] = torch.randint(0, args.vocab, (n,), generator=g)
    for t in range(1, length):
        x[:, t] = (a * x[:, t - 1] + b) % args.vocab
    per_rank = n // dp
    x = x[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


# ---- optimizer and checkpoint state ------------------------------------------------------------------

def make_optimizer(model, lr):
    """Adam with its state already materialised, as a fresh Adam would create it on its first step
    (step 0.0 as a float32 scalar, zero moments), so a checkpoint can be loaded into it in place."""
    params = list(model.params.values())
    opt = torch.optim.Adam(params, lr=lr)
    for prm in params:
        opt.state[prm] = {
            "step": torch.tensor(0.0, dtype=torch.float32),
            "exp_avg": torch.zeros_like(prm, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(prm, memory_format=torch.preserve_format),
        }
    return opt


def checkpoint_state(model, opt, comm, step, seed):
    """The training state as Lifeline Shards of the full-size tensors, named by parameter.

    TP pieces are boxes of the global tensor, replicated over the DP group; replicated tensors are
    copies identical on every rank. Built anew for each save, so it always points at the
    optimizer's current tensors."""
    def shard(name, t):
        piece = tp_piece(name, model.full_shapes[name], comm.tp, comm.tp_rank)
        if piece is None:
            return lifeline.Shard(t, replica=(comm.rank, comm.world))
        offsets, _ = piece
        return lifeline.Shard(t, global_shape=model.full_shapes[name], offsets=offsets,
                              replica=(comm.dp_rank, comm.dp))

    state = {"model": {}, "optim": {}, "train": {"step": step, "seed": seed, "tp": comm.tp, "dp": comm.dp}}
    for name, prm in model.params.items():
        s = opt.state[prm]
        state["model"][name] = shard(name, prm.detach())
        state["optim"][name] = {
            "exp_avg": shard(name, s["exp_avg"]),
            "exp_avg_sq": shard(name, s["exp_avg_sq"]),
            "step": lifeline.Shard(s["step"], replica=(comm.rank, comm.world)),
        }
    return state


def model_config(args):
    return {"d_model": args.d_model, "layers": args.layers, "heads": args.heads, "seq": args.seq,
            "vocab": args.vocab, "seed": args.seed}


def check_config(args, metadata, where):
    """Refuses to resume a checkpoint of another model (its shapes would not match anyway)."""
    if not metadata or "model" not in metadata:
        return
    saved, ours = metadata["model"], model_config(args)
    diff = [f"{k} {saved.get(k)} (now {v})" for k, v in ours.items() if saved.get(k) != v]
    if diff:
        raise UsageError(f"{where} was saved with another model: {', '.join(diff)}")


# ---- training ---------------------------------------------------------------------------------------

def train(args):
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tp = args.tp if args.tp is not None else (2 if world % 2 == 0 else 1)
    if tp < 1 or world % tp:
        raise UsageError(f"--tp {tp} does not divide the world size {world}")
    dp = world // tp
    if args.heads % tp:
        raise UsageError(f"--heads {args.heads} is not divisible by tp={tp}")
    if args.global_batch % dp:
        raise UsageError(f"--global-batch {args.global_batch} is not divisible by dp={dp} "
                         f"(world {world} / tp {tp})")
    torch.set_num_threads(1)  # several ranks share a few cores; also keeps every reduction's order fixed

    restart = restart_count()
    faults = [(kind, step) for kind, r, step, rs in args.faults if r == rank and rs == restart]

    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    comm = Comm(rank, world, tp)
    comm.hang_steps = {step for kind, step in faults if kind == "hang"}
    kill_steps = {step for kind, step in faults if kind == "kill"}
    raise_steps = {step for kind, step in faults if kind == "raise"}

    model = TinyGPT(args, comm)
    opt = make_optimizer(model, args.lr)
    ckpt = lifeline.Checkpointer(args.dir, rank=rank, world_size=world,
                                 memory_tier=not args.no_memory_tier, keep_last=3)
    try:
        start = ckpt.load(checkpoint_state(model, opt, comm, 0, args.seed), objects_of_rank=0)
    except lifeline.Error as e:
        raise UsageError(f"rank {rank}: cannot resume from {args.dir}: {e}") from None
    if start is None:
        start = 0
        if rank == 0:
            print("starting fresh", flush=True)
    else:
        info = ckpt.last_load
        check_config(args, info.get("metadata"), f"{args.dir} step {start}")
        if rank == 0:
            tier = "memory tier" if info["from_memory_tier"] else "disk"
            print(f"resumed from step {start} ({tier}), saved by {info['saved_world_size']} ranks", flush=True)
    lifeline.guard_optimizer(opt, ckpt)

    params = list(model.params.values())
    tickets, loss_value = [], float("nan")
    for s in range(start + 1, args.steps + 1):
        comm.step = s
        with lifeline.trace.step(s):
            if s in kill_steps:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            if s in raise_steps:
                raise RuntimeError(f"fault: rank {rank} raises at step {s}")
            inputs, targets = make_batch(args, s, dp, comm.dp_rank)
            for prm in params:
                prm.grad = None
            loss = model.loss(inputs, targets)
            loss.backward()
            # One flat bucket: every gradient and the loss, summed over the DP group.
            bucket = torch.cat([prm.grad.reshape(-1) for prm in params] + [loss.detach().reshape(1)])
            comm.dp_all_reduce(bucket)
            if dp > 1:
                bucket.div_(dp)
            offset = 0
            for prm in params:
                n = prm.numel()
                prm.grad.copy_(bucket[offset:offset + n].view_as(prm))
                offset += n
            loss_value = bucket[offset].item()
            opt.step()  # guarded: waits until the previous save's snapshot is copied
            if s % args.ckpt_every == 0 or s == args.steps:
                state = checkpoint_state(model, opt, comm, s, args.seed)
                tickets.append(ckpt.save(s, state, metadata={"model": model_config(args)}))
        if rank == 0 and (not args.quiet or s % 10 == 0 or s == args.steps):
            print(f"step {s} loss {loss_value:.6f}", flush=True)

    if tickets:
        tickets[-1].wait()
    failed = [t for t in tickets if t.error()]
    ckpt.close()
    for t in failed:
        print(f"rank {rank}: the save of step {t.step} failed: {t.error()}", file=sys.stderr, flush=True)
    if rank == 0:
        if start >= args.steps:
            print(f"done: the checkpoint of step {start} already reaches --steps {args.steps}", flush=True)
        else:
            print(f"done: step {args.steps}, final loss {loss_value:.6f}", flush=True)
    lifeline.trace.process_exit()
    if world > 1:
        dist.destroy_process_group()
    return 0


# ---- --compare ------------------------------------------------------------------------------------

def _bytes(t):
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def load_full(args, directory):
    """The newest checkpoint of `directory` in a full-size (tp=1, dp=1) model and Adam state."""
    if not os.path.isdir(directory):
        raise CompareError(f"{directory}: no such directory")
    comm = Comm(0, 1, 1)
    model = TinyGPT(args, comm)
    opt = make_optimizer(model, args.lr)
    state = checkpoint_state(model, opt, comm, 0, args.seed)
    ckpt = lifeline.Checkpointer(directory, rank=0, world_size=1, memory_tier=False)
    try:
        step = ckpt.load(state, objects_of_rank=0)
    except lifeline.Error as e:
        raise CompareError(f"{directory}: cannot load its newest checkpoint: {e}") from None
    finally:
        ckpt.close()
    if step is None:
        raise CompareError(f"{directory}: no complete checkpoint")
    try:
        check_config(args, ckpt.last_load.get("metadata"), f"{directory} step {step}")
    except UsageError as e:
        raise CompareError(str(e)) from None
    tensors = {}
    for name, prm in model.params.items():
        tensors[f"model.{name}"] = prm.detach()
        for key in ("exp_avg", "exp_avg_sq", "step"):
            tensors[f"optim.{name}.{key}"] = opt.state[prm][key]
    return step, tensors


def compare(args):
    torch.set_num_threads(1)
    dir1, dir2 = args.compare
    step1, a = load_full(args, dir1)
    step2, b = load_full(args, dir2)
    if step1 != step2:
        print(f"steps differ: {dir1} holds step {step1}, {dir2} holds step {step2}")
        return 1
    differing, total = [], 0
    for name, x in a.items():
        y = b[name]
        total += x.numel() * x.element_size()
        if not torch.equal(_bytes(x), _bytes(y)):
            diff = (x.double() - y.double()).abs()
            differing.append((name, diff.nan_to_num(nan=float("inf")).max().item()))
    if differing:
        for name, d in differing:
            print(f"differs: {name} (max abs difference {d:.3g})")
        print(f"{len(differing)} of {len(a)} tensors differ, step {step1}")
        return 1
    print(f"bitwise identical: {len(a)} tensors, {total} bytes, step {step1}")
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return compare(args) if args.compare else train(args)
    except UsageError as e:
        print(f"train_gpt: {e}", file=sys.stderr, flush=True)
        return 2
    except CompareError as e:
        print(f"train_gpt: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""PyTorch models and optimizers as Lifeline states, keyed by parameter name.

    state = lifeline.torch.state_dict(model, optimizer)   # plain, DDP, FSDP2 and/or tensor parallel
    ckpt.save(step, state)
    ...
    step = lifeline.torch.load(ckpt, model, optimizer)    # a freshly constructed optimizer is fine

Names never carry DDP's "module." prefix, and optimizer state is keyed by parameter name, not by
index, so a checkpoint saved under DDP loads into a plain model and back. A DDP model's parameters
and optimizer state are the same on every rank of its process group: they are marked as replicas,
so one copy is written; its buffers are saved by the group's rank 0, whose buffers DDP broadcasts.
A plain model saved from several ranks is not marked: if the ranks hold the same tensors, the
commit fails every rank's save (mark them, or use DDP). A model sharded with FSDP2 (fully_shard)
or tensor parallelism (parallelize_module) has DTensor parameters: each rank saves the boxes of
the global tensors its shards hold, replicas once, and its optimizer state follows its parameter's
placement; its plain tensors (buffers, Adam's step) are the same on every rank and written once.
Any of these loads into any other: another mesh, placements or world size, DDP or one process.

Layout of the state (the tensor paths are what the checkpoint holds):
    model.<name>                        parameters and buffers (model.state_dict() names)
    optim.state.<name>.<key>            tensor optimizer state (exp_avg, step, ...)
    lifeline_torch                      a per-rank object: format version, each tensor's dtype and
                                        global shape, non-tensor optimizer state, param_groups with
                                        their hyperparameters and parameter names
"""

import time as _time
from collections.abc import Mapping as _Mapping

import torch as _torch  # the real torch: imports are absolute

from . import _lifeline
from . import _dtensor
from . import _state
from ._state import Shard

__all__ = ["state_dict", "load", "LoadedStep"]

HEADER = "lifeline_torch"
FORMAT_VERSION = 1

_DTYPE_OF_NAME = {name: dtype for dtype, name in _state._torch_dtype_names().items()}


def _error(code, message):
    e = _lifeline.Error(f"{code}: {message}")
    e.code = code
    return e


class LoadedStep(int):
    """The step load() restored (an int), with `missing_keys` (in the model or optimizer, not in the
    checkpoint) and `unexpected_keys` (in the checkpoint, not in the model or optimizer): both empty
    unless strict=False let the load go on without them."""

    def __new__(cls, step, missing_keys=(), unexpected_keys=()):
        self = super().__new__(cls, step)
        self.missing_keys = list(missing_keys)
        self.unexpected_keys = list(unexpected_keys)
        return self

    def __str__(self):
        return str(int(self))

    def __repr__(self):
        return (f"LoadedStep({int(self)}, missing_keys={self.missing_keys}, "
                f"unexpected_keys={self.unexpected_keys})")


# ---- the model's tensors -------------------------------------------------------------------------------

def _unwrap(model):
    """(module, replica): DDP's wrapped module and this rank's copy (index, count) in its group."""
    if isinstance(model, _torch.nn.parallel.DistributedDataParallel):
        import torch.distributed as dist
        group = model.process_group
        return model.module, (dist.get_rank(group), dist.get_world_size(group))
    return model, None


def _model_tensors(model):
    """(name -> tensor or Shard, replica or None, parameter -> name function for the optimizer, names
    of buffers).

    `model` is an nn.Module (DDP unwrapped) or a mapping name -> tensor / lifeline.Shard for tensors
    the caller has sharded (tensor parallel, ZeRO)."""
    if isinstance(model, _Mapping):
        tensors, replica = dict(model), None
    elif isinstance(model, _torch.nn.Module):
        module, replica = _unwrap(model)
        tensors = dict(module.state_dict())
    else:
        raise TypeError(f"lifeline.torch: model must be an nn.Module or a mapping of names to tensors/Shards, "
                        f"not {type(model).__name__}")
    for name, leaf in tensors.items():
        if not (isinstance(leaf, Shard) or isinstance(leaf, _torch.Tensor)):
            raise TypeError(f"lifeline.torch: model tensor {name!r} is a {type(leaf).__name__}")
    if isinstance(model, _Mapping):
        # The caller's tensors may be detached views of the parameters: the same memory, other objects.
        by_memory = {}
        for name, leaf in tensors.items():
            by_memory.setdefault(_memory(leaf.tensor if isinstance(leaf, Shard) else leaf), name)
        return tensors, replica, lambda p: by_memory.get(_memory(p)), set()
    by_id = {}
    for name, p in module.named_parameters():
        if name in tensors:
            by_id[id(p)] = name
    buffers = {name for name, _ in module.named_buffers() if name in tensors}
    return tensors, replica, lambda p: by_id.get(id(p)), buffers


def _memory(t):
    if _dtensor.is_dtensor(t):
        t = _dtensor.local_tensor(t)
    return (t.device.type, t.device.index, t.data_ptr(), tuple(t.shape), t.dtype)


def _param_names(optimizer, name_of):
    """Each optimizer parameter's name in the model, group by group."""
    groups = []
    for g, group in enumerate(optimizer.param_groups):
        found = []
        for i, p in enumerate(group["params"]):
            name = name_of(p)
            if name is None:
                raise ValueError(f"lifeline.torch: parameter {i} of the optimizer's param group {g} "
                                 f"(shape {tuple(p.shape)}) is not a tensor of the model")
            found.append(name)
        groups.append(found)
    return groups


def _geometry(leaf, path):
    """A tensor's [dtype, global shape] as the checkpoint holds it."""
    t = leaf.tensor if isinstance(leaf, Shard) else leaf
    shape = leaf.global_shape if isinstance(leaf, Shard) else tuple(t.shape)
    return [_state._dtype_name(t, path), [int(d) for d in shape]]


def _like(param_leaf, t, replica):
    """How optimizer state `t` of a parameter is saved and loaded: a piece like the parameter's when
    it is shaped like it, a copy when the model is data parallel, else the whole tensor."""
    if isinstance(param_leaf, Shard):
        if tuple(t.shape) == tuple(param_leaf.tensor.shape) and t.dim() > 0:
            s = param_leaf
            return Shard(t, global_shape=s.global_shape, offsets=s.offsets, flat_range=s.flat_range,
                         shape=s.shape if s.offsets is not None and s.flat_range is not None else None,
                         replica=s.replica)
        if t.dim() == 0:
            # A scalar (Adam's step) is the same on every rank of a sharded job.
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                return Shard(t, replica=(dist.get_rank(), dist.get_world_size()))
        return t
    return Shard(t, replica=replica) if replica is not None else t


# ---- hyperparameters ------------------------------------------------------------------------------------

_TENSOR_TAG = "__torch_tensor__"


def _encode_hyper(v):
    if isinstance(v, _torch.Tensor):  # torch 2.x allows lr, betas, ... as tensors
        return {_TENSOR_TAG: [_state._dtype_name(v, "param_groups"), v.tolist()]}
    return v


def _decode_hyper(v, current):
    if isinstance(v, dict) and _TENSOR_TAG in v:
        dtype, value = v[_TENSOR_TAG]
        device = current.device if isinstance(current, _torch.Tensor) else "cpu"
        v = _torch.tensor(value, dtype=_DTYPE_OF_NAME[dtype], device=device)
    if isinstance(current, _torch.Tensor) and isinstance(v, _torch.Tensor) and current.shape == v.shape:
        current.copy_(v)  # keep the tensor objects the optimizer (or a compiled step) holds
        return current
    return v


# ---- saving -----------------------------------------------------------------------------------------------

def state_dict(model, optimizer=None):
    """The state of `model` (and `optimizer`) for ckpt.save(step, state).

    `model`: an nn.Module, a DistributedDataParallel one (its parameters and the optimizer's state
    become replicas of its process group, written once; its buffers are saved from the group's
    rank 0, whose buffers DDP broadcasts), or a mapping name -> tensor / lifeline.Shard for
    models the caller shards itself (optimizer state shaped like a Shard parameter is saved as the
    same piece of its own global tensor). Tensors are not copied: save them before they change
    (lifeline.guard_optimizer)."""
    tensors, replica, name_of, buffers = _model_tensors(model)
    header = {"version": FORMAT_VERSION, "model": {}}
    model_state = {}
    for name, leaf in tensors.items():
        header["model"][name] = _geometry(leaf, f"model.{name}")
        if replica is None or isinstance(leaf, Shard):
            model_state[name] = leaf
        elif name not in buffers:
            model_state[name] = Shard(leaf, replica=replica)
        elif replica[0] == 0:
            # DDP broadcasts rank 0's buffers at every forward (BatchNorm statistics drift apart on
            # the other ranks in between): rank 0's are the model's, so rank 0 alone saves them.
            model_state[name] = leaf
    state = {"model": model_state}
    if optimizer is not None:
        groups = _param_names(optimizer, name_of)
        optim_state, described = {}, {}
        for group, group_names in zip(optimizer.param_groups, groups):
            for p, name in zip(group["params"], group_names):
                saved = optimizer.state.get(p)
                if not saved:
                    continue
                tensors_of, described[name] = {}, {}
                for key, v in saved.items():
                    if not isinstance(key, str):
                        raise TypeError(f"lifeline.torch: optimizer state key {key!r} of {name!r} is not a string")
                    if isinstance(v, _torch.Tensor):
                        leaf = _like(tensors[name], v, replica)
                        tensors_of[key] = leaf
                        described[name][key] = ["tensor"] + _geometry(leaf, f"optim.state.{name}.{key}")
                    else:
                        described[name][key] = ["value", v]
                if tensors_of:
                    optim_state[name] = tensors_of
        header["optim"] = {
            "type": type(optimizer).__name__,
            "state": described,
            "param_groups": [dict({k: _encode_hyper(v) for k, v in group.items() if k != "params"},
                                  params=group_names)
                             for group, group_names in zip(optimizer.param_groups, groups)],
        }
        if optim_state:
            state["optim"] = {"state": optim_state}
    state[HEADER] = header
    return state


# ---- loading ----------------------------------------------------------------------------------------------

def _header(ckpt, candidate):
    """(the loaded step's result without tensors, its lifeline_torch header), or None: no checkpoint."""
    head = ckpt._impl.load(candidate, [], None)
    if head is None:
        return None
    objects = dict(head["objects"])
    if HEADER not in objects:  # a rank the saving job did not have: rank 0's header describes the same model
        objects = dict(ckpt._impl.load(head["step"], [], 0)["objects"])
    if HEADER not in objects:
        raise _error("NotInCheckpoint", f"{ckpt.directory}: the object {HEADER!r} is not in the checkpoint of step "
                                 f"{head['step']}: it was not saved from lifeline.torch.state_dict (load it with "
                                 f"ckpt.load and the state it was saved with)")
    header = _state.decode_object(HEADER, objects[HEADER])
    if header.get("version") != FORMAT_VERSION:
        raise _error("InvalidArgument", f"{ckpt.directory}: step {head['step']} holds lifeline.torch format "
                                        f"{header.get('version')}; this version reads {FORMAT_VERSION}")
    return head, header


class _Plan:
    """What one checkpoint's header says to load into the model and optimizer, and what does not match."""

    def __init__(self, header, tensors, optimizer, name_of):
        self.missing, self.unexpected, self.mismatched = [], [], []
        self.targets = {"model": {}}
        self.optim_state = {}   # parameter -> its new state, installed once the load succeeded
        self.groups = []        # (param group, saved hyperparameters)
        saved_model = header["model"]
        for name, leaf in tensors.items():
            if name not in saved_model:
                self.missing.append(f"model.{name}")
            elif _geometry(leaf, f"model.{name}") != saved_model[name]:
                self.mismatched.append(f"model.{name}: the checkpoint holds {self._describe(saved_model[name])}, "
                                       f"the model {self._describe(_geometry(leaf, f'model.{name}'))}")
            else:
                self.targets["model"][name] = leaf
        self.unexpected += [f"model.{name}" for name in saved_model if name not in tensors]
        if optimizer is not None:
            self._plan_optimizer(header, tensors, optimizer, name_of)

    @staticmethod
    def _describe(geometry):
        return f"{geometry[0]} {list(geometry[1])}"

    def _plan_optimizer(self, header, tensors, optimizer, name_of):
        saved = header.get("optim")
        if saved is None:
            self.missing.append("optim")
            return
        if saved["type"] != type(optimizer).__name__:
            self.mismatched.append(f"optim: the checkpoint holds the state of {saved['type']}, the optimizer is "
                                   f"{type(optimizer).__name__}")
            return
        mine = _param_names(optimizer, name_of)
        saved_groups = saved["param_groups"]
        if len(saved_groups) != len(mine):
            self.mismatched.append(f"optim.param_groups: the checkpoint holds {len(saved_groups)} groups, "
                                   f"the optimizer {len(mine)}")
            return
        for i, (group, group_names, saved_group) in enumerate(zip(optimizer.param_groups, mine, saved_groups)):
            saved_names = set(saved_group["params"])
            self.missing += [f"optim.param_groups.{i}.{n}" for n in group_names if n not in saved_names]
            self.unexpected += [f"optim.param_groups.{i}.{n}" for n in saved_group["params"]
                                if n not in set(group_names)]
            self.groups.append((group, saved_group))
            for p, name in zip(group["params"], group_names):
                if name not in saved_names or name not in tensors:
                    continue
                self.optim_state[p] = self._state_of(p, name, group, tensors[name], saved["state"].get(name, {}),
                                                     optimizer.state.get(p) or {})

    def _state_of(self, p, name, group, param_leaf, described, current):
        """The parameter's new optimizer state: its tensors made (or reused) to be loaded into."""
        new = {}
        for key, d in described.items():
            if d[0] == "value":
                new[key] = d[1]
                continue
            dtype, shape = _DTYPE_OF_NAME.get(d[1]), list(d[2])
            if dtype is None:
                self.mismatched.append(f"optim.state.{name}.{key}: dtype {d[1]} has no torch dtype here")
                continue
            if _dtensor.is_dtensor(p) and shape == list(p.shape):
                # State shaped like a DTensor parameter is a DTensor placed as the parameter is.
                t = current.get(key)
                if not (_dtensor.is_dtensor(t) and t.dtype == dtype and t.shape == p.shape
                        and t.placements == p.placements and t.device_mesh == p.device_mesh):
                    t = _torch.zeros_like(p, dtype=dtype, requires_grad=False)
                new[key] = t
                self.targets.setdefault("optim", {"state": {}})["state"].setdefault(name, {})[key] = t
                continue
            # State shaped like a sharded parameter is the same piece of its own global tensor.
            sharded = isinstance(param_leaf, Shard) and len(shape) > 0 and shape == list(param_leaf.global_shape)
            local = list(param_leaf.tensor.shape) if sharded else shape
            # A scalar (Adam's step) is on the host unless the optimizer keeps it on the device.
            on_device = len(shape) > 0 or group.get("capturable") or group.get("fused")
            device = p.device if on_device else _torch.device("cpu")
            t = current.get(key)
            if not (isinstance(t, _torch.Tensor) and t.dtype == dtype and list(t.shape) == local
                    and t.device == device):
                t = _torch.zeros(local, dtype=dtype, device=device)
            new[key] = t
            leaf = _like(param_leaf, t, None) if sharded else t
            self.targets.setdefault("optim", {"state": {}})["state"].setdefault(name, {})[key] = leaf
        return new

    def install(self, optimizer):
        """Puts the loaded state and the hyperparameters into the optimizer."""
        for group, saved_group in self.groups:
            for p in group["params"]:
                if self.optim_state.get(p):
                    optimizer.state[p] = self.optim_state[p]
                else:  # the checkpoint holds no state for it (not stepped yet, or an optimizer that
                    # keeps none, as torch 2.x's SGD without momentum): as a fresh optimizer
                    optimizer.state.pop(p, None)
            for key, value in saved_group.items():
                if key != "params":
                    group[key] = _decode_hyper(value, group.get(key))


def load(ckpt, model, optimizer=None, *, strict=True, step=None, required=False):
    """Loads a lifeline.torch.state_dict checkpoint into `model` and `optimizer` in place.

    `model` as for state_dict (plain or DDP, whichever was saved). `optimizer` may be freshly
    constructed: its state is made from what the checkpoint holds for each parameter name, and the
    param_groups' hyperparameters (lr, betas, weight_decay, ...) are set from the checkpoint. Loads
    `step`, or the newest complete checkpoint every rank can load (passing over damaged ones, as
    ckpt.load does). Returns a LoadedStep (the step, an int), or None when there is no checkpoint;
    required=True raises lifeline.Error NotFound naming the directory instead.

    strict=True raises lifeline.Error InvalidArgument listing every missing and every unexpected
    key, before anything is loaded; strict=False loads the keys both sides have and reports the
    others in the result's missing_keys / unexpected_keys. A dtype or shape mismatch always raises."""
    ckpt._load_began = _time.monotonic()  # the agent's account of a restart times the load
    tensors, _replica, name_of, _buffers = _model_tensors(model)
    plans = {}

    def attempt(candidate):
        found = _header(ckpt, candidate)
        if found is None:
            return None
        head, header = found
        plan = _Plan(header, tensors, optimizer, name_of)
        plans[head["step"]] = plan
        if plan.mismatched or (strict and (plan.missing or plan.unexpected)):
            return head  # nothing loaded; reported below, on this rank
        targets = _state.LoadTargets(plan.targets)
        result = ckpt._impl.load(head["step"], targets.specs, None)
        targets.finish()
        result["skipped"] = head["skipped"] + result["skipped"]
        result["objects"] = head["objects"]
        return result

    if step is None and not ckpt._pinned:
        result = ckpt._load_agreed(None, None, attempt)
    else:
        result = attempt(None if step is None else int(step))
    if result is None:
        return ckpt._loaded(None, [], required)
    plan = plans[result["step"]]
    if plan.mismatched or (strict and (plan.missing or plan.unexpected)):
        problems = []
        if plan.missing:
            problems.append(f"missing (in the model or optimizer, not in the checkpoint): {', '.join(plan.missing)}")
        if plan.unexpected:
            problems.append(f"unexpected (in the checkpoint, not in the model or optimizer): "
                            f"{', '.join(plan.unexpected)}")
        if plan.mismatched:
            problems.append(f"mismatched: {'; '.join(plan.mismatched)}")
        raise _error("InvalidArgument", f"{ckpt.directory}: step {result['step']} does not fit the model"
                                        f"{' and optimizer' if optimizer is not None else ''}, nothing was loaded: "
                                        + "; ".join(problems)
                                        + ("" if plan.mismatched else " (strict=False loads the keys both have)"))
    if optimizer is not None:
        plan.install(optimizer)
    loaded = ckpt._loaded(result, [], required)
    return LoadedStep(loaded, plan.missing, plan.unexpected)

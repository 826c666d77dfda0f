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
DTensors on a slice of the job (a module outside tensor parallelism, pipeline stages that each hold
their own layers under the model's names, HSDP or expert parallelism on a slice) are saved too:
the ranks agree once which of them hold each name (collective: the first state_dict, save and load
of a model of such a structure run on every rank together), each copy is written once, and a
pipeline's stages are loaded as one model (or a stage loads its own layers from any layout).

Layout of the state (the tensor paths are what the checkpoint holds):
    model.<name>                        parameters and buffers (model.state_dict() names)
    optim.state.<name>.<key>            tensor optimizer state (exp_avg, step, ...)
    lifeline_torch                      a per-rank object: format version, each tensor's dtype and
                                        global shape, non-tensor optimizer state, param_groups with
                                        their hyperparameters and parameter names; "parts": the
                                        ranks whose objects together describe the model, when the
                                        ranks hold different parts of it (pipeline stages);
                                        "ddp_buckets": a DDP model's gradient buckets (parameter
                                        names, bucket by bucket) once DDP has rebuilt them, which
                                        load() gives a fresh DDP (see "DDP's gradient buckets")
"""

import json as _json
import operator as _operator
import time as _time
import weakref as _weakref
from collections.abc import Mapping as _Mapping

import torch as _torch  # the real torch: imports are absolute

from . import _lifeline
from . import skip_steps as _skip_steps
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
    unless strict=False let the load go on without them; and `skip_steps`, the steps whose data
    this launch must skip after a rollback of lifeline-agent (lifeline.skip_steps(), a StepSet)."""

    def __new__(cls, step, missing_keys=(), unexpected_keys=(), skip_steps=None):
        self = super().__new__(cls, step)
        self.missing_keys = list(missing_keys)
        self.unexpected_keys = list(unexpected_keys)
        self.skip_steps = skip_steps if skip_steps is not None else _skip_steps()
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


def _model_tensors(model, keep_vars=False):
    """(name -> tensor or Shard, replica or None, parameter -> name function for the optimizer, names
    of buffers).

    `model` is an nn.Module (DDP unwrapped) or a mapping name -> tensor / lifeline.Shard for tensors
    the caller has sharded (tensor parallel, ZeRO). keep_vars: the module's parameters themselves
    (the same objects at every call; detaching thousands costs milliseconds), for saving."""
    if isinstance(model, _Mapping):
        tensors, replica = dict(model), None
    elif isinstance(model, _torch.nn.Module):
        module, replica = _unwrap(model)
        tensors = dict(module.state_dict(keep_vars=keep_vars))
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
    (lifeline.guard_optimizer).

    Called again for an nn.Module whose tensors and optimizer state are the same objects as at the
    last call, it returns a new dict holding the same "model" and "optim" containers and leaves
    (only the header is made anew, for the hyperparameters): with thousands of tensors, this is
    what keeps the state dict and ckpt.save within milliseconds. Do not mutate those containers."""
    inputs = _StateInputs.read(model, optimizer)
    cached = _states.get(model) if inputs is not None else None
    if cached is None or not cached.inputs.same_as(inputs):
        state, groups = _fresh_state_dict(model, optimizer, inputs is not None)
        if inputs is None:
            return state
        cached = _states[model] = _CachedState(inputs, state, groups)
    state = {k: v for k, v in cached.state.items() if k != HEADER}
    state[HEADER] = cached.header(model, optimizer)
    return state


def _fresh_state_dict(model, optimizer, keep_vars):
    """state_dict built from scratch, and the optimizer's parameter names by group (or None)."""
    tensors, replica, name_of, buffers = _model_tensors(model, keep_vars)
    groups = None
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
    layout = _job_layout(model_state)
    if layout is not None and len(layout.parts) > 1:
        header["parts"] = layout.parts
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
    _record_ddp_buckets(model, header)
    state[HEADER] = header
    return state, groups


class _StateInputs:
    """What state_dict reads of a module and its optimizer, compared by identity from call to call:
    the module's tensors (keep_vars), its DDP replica, the optimizer's parameters and state."""

    __slots__ = ("names", "tensors", "replica", "params", "keys", "values")

    @classmethod
    def read(cls, model, optimizer):
        if not isinstance(model, _torch.nn.Module):
            return None  # a mapping the caller built: nothing to compare with
        self = cls()
        module, self.replica = _unwrap(model)
        tensors = module.state_dict(keep_vars=True)
        self.names, self.tensors = list(tensors), list(tensors.values())
        self.params, self.keys, self.values = [], [], []
        if optimizer is not None:
            state = optimizer.state
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self.params.append(p)
                    saved = state.get(p)
                    if saved:
                        self.keys.append(list(saved))
                        self.values += saved.values()
                    else:
                        self.keys.append(None)
        return self

    def same_as(self, other):
        if self.names != other.names or self.replica != other.replica or self.keys != other.keys:
            return False
        if not (all(map(_operator.is_, self.tensors, other.tensors)) and all(map(_operator.is_, self.params, other.params))):
            return False
        if all(map(_operator.is_, self.values, other.values)):
            return True
        # Non-tensor optimizer state (an iteration count) may be another object of equal value.
        return all(a is b or (not isinstance(a, _torch.Tensor) and not isinstance(b, _torch.Tensor) and a == b)
                   for a, b in zip(self.values, other.values))


class _CachedState:
    """The last state_dict of a module: its containers, and the header's parts that follow from its
    structure, with their encodings (_Header)."""

    def __init__(self, inputs, state, groups):
        self.inputs, self.groups = inputs, groups
        self.state = {k: (v if k == HEADER else _state.shared(v)) for k, v in state.items()}
        header = state[HEADER]
        self.fixed = {k: v for k, v in header.items() if k not in ("optim", "ddp_buckets")}
        self.optim = header.get("optim")
        self.texts = {}  # _Header's encodings of the large parts, by tag

    def header(self, model, optimizer):
        header = _Header(self.fixed)
        header.texts = self.texts
        if self.optim is not None:
            header["optim"] = dict(self.optim, param_groups=[
                dict({k: _encode_hyper(v) for k, v in group.items() if k != "params"}, params=names)
                for group, names in zip(optimizer.param_groups, self.groups)])
        _record_ddp_buckets(model, header)
        return header


_states = _weakref.WeakKeyDictionary()  # module -> _CachedState


class _Header(dict):
    """The lifeline_torch header, a dict, whose per-rank object encoding (_state.encode_object)
    reuses the encoding of its large parts (every tensor's geometry, the optimizer state's
    description, each param group's parameter names, DDP's bucket layout) while they are the same
    objects: only the hyperparameters are encoded anew."""

    _SENTINEL = "\x00lifeline-encoded:{}\x00"
    texts = None  # tag -> (the part, its encoding), shared by the headers of one module

    def _lifeline_encode(self):
        if self.texts is None:
            self.texts = {}
        # (tag, the container in the header, its copy in `shallow`, key): the parts encoded once.
        shallow = dict(self)
        parts = [(key, self, shallow, key) for key in ("model", "ddp_buckets") if key in self]
        optim = self.get("optim")
        if isinstance(optim, dict) and "state" in optim:
            shallow["optim"] = dict(optim)
            parts.append(("state", optim, shallow["optim"], "state"))
            groups = optim.get("param_groups")
            if isinstance(groups, list):
                shallow["optim"]["param_groups"] = [dict(g) for g in groups]
                parts += [(f"params{i}", g, shallow["optim"]["param_groups"][i], "params")
                          for i, g in enumerate(groups) if isinstance(g, dict) and "params" in g]
        for tag, _container, copy, key in parts:
            copy[key] = self._SENTINEL.format(tag)
        text = _state.encode_object(HEADER, shallow).decode("utf-8")
        for tag, container, _copy, key in parts:
            value = container[key]
            cached = self.texts.get(tag)
            if cached is None or cached[0] is not value:
                cached = self.texts[tag] = (value, _state.encode_object(HEADER, value).decode("utf-8"))
            text = text.replace(_json.dumps(self._SENTINEL.format(tag)), cached[1], 1)
        return text.encode("utf-8")


def _job_layout(model_tensors):
    """The job's agreement on the model's names (_dtensor.job_layout) when the model holds DTensors
    on a slice of the job, else None. Collective the first time a model of this structure is seen."""
    if not any(_dtensor.is_dtensor(t) for t in model_tensors.values()):
        return None
    return _dtensor.job_layout([("model." + name, leaf) for name, leaf in model_tensors.items()])


# ---- loading ----------------------------------------------------------------------------------------------

def _header(ckpt, candidate):
    """(the loaded step's result without tensors, its lifeline_torch header), or None: no checkpoint."""
    head = ckpt._impl.load(candidate, [], None)
    if head is None:
        return None
    objects, own = dict(head["objects"]), ckpt.rank
    if HEADER not in objects:  # a rank the saving job did not have: rank 0's header describes the same model
        objects, own = _objects_of(ckpt, head["step"], 0), 0
    if HEADER not in objects:
        raise _error("NotInCheckpoint", f"{ckpt.directory}: the object {HEADER!r} is not in the checkpoint of step "
                                 f"{head['step']}: it was not saved from lifeline.torch.state_dict (load it with "
                                 f"ckpt.load and the state it was saved with)")
    header = _decode_header(ckpt, head["step"], objects[HEADER], own)
    # The saving ranks held different parts of the model (pipeline stages): each part's header.
    others = [int(r) for r in header.get("parts", ()) if int(r) != own]
    if others:
        header = _merge_headers(ckpt, head["step"], header,
                                [_decode_header(ckpt, head["step"], _objects_of(ckpt, head["step"], r).get(HEADER), r)
                                 for r in others])
    return head, header


def _objects_of(ckpt, step, rank):
    """The per-rank objects saved by `rank` in step `step`, by name."""
    return dict(ckpt._impl.load(step, [], rank)["objects"])


def _decode_header(ckpt, step, data, rank=None):
    if data is None:
        raise _error("Corruption", f"{ckpt.directory}: step {step} holds no {HEADER!r} object of rank {rank}, "
                                   f"which holds a part of the model")
    header = _state.decode_object(HEADER, data)
    if header.get("version") != FORMAT_VERSION:
        raise _error("InvalidArgument", f"{ckpt.directory}: step {step} holds lifeline.torch format "
                                        f"{header.get('version')}; this version reads {FORMAT_VERSION}")
    return header


def _merge_headers(ckpt, step, header, others):
    """One header describing the model whose parts `header` and `others` (the other parts' headers)
    describe: every tensor, the optimizer state of every parameter, and each param group's
    parameters in part order (the hyperparameters of `header`'s groups)."""
    merged = dict(header, model=dict(header["model"]))
    optim = header.get("optim")
    if optim is not None:
        optim = merged["optim"] = dict(optim, state=dict(optim["state"]),
                                       param_groups=[dict(g, params=list(g["params"])) for g in optim["param_groups"]])
    for other in others:
        for name, geometry in other["model"].items():
            merged["model"].setdefault(name, geometry)
        theirs = other.get("optim")
        if theirs is None:
            continue
        if optim is None:
            optim = merged["optim"] = dict(theirs, state=dict(theirs["state"]),
                                           param_groups=[dict(g, params=list(g["params"]))
                                                         for g in theirs["param_groups"]])
            continue
        if theirs["type"] != optim["type"] or len(theirs["param_groups"]) != len(optim["param_groups"]):
            raise _error("InvalidArgument", f"{ckpt.directory}: step {step}: the parts of the model hold the states "
                                            f"of different optimizers ({optim['type']} with "
                                            f"{len(optim['param_groups'])} param groups, {theirs['type']} with "
                                            f"{len(theirs['param_groups'])}): load it with strict=False part by part")
        for name, described in theirs["state"].items():
            optim["state"].setdefault(name, described)
        for group, their_group in zip(optim["param_groups"], theirs["param_groups"]):
            have = set(group["params"])
            group["params"] += [n for n in their_group["params"] if n not in have]
    return merged


class _Plan:
    """What one checkpoint's header says to load into the model and optimizer, and what does not match."""

    def __init__(self, header, tensors, optimizer, name_of, elsewhere=frozenset()):
        # elsewhere: names other ranks of the loading job hold and this one does not (pipeline
        # stages): in the checkpoint and not here, they are not unexpected.
        self.elsewhere = elsewhere
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
        self.unexpected += [f"model.{name}" for name in saved_model if name not in tensors and name not in elsewhere]
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
                                if n not in set(group_names) and n not in self.elsewhere]
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
    required=True raises lifeline.Error NotFound naming the directory instead. A DDP model that has
    not rebuilt its gradient buckets in this process gets the buckets its saver had rebuilt, so
    that its next step reduces gradients as the saver's next step would have (bit for bit).

    strict=True raises lifeline.Error InvalidArgument listing every missing and every unexpected
    key, before anything is loaded; strict=False loads the keys both sides have and reports the
    others in the result's missing_keys / unexpected_keys. A dtype or shape mismatch always raises."""
    ckpt._load_began = _time.monotonic()  # the agent's account of a restart times the load
    tensors, _replica, name_of, _buffers = _model_tensors(model)
    layout = _job_layout(tensors)
    elsewhere = frozenset()
    if layout is not None:
        elsewhere = frozenset(p[len("model."):] for p in layout.paths if p.startswith("model.")) - set(tensors)
    plans = {}

    def attempt(candidate):
        found = _header(ckpt, candidate)
        if found is None:
            return None
        head, header = found
        plan = _Plan(header, tensors, optimizer, name_of, elsewhere)
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
    _restore_ddp_buckets(ckpt, model, result)
    loaded = ckpt._loaded(result, [], required)
    return LoadedStep(loaded, plan.missing, plan.unexpected)


# ---- DDP's gradient buckets -------------------------------------------------------------------------------
#
# DDP reduces gradients in flat buckets. It lays them out first from the parameters' order, and
# after its first backward once more, in the order the gradients became ready ("rebuilt" buckets,
# the same on every rank: rank 0's). gloo's ring allreduce adds the ranks' values of an element in
# an order that depends on where the element lies in its bucket; with more than 2 ranks
# ((a+b)+c)+d and ((c+d)+a)+b differ in the last bits. A relaunched process would reduce its first
# step in the first layout, where the process it replaces reduced that step in the rebuilt one: the
# job goes on with other bits. So the rebuilt layout is saved with the model (header "ddp_buckets")
# and a load into a fresh DDP lays its buckets out the same way before its first step.

def _ddp_parameters(ddp):
    """(parameter, name, sparse gradient) in the order of DDP's reducer: its _build_params_for_reducer
    without the side effect (module by module, parameters that require grad and are not ignored,
    once each)."""
    ignored = getattr(ddp, "parameters_to_ignore", ())
    seen, found = set(), []
    for module_name, module in ddp.module.named_modules():
        sparse = isinstance(module, (_torch.nn.Embedding, _torch.nn.EmbeddingBag)) and bool(module.sparse)
        for param_name, p in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            if p.requires_grad and f"{module_name}.{param_name}" not in ignored and id(p) not in seen:
                seen.add(id(p))
                found.append((p, name, sparse))
    return found


def _ddp_bucket_layout(ddp):
    """The parameter names of each gradient bucket of DDP `ddp` once it has rebuilt its buckets
    (or had them laid out by a load), else None. Read from DDP's logging data once per reducer."""
    known = getattr(ddp, "_lifeline_rebuilt_buckets", None)
    if known is not None and known[0] is ddp.reducer:
        return known[1]
    logging = getattr(ddp, "_get_ddp_logging_data", None)
    if logging is None or getattr(ddp, "logger", None) is None:
        return None
    info = logging()
    if not info.get("rebuilt_per_bucket_param_indices") and getattr(ddp, "_has_rebuilt_buckets", False):
        # Rebuilt in this step's forward: DDP logs the layout at its next forward. Within its first
        # 10 iterations, as here, DDP logs at every forward: this is one more of those.
        log = getattr(ddp.logger, "set_runtime_stats_and_log", None)
        if log is not None:
            log()
            info = logging()
    indices = info.get("rebuilt_per_bucket_param_indices")
    if not indices:
        return getattr(ddp, "_lifeline_buckets", None)  # laid out by a load, not rebuilt since
    names = [name for _p, name, _sparse in _ddp_parameters(ddp)]
    try:
        layout = [[names[int(i)] for i in bucket.split()] for bucket in indices.split(",")]
    except (ValueError, IndexError):
        return None
    if sorted(n for bucket in layout for n in bucket) != sorted(names):
        return None
    ddp._lifeline_rebuilt_buckets = (ddp.reducer, layout)  # DDP rebuilds once per reducer
    return layout


def _record_ddp_buckets(model, header):
    """Puts DDP `model`'s rebuilt bucket layout into the lifeline_torch header (`ddp_buckets`)."""
    if isinstance(model, _torch.nn.parallel.DistributedDataParallel):
        layout = _ddp_bucket_layout(model)
        if layout is not None:
            header["ddp_buckets"] = layout


def _restore_ddp_buckets(ckpt, model, result):
    """Lays out DDP `model`'s gradient buckets as the checkpoint loaded in `result` says its saver
    had them (`ddp_buckets`), so that the model's next backward reduces as the saver's would have.
    Every rank decides alike: a rank the saving job did not have takes rank 0's header."""
    if not isinstance(model, _torch.nn.parallel.DistributedDataParallel):
        return False
    objects = dict(result["objects"])
    if HEADER not in objects:
        objects = dict(ckpt._impl.load(result["step"], [], 0)["objects"])
    layout = _state.decode_object(HEADER, objects[HEADER]).get("ddp_buckets") if HEADER in objects else None
    return bool(layout) and _lay_out_ddp_buckets(model, layout)


def _lay_out_ddp_buckets(ddp, layout):
    """Gives DDP `ddp` a reducer whose buckets hold the parameters named in `layout`, bucket by
    bucket, unless it rebuilt its buckets in this process already, its reducer is not DDP's plain
    one (a communication hook, mixed precision, the Python reducer) or it never rebuilds
    (find_unused_parameters without static_graph). Returns whether it did. The new reducer
    rebuilds after its first backward as DDP's does, into the same layout."""
    import torch.distributed as dist
    if getattr(ddp, "_has_rebuilt_buckets", True) or getattr(ddp, "reducer", None) is None:
        return False
    if (getattr(ddp, "_use_python_reducer", False) or getattr(ddp, "_delay_all_reduce_all_params", False)
            or getattr(ddp, "mixed_precision", None) is not None
            or (ddp.find_unused_parameters and not ddp.static_graph)
            or getattr(ddp, "_comm_hooks", None) or ddp._get_ddp_logging_data().get("comm_hook")):
        return False
    named = _ddp_parameters(ddp)
    index = {name: i for i, (_p, name, _sparse) in enumerate(named)}
    if sorted(n for bucket in layout for n in bucket) != sorted(index):
        return False  # another model: DDP's own layout
    params = [p for p, _name, _sparse in named]
    buckets = [[index[n] for n in bucket] for bucket in layout]
    config = getattr(ddp, "_bucket_config", None)
    first = getattr(config, "first_bucket_bytes_cap", dist._DEFAULT_FIRST_BUCKET_BYTES)
    optional = {"first_bucket_bytes_cap": first,
                "skip_all_reduce_unused_params": getattr(ddp, "skip_all_reduce_unused_params", None),
                "batched_grad_copy": getattr(ddp, "batched_grad_copy", None)}
    if config is not None and hasattr(config, "compute_bucket_size_limits"):
        optional["bucket_bytes_cap_list"] = config.compute_bucket_size_limits(
            static_graph=ddp.static_graph, find_unused_parameters=ddp.find_unused_parameters)[1]
    accepted = dist.Reducer.__init__.__doc__ or ""
    kwargs = {k: v for k, v in optional.items() if v is not None and f"{k}:" in accepted}
    reducer = dist.Reducer(params, buckets, [first] + [ddp.bucket_bytes_cap] * (len(buckets) - 1),
                           ddp.process_group, [sparse for _p, _name, sparse in named], ddp.bucket_bytes_cap,
                           ddp.find_unused_parameters, ddp.gradient_as_bucket_view,
                           ddp._build_debug_param_to_name_mapping(params), **kwargs)
    remove = getattr(ddp.reducer, "_remove_autograd_hooks", None)
    if remove is not None:
        remove()  # else the old reducer's destructor removes them, once the logger lets it go
    ddp.reducer = reducer
    ddp.logger = dist.Logger(reducer)
    reducer.set_logger(ddp.logger)
    ddp.logger.set_construction_data_and_log(
        ddp.module.__class__.__name__, [] if ddp.device_ids is None else ddp.device_ids,
        -1 if ddp.output_device is None else ddp.output_device, ddp.broadcast_buffers,
        any(isinstance(m, _torch.nn.SyncBatchNorm) for m in ddp.module.modules()), ddp.static_graph)
    if ddp.static_graph:
        reducer._set_static_graph()
        ddp.logger._set_static_graph()
    ddp._lifeline_buckets = [list(bucket) for bucket in layout]
    return True

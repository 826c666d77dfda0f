"""Walking a training state: tensors and Shards become tensor descriptions, the rest per-rank objects.

A state is a tree of dicts, lists and tuples. Its leaves are:
  * tensors (torch, or numpy arrays), DTensors (as the boxes of their global tensor their local
    tensors hold: lifeline/_dtensor.py) and lifeline.Shard: saved in Lifeline's sharded format, by
    the path of the leaf ("model.layers.0.weight", "optim.3.exp_avg"), zero-copy;
  * everything else (numbers, strings, bytes, None, and containers holding no tensor): a per-rank
    object stored under its path, encoded as tagged JSON. Never pickle: loading a checkpoint must
    not run code from it (DCP's bytes items, torch.save bytes, are read with weights_only=True).
Paths join dict keys (str or int) and list indices with ".".
"""

import base64
import io
import json
import math
import sys

from . import _dtensor
from . import _lifeline


def _module(name):
    """torch or numpy when the program has imported it, else None. A tensor or array of theirs can
    exist only then, so `import lifeline` never imports either (torch costs about a second, which
    the lifeline commands installed by pip would pay at every start)."""
    return sys.modules.get(name)


def _is_torch(x):
    torch = _module("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_numpy(x):
    numpy = _module("numpy")
    return numpy is not None and isinstance(x, numpy.ndarray)


class Shard:
    """A piece of a global tensor held by this rank.

    Shard(t, global_shape=G, offsets=O)             a block of G at offsets O, of t's shape (tensor parallel)
    Shard(t, global_shape=G, flat_range=(b, e))     elements [b, e) of G flattened (ZeRO / FSDP)
    Shard(t, global_shape=G, offsets=O, shape=S, flat_range=(b, e))
                                                   elements [b, e) of the block (O, S) flattened
    Shard(t, ..., replica=(i, n))                   copy i of n identical copies (data parallel):
                                                   written once, by a replica every rank picks alike
    With neither offsets nor flat_range, t is the whole tensor (global_shape defaults to t's shape).
    """

    __slots__ = ("tensor", "global_shape", "offsets", "shape", "flat_range", "replica")

    def __init__(self, tensor, global_shape=None, offsets=None, flat_range=None, replica=None, shape=None):
        tshape = tuple(int(d) for d in tensor.shape)
        numel = _numel(tshape)
        self.tensor = tensor
        self.global_shape = tuple(int(d) for d in (global_shape if global_shape is not None else tshape))
        self.offsets = tuple(int(o) for o in offsets) if offsets is not None else None
        self.flat_range = (int(flat_range[0]), int(flat_range[1])) if flat_range is not None else None
        if replica is None:
            replica = (0, 1)
        self.replica = (int(replica[0]), int(replica[1]))
        if not 0 <= self.replica[0] < self.replica[1]:
            raise ValueError(f"Shard: replica={replica} must be (index, count) with 0 <= index < count")
        if self.offsets is not None and len(self.offsets) != len(self.global_shape):
            raise ValueError(f"Shard: offsets {self.offsets} and global_shape {self.global_shape} differ in rank")
        if self.flat_range is None:
            # The tensor is the block itself (or the whole tensor).
            if shape is not None and tuple(shape) != tshape:
                raise ValueError(f"Shard: shape={tuple(shape)} differs from the tensor's shape {tshape}")
            self.shape = tshape if self.offsets is not None else self.global_shape
            if self.offsets is None and tshape != self.global_shape and numel != _numel(self.global_shape):
                raise ValueError(f"Shard: a tensor of shape {tshape} without offsets or flat_range must be the "
                                 f"whole global tensor {self.global_shape}")
            if self.offsets is not None and len(tshape) != len(self.global_shape):
                raise ValueError(f"Shard: tensor shape {tshape} and global_shape {self.global_shape} differ in rank")
        else:
            b, e = self.flat_range
            if self.offsets is None:
                self.shape = self.global_shape
            else:
                if shape is None:
                    raise ValueError("Shard: offsets with flat_range needs shape=, the block's shape")
                self.shape = tuple(int(d) for d in shape)
            if not 0 <= b <= e <= _numel(self.shape):
                raise ValueError(f"Shard: flat_range {self.flat_range} outside the {_numel(self.shape)} elements "
                                 f"of the block")
            if e - b != numel:
                raise ValueError(f"Shard: flat_range {self.flat_range} holds {e - b} elements but the tensor has "
                                 f"{numel}")

    def __repr__(self):
        parts = [f"global_shape={self.global_shape}"]
        if self.offsets is not None:
            parts.append(f"offsets={self.offsets}")
        if self.flat_range is not None:
            parts.append(f"flat_range={self.flat_range}")
        if self.replica != (0, 1):
            parts.append(f"replica={self.replica}")
        return f"Shard({', '.join(parts)})"

    def geometry(self):
        """(global_shape, offsets, shape, flat_begin, flat_end) as the C++ TensorShard wants them."""
        offsets = self.offsets if self.offsets is not None else (0,) * len(self.global_shape)
        if self.flat_range is not None:
            b, e = self.flat_range
        else:
            b, e = 0, _numel(self.shape)
        return list(self.global_shape), list(offsets), list(self.shape), b, e


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---- dtypes ----------------------------------------------------------------------------------------

_TORCH_DTYPE_NAMES = [("float64", "f64"), ("float32", "f32"), ("float16", "f16"), ("bfloat16", "bf16"),
                      ("float8_e4m3fn", "f8e4m3"), ("float8_e5m2", "f8e5m2"), ("int64", "i64"), ("int32", "i32"),
                      ("int16", "i16"), ("int8", "i8"), ("uint8", "u8"), ("bool", "bool")]


_torch_dtypes = {}


def _torch_dtype_names():
    """torch dtype -> Lifeline's dtype name, for the dtypes this torch has (made on first use)."""
    if not _torch_dtypes:
        torch = _module("torch")
        _torch_dtypes.update({getattr(torch, name): ll for name, ll in _TORCH_DTYPE_NAMES if hasattr(torch, name)})
    return _torch_dtypes


_NUMPY_DTYPES = {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64", "int32": "i32",
                 "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "bool"}


def is_tensor(x):
    return _is_torch(x) or _is_numpy(x)


def _dtype_name(t, path):
    if _is_torch(t):
        name = _torch_dtype_names().get(t.dtype)
    else:
        name = _NUMPY_DTYPES.get(str(t.dtype))
    if name is None:
        raise TypeError(f"state[{path!r}]: dtype {t.dtype} is not one Lifeline stores "
                        f"(float64/32/16, bfloat16, float8, int64/32/16/8, uint8, bool)")
    return name


def _check_host(t, path):
    """Checks a tensor can be saved; CUDA tensors go through the library's CUDA copy engine."""
    if _is_torch(t):
        if t.device.type not in ("cpu", "cuda"):
            raise TypeError(f"state[{path!r}]: a {t.device.type} tensor; Lifeline snapshots host and CUDA "
                            f"memory (move it with .cpu())")
        if t.device.type == "cuda" and not _lifeline_cuda_built():
            raise TypeError(f"state[{path!r}]: a CUDA tensor, and this build of Lifeline has no CUDA copy engine "
                            f"(rebuild with the CUDA toolkit, LIFELINE_CUDA=ON, or move it with .cpu())")
        if t.is_sparse or t.layout != _module("torch").strided:
            raise TypeError(f"state[{path!r}]: only dense (strided) tensors can be saved")


def _lifeline_cuda_built():
    from . import _lifeline
    return _lifeline.cuda_built()


def _device(t):
    """(device ordinal, producer stream) of a CUDA tensor; (-1, 0) for host memory."""
    if _is_torch(t) and t.device.type == "cuda":
        torch = _module("torch")
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return index, torch.cuda.current_stream(index).cuda_stream
    return -1, 0


def _contiguous(t):
    if _is_torch(t):
        return t if t.is_contiguous() else t.contiguous()
    return t if t.flags["C_CONTIGUOUS"] else _module("numpy").ascontiguousarray(t)


def _address(t):
    if _is_torch(t):
        return t.data_ptr()
    return t.ctypes.data


# ---- walking -----------------------------------------------------------------------------------------

def _has_tensor(x):
    if isinstance(x, Shard) or is_tensor(x):
        return True
    if isinstance(x, dict):
        return any(_has_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(v) for v in x)
    return False


def _join(prefix, key):
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise TypeError(f"state[{prefix!r}]: key {key!r} is a {type(key).__name__}; keys must be str or int")
    if isinstance(key, str):
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate, as os.fsdecode makes of undecodable bytes
            raise ValueError(f"state[{prefix!r}]: key {key!r} is not valid UTF-8 (character {e.start}): names in a "
                             f"checkpoint are UTF-8") from None
    return f"{prefix}.{key}" if prefix else str(key)


class SharedState(dict):
    """A read-only dict of a state that successive calls share (lifeline.torch.state_dict's "model"
    and "optim" containers): flatten walks it once and reuses what it found while it is met at the
    same path. Copies (dict(x), copy.deepcopy, pickling) are plain dicts."""

    __slots__ = ("_flat",)

    def _refuse(self, *_args, **_kwargs):
        raise TypeError("this container of lifeline.torch.state_dict is shared by its calls and read-only: "
                        "make a copy (dict(x)) to change it")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self):
        return (dict, (dict(self),))


def shared(x):
    """`x` with its dicts, nested ones too, made SharedState (the leaves are the same objects)."""
    if isinstance(x, dict):
        return SharedState((k, shared(v)) for k, v in x.items())
    return x


def _leaf_types():
    """The classes of tensor leaves: Shard, and torch's and numpy's tensors when imported."""
    types = [Shard]
    for module, name in (("torch", "Tensor"), ("numpy", "ndarray")):
        cls = getattr(_module(module), name, None)
        if cls is not None:
            types.append(cls)
    return tuple(types)


def flatten(state):
    """(tensors, objects): [(path, leaf)] for every tensor/Shard leaf, and for every object leaf
    (a value that is not a container, or a container holding no tensor), each in walk order.

    One pass, linear in the size of the state: a save of thousands of tensors walks it every time."""
    if not isinstance(state, (dict, list)):
        raise TypeError(f"the state must be a dict or a list, not {type(state).__name__}")
    leaf_types = _leaf_types()
    tensors, objects = [], []

    def visit(x, path):  # True when x holds a tensor
        if isinstance(x, leaf_types):
            tensors.append((path, x))
            return True
        if type(x) is SharedState:
            flat = getattr(x, "_flat", None)
            if flat is None or flat[0] != path:
                t0, o0 = len(tensors), len(objects)
                found = visit(dict(x), path)
                flat = x._flat = (path, tensors[t0:], objects[o0:], found)
                return found
            tensors.extend(flat[1])
            objects.extend(flat[2])
            return flat[3]
        if isinstance(x, dict) and not hasattr(x, "_lifeline_encode"):  # lifeline.torch's header: an object
            items = x.items()
        elif isinstance(x, (list, tuple)):
            items = enumerate(x)
        else:
            objects.append((path, x))
            return False
        mark, found, bad = len(objects), False, None
        for k, v in items:
            # Keys are checked (_join) only in containers that hold tensors, as paths of tensors.
            if type(k) is str and k.isascii() or type(k) is int:
                child = f"{path}.{k}" if path else f"{k}"
            else:
                try:
                    child = _join(path, k)
                except (TypeError, ValueError) as e:
                    child, bad = f"{path}.{k!r}", bad or e
            if visit(v, child):
                found = True
        if found:
            if bad is not None:
                raise bad
            return True
        del objects[mark:]
        if not path:
            raise TypeError("the state must be a dict or list holding tensors")
        objects.append((path, x))
        return False

    visit(state, "")
    return tensors, objects


def walk(state):
    """[(path, leaf)] for every tensor/Shard leaf, then every object leaf (flatten's two lists)."""
    tensors, objects = flatten(state)
    return tensors + objects


def leaves(state, rank=0, world_size=1, found=None):
    """Yields (path, leaf, pieces) for every leaf of `state` in walk order: `pieces` is the list of
    tensors or Shards a tensor leaf is saved from and loaded into (a DTensor's boxes, else the leaf
    itself), None for an object leaf.

    In a state holding DTensors, with world_size > 1, a plain tensor is taken to be the same on every
    rank (an optimizer's step, an unsharded buffer: what DCP assumes of it too) and is marked as one
    of world_size copies, written once. When a DTensor's mesh is smaller than the job, the ranks
    agree which of them hold each path (_dtensor.job_layout: collective the first time a structure
    is seen, then cached) and the replicas are counted among those. `found`: walk(state), when the
    caller has made it."""
    if found is None:
        found = walk(state)
    replicated = world_size > 1 and any(_dtensor.is_dtensor(leaf) for _, leaf in found)
    layout = _dtensor.job_layout(found, rank, world_size) if replicated else None
    for path, leaf in found:
        if _dtensor.is_dtensor(leaf):
            yield path, leaf, _dtensor.pieces(leaf, path, world_size, layout)
        elif isinstance(leaf, Shard) or not is_tensor(leaf):
            yield path, leaf, [leaf] if isinstance(leaf, Shard) else None
        elif replicated:
            yield path, leaf, [Shard(leaf, replica=layout.plain[path] if layout is not None else (rank, world_size))]
        else:
            yield path, leaf, [leaf]


class LoadTargets:
    """The tensors of a state as load targets: `specs` for the C++ load, and finish() to run once
    it has filled them, copying into each target that is not contiguous from the buffer the load
    wrote instead."""

    def __init__(self, state):
        self.specs, self._copies = [], []
        for path, _leaf, parts in leaves(state):
            for piece in parts or ():
                spec, buffer = tensor_spec(path, piece)
                self.specs.append(spec)
                target = piece.tensor if isinstance(piece, Shard) else piece
                if buffer is not target:
                    self._copies.append((target, buffer))

    def finish(self):
        for target, buffer in self._copies:
            if hasattr(target, "copy_"):
                target.copy_(buffer)
            else:
                target[...] = buffer


def tensor_spec(path, leaf):
    """The C++ description of a tensor leaf for saving, and the object whose memory it reads."""
    if isinstance(leaf, Shard):
        t = leaf.tensor
        _check_host(t, path)
        global_shape, offsets, shape, b, e = leaf.geometry()
        ri, rc = leaf.replica
    else:
        t = leaf
        _check_host(t, path)
        global_shape = [int(d) for d in t.shape]
        offsets, shape, b, e = [0] * len(global_shape), list(global_shape), 0, _numel(global_shape)
        ri, rc = 0, 1
    if not is_tensor(t):
        raise TypeError(f"state[{path!r}]: Shard wraps a {type(t).__name__}, not a tensor")
    if _numel(t.shape) != e - b:
        raise ValueError(f"state[{path!r}]: the tensor has {_numel(t.shape)} elements, its Shard describes {e - b}")
    c = _contiguous(t)
    device, stream = _device(c)
    spec = (path, _dtype_name(t, path), global_shape, offsets, shape, b, e, ri, rc, _address(c) if e > b else 0,
            device, stream)
    return spec, c


# ---- per-rank objects: tagged JSON -----------------------------------------------------------------------

def _to_json(x, path):
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        if math.isfinite(x):
            return x
        return {"__float__": repr(x)}
    if isinstance(x, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(x)).decode("ascii")}
    if isinstance(x, tuple):
        return {"__tuple__": [_to_json(v, path) for v in x]}
    if isinstance(x, list):
        return [_to_json(v, path) for v in x]
    if isinstance(x, dict):
        items = []
        for k, v in x.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"state[{path!r}]: dict key {k!r} is a {type(k).__name__}; keys must be str or int")
            items.append([k, _to_json(v, path)])
        return {"__dict__": items}
    if _module("numpy") is not None and isinstance(x, _module("numpy").generic):
        return _to_json(x.item(), path)
    raise TypeError(f"state[{path!r}]: cannot save a {type(x).__name__} (leaves must be tensors, lifeline.Shard, "
                    f"numbers, strings, bytes, None, or lists/tuples/dicts of those)")


def _from_json(j):
    if isinstance(j, list):
        return [_from_json(v) for v in j]
    if isinstance(j, dict):
        if "__tuple__" in j:
            return tuple(_from_json(v) for v in j["__tuple__"])
        if "__dict__" in j:
            return {k: _from_json(v) for k, v in j["__dict__"]}
        if "__bytes__" in j:
            return base64.b64decode(j["__bytes__"])
        if "__float__" in j:
            return float(j["__float__"])
        raise ValueError(f"unknown tag in a stored object: {sorted(j)}")
    return j


def encode_object(path, value):
    encode = getattr(value, "_lifeline_encode", None)  # lifeline.torch's header: parts encoded once
    if encode is not None:
        return encode()
    return json.dumps(_to_json(value, path), separators=(",", ":"), allow_nan=False).encode("utf-8")


_TORCH_SAVE_MAGIC = b"PK\x03\x04"  # torch.save's zip archive; a JSON object never starts so


def is_torch_save(data):
    """Whether a stored object is torch.save bytes (DCP's bytes items) rather than Lifeline's JSON."""
    return bytes(data[:4]) == _TORCH_SAVE_MAGIC


def decode_object(path, data):
    if is_torch_save(data):
        torch = _module("torch") or __import__("torch")
        try:  # weights_only: a checkpoint never runs code of its own (a BytesIO is only bytes)
            safe = getattr(torch.serialization, "safe_globals", None)
            if safe is None:
                return torch.load(io.BytesIO(bytes(data)), weights_only=True)
            with safe([io.BytesIO]):
                return torch.load(io.BytesIO(bytes(data)), weights_only=True)
        except Exception as e:
            raise _lifeline.Error(f"Corruption: per-rank object {path!r} (torch.save bytes, as DCP writes them) "
                                  f"cannot be loaded with weights_only=True: {type(e).__name__}: {e}") from None
    try:
        return _from_json(json.loads(data.decode("utf-8")))
    except (ValueError, UnicodeDecodeError) as e:
        raise _lifeline.Error(f"Corruption: per-rank object {path!r} cannot be decoded: {e}") from None


# ---- restoring ------------------------------------------------------------------------------------------

def restore(state, objects, missing):
    """Puts loaded objects back into `state` in place; tensors were filled by the load already.

    `objects` maps path -> bytes. Object leaves absent from the checkpoint keep their value and are
    listed in `missing`.
    """
    def visit(x, path):
        if isinstance(x, Shard) or is_tensor(x):
            return x
        if isinstance(x, dict) and _has_tensor(x):
            for k in list(x.keys()):
                v = visit(x[k], _join(path, k))
                if v is not x[k]:  # a SharedState holds tensors only: never assigned
                    x[k] = v
            return x
        if isinstance(x, list) and _has_tensor(x):
            for i in range(len(x)):
                x[i] = visit(x[i], _join(path, i))
            return x
        if isinstance(x, tuple) and _has_tensor(x):
            return type(x)(*[visit(v, _join(path, i)) for i, v in enumerate(x)]) if hasattr(x, "_fields") \
                else tuple(visit(v, _join(path, i)) for i, v in enumerate(x))
        if path in objects:
            return decode_object(path, objects[path])
        if isinstance(x, dict) and x and any(name.startswith(path + ".") for name in objects):
            # Saved through DCP, whose planner stores each leaf of a dict on its own.
            for k in list(x.keys()):
                x[k] = visit(x[k], _join(path, k))
            return x
        missing.append(path)
        return x
    if isinstance(state, dict):
        for k in list(state.keys()):
            state[k] = visit(state[k], _join("", k))
    else:
        for i in range(len(state)):
            state[i] = visit(state[i], _join("", i))

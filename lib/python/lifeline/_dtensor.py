"""DTensors (FSDP2, tensor parallel, any DeviceMesh) as pieces of their global tensor.

A DTensor is a view of a global tensor: its mesh, this rank's coordinate in it and its placements
say which elements the local tensor holds. Each tensor dimension is cut by the placements that
shard it, in mesh-dimension order, with torch.chunk's rule (chunks of ceil(n / m), the last ones
shorter or empty):
    Shard(d)                         chunk `coordinate` of the elements held so far along d;
    _StridedShard(d, split_factor=f) (FSDP2 over tensor parallel on the same dimension) the held
                                     elements cut into f pieces, each piece into m chunks, and chunk
                                     `coordinate` of every piece kept, in piece order;
    Replicate()                      the same elements as the other coordinates of that mesh
                                     dimension: copies, written once;
    Partial()                        a reduction not done yet: no element is known, refused.
The elements held along a dimension are then a few runs of global indices; their products are boxes
of the global tensor, each a view of the local tensor (no gather and no copy: lifeline.Shard pieces
that the save reads and the load fills in place).

Works with whichever DTensor torch has (torch.distributed.tensor from 2.4, ._tensor before) and
imports nothing: a DTensor can only exist once torch has imported its module.
"""

import sys

_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")


def _dtensor_class():
    for name in _MODULES:
        cls = getattr(sys.modules.get(name), "DTensor", None)
        if cls is not None:
            return cls
    return None


def is_dtensor(x):
    cls = _dtensor_class()
    return cls is not None and isinstance(x, cls)


def local_tensor(dt):
    """The rank's local tensor, sharing its memory (no autograd node)."""
    local = getattr(dt, "_local_tensor", None)
    return local if local is not None else dt.to_local()


# ---- placements -----------------------------------------------------------------------------------------

def _kind(p):
    """('shard', dim, split_factor or None), ('replicate',) or ('partial',) of a placement."""
    if p.is_partial():
        return ("partial",)
    if p.is_replicate():
        return ("replicate",)
    dim = getattr(p, "dim", None)
    if dim is None:
        raise TypeError(f"placement {p!r} is neither a shard, a replica nor a partial reduction")
    factor = getattr(p, "split_factor", None)
    return ("shard", int(dim), int(factor) if factor is not None else None)


def _chunk(n, m, c):
    """[begin, end) of chunk c when n elements are cut by torch.chunk into m chunks."""
    size = -(-n // m)
    begin = min(n, c * size)
    return begin, min(n, begin + size)


def _take(runs, begin, end):
    """The runs covering positions [begin, end) of the elements `runs` hold, in order."""
    out, pos = [], 0
    for b, e in runs:
        lo, hi = max(begin, pos), min(end, pos + e - b)
        if lo < hi:
            out.append((b + lo - pos, b + hi - pos))
        pos += e - b
    return out


def dim_runs(size, mesh_shape, coordinate, kinds, dim):
    """The global index runs [(begin, end)] along `dim` (of `size` elements) that the rank at
    `coordinate` holds, in the order of its local tensor; adjacent runs merged."""
    runs = [(0, size)]
    for m, c, kind in zip(mesh_shape, coordinate, kinds):
        if kind[0] != "shard" or kind[1] != dim:
            continue
        held = sum(e - b for b, e in runs)
        factor = kind[2]
        if factor is None:
            runs = _take(runs, *_chunk(held, m, c))
            continue
        kept = []
        for piece in range(factor):
            pb, pe = _chunk(held, factor, piece)
            b, e = _chunk(pe - pb, m, c)
            kept += _take(runs, pb + b, pb + e)
        runs = kept
    merged = []
    for b, e in runs:
        if merged and merged[-1][1] == b:
            merged[-1] = (merged[-1][0], e)
        elif e > b:
            merged.append((b, e))
    return merged


def replica_of(mesh_shape, coordinate, kinds):
    """(index, count) of this rank among the copies its Replicate mesh dimensions make."""
    index, count = 0, 1
    for m, c, kind in zip(mesh_shape, coordinate, kinds):
        if kind[0] == "replicate":
            index, count = index * m + c, count * m
    return index, count


def describe(dt):
    """A DTensor's placements and mesh as an error message shows them."""
    return f"placements {tuple(dt.placements)} on a mesh of shape {tuple(dt.device_mesh.shape)}"


def pieces(dt, path, world_size=None):
    """The lifeline.Shard pieces of DTensor `dt`, stored under `path`: one per box of the global
    tensor its local tensor holds, each a view of the local tensor. A rank holding no element (an
    uneven shard, a rank outside the mesh) gets one empty piece, so the tensor is still declared.

    Raises TypeError for a Partial placement and ValueError for a layout whose local tensor does
    not have the shape the placements give, or (with `world_size`) a mesh smaller than the job:
    the ranks outside it would hold copies the placements do not describe."""
    from ._state import Shard
    mesh = dt.device_mesh
    global_shape = tuple(int(d) for d in dt.shape)
    local = local_tensor(dt).detach()
    kinds = [_kind(p) for p in dt.placements]
    if any(k[0] == "partial" for k in kinds):
        raise TypeError(f"state[{path!r}]: a DTensor with a Partial placement ({describe(dt)}) holds a reduction "
                        f"not done yet; reduce it first (dt.redistribute(placements=[Replicate()] * "
                        f"{len(kinds)}) or full_tensor())")
    if world_size is not None and mesh.size() < world_size:
        raise ValueError(f"state[{path!r}]: the DTensor's mesh has {mesh.size()} ranks and the job {world_size}: "
                         f"the other ranks' copies are not described by its placements; make the mesh span "
                         f"every rank (init_device_mesh with the data-parallel dimension in it)")
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return [Shard(local.reshape(-1)[:0], global_shape=global_shape, flat_range=(0, 0))]
    mesh_shape = tuple(int(d) for d in mesh.shape)
    runs = [dim_runs(n, mesh_shape, coordinate, kinds, d) for d, n in enumerate(global_shape)]
    held = tuple(sum(e - b for b, e in r) for r in runs)
    if held != tuple(local.shape):
        raise ValueError(f"state[{path!r}]: the DTensor's local tensor is {tuple(local.shape)}, its {describe(dt)} "
                         f"at coordinate {tuple(coordinate)} give {held}: a layout Lifeline does not know")
    replica = replica_of(mesh_shape, coordinate, kinds)
    if any(n == 0 for n in held):
        return [Shard(local.reshape(-1)[:0], global_shape=global_shape, flat_range=(0, 0), replica=replica)]
    out = []

    def boxes(d, view, offsets):
        if d == len(runs):
            out.append(Shard(view, global_shape=global_shape, offsets=offsets, replica=replica))
            return
        at = 0
        for b, e in runs[d]:
            boxes(d + 1, view.narrow(d, at, e - b) if len(runs[d]) > 1 else view, offsets + (b,))
            at += e - b
    boxes(0, local, ())
    return out

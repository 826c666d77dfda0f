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

A DTensor whose mesh is smaller than the job (a module outside tensor parallelism on the `dp`
slice of a (dp, tp) mesh, a pipeline stage on its `dp` slice of a (pp, dp) mesh, HSDP or expert
parallelism on a slice) leaves a question its placements cannot answer: do the other slices of the
job hold the same tensor (copies: the TP case) or not (other layers: the PP case)? The ranks agree on
it once per state structure (job_layout, collective): each piece is then copy (k * c + i) of (n * c),
k of n the slices holding that path and i of c the copies its Replicate placements make inside one.

Works with whichever DTensor torch has (torch.distributed.tensor from 2.4, ._tensor before) and
imports nothing: a DTensor can only exist once torch has imported its module.
"""

import collections
import hashlib
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


def pieces(dt, path, world_size=None, layout=None):
    """The lifeline.Shard pieces of DTensor `dt`, stored under `path`: one per box of the global
    tensor its local tensor holds, each a view of the local tensor. A rank holding no element (an
    uneven shard, a rank outside the mesh) gets one empty piece, so the tensor is still declared.

    With `world_size` (the job's ranks), a mesh smaller than the job takes its copies across the
    job's other slices from `layout` (job_layout of the state holding `dt`).

    Raises TypeError for a Partial placement and ValueError for a layout whose local tensor does
    not have the shape the placements give, or (with `world_size`) a mesh smaller than the job that
    `layout` does not describe (no torch.distributed process group of the job to agree in)."""
    from ._state import Shard
    mesh = dt.device_mesh
    global_shape = tuple(int(d) for d in dt.shape)
    local = local_tensor(dt).detach()
    kinds = [_kind(p) for p in dt.placements]
    if any(k[0] == "partial" for k in kinds):
        raise TypeError(f"state[{path!r}]: a DTensor with a Partial placement ({describe(dt)}) holds a reduction "
                        f"not done yet; reduce it first (dt.redistribute(placements=[Replicate()] * "
                        f"{len(kinds)}) or full_tensor())")
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return [Shard(local.reshape(-1)[:0], global_shape=global_shape, flat_range=(0, 0))]
    outer = (0, 1)
    if world_size is not None and mesh.size() < world_size:
        outer = layout.outer.get(path) if layout is not None else None
        if outer is None:
            raise ValueError(f"state[{path!r}]: the DTensor's mesh has {mesh.size()} ranks and the job {world_size}: "
                             f"whether the job's other ranks hold copies of it is agreed over torch.distributed, "
                             f"which is not initialised with the job's {world_size} ranks here (initialise it "
                             f"before saving, or make the mesh span every rank)")
    mesh_shape = tuple(int(d) for d in mesh.shape)
    runs = [dim_runs(n, mesh_shape, coordinate, kinds, d) for d, n in enumerate(global_shape)]
    held = tuple(sum(e - b for b, e in r) for r in runs)
    if held != tuple(local.shape):
        raise ValueError(f"state[{path!r}]: the DTensor's local tensor is {tuple(local.shape)}, its {describe(dt)} "
                         f"at coordinate {tuple(coordinate)} give {held}: a layout Lifeline does not know")
    index, count = replica_of(mesh_shape, coordinate, kinds)
    replica = (outer[0] * count + index, outer[1] * count)
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


# ---- the job's agreement: which ranks hold each path ---------------------------------------------------

class JobLayout:
    """What the job's ranks agreed about a state whose DTensors do not all span the job.

    outer[path]   (k, n) of a DTensor on a mesh smaller than the job: its mesh is the k-th of the
                  n distinct meshes (in the order of their ranks) whose ranks hold `path`; each holds
                  the whole tensor, as the same boxes (checked).
    plain[path]   (i, n) of a plain tensor: this rank is the i-th of the n ranks holding `path`.
    parts         the lowest rank of each distinct structure (paths, placements, shapes): the
                  ranks whose states together hold every path of the job.
    paths         every tensor path some rank of the job holds.
    Immutable; shared by every save of states of one structure."""

    __slots__ = ("outer", "plain", "parts", "paths", "_meshes")

    def __init__(self, outer, plain, parts, paths, meshes):
        self.outer, self.plain, self.parts, self.paths, self._meshes = outer, plain, parts, paths, meshes

    def __repr__(self):
        return f"JobLayout(parts={self.parts}, {len(self.paths)} paths)"


_LAYOUTS = collections.OrderedDict()  # signature -> JobLayout, most recent last
_LAYOUTS_KEPT = 8
_SPANS_JOB, _PLAIN, _OUTSIDE = -2, -1, -3  # structure entries' kinds; >= 0: a local mesh's index


def _process_group(world_size):
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world_size:
        return None
    return dist


def job_layout(found, rank=None, world_size=None):
    """The JobLayout of the tensors among `found` ((path, leaf) pairs; DTensors and plain tensors
    count, lifeline.Shard and other leaves are skipped), or None when no DTensor's mesh is smaller
    than the job (nothing to agree on) or torch.distributed is not initialised with `world_size`
    ranks (pieces() then refuses such a DTensor). `rank`/`world_size` default to the default process
    group's.

    Collective, on the default process group, the first time a structure is seen: every rank of
    the job must call it together with its own state (every rank saves, or loads, together), and
    the ranks' states must change structure at the same calls (as the optimizer creating its state
    at the same step on every rank does). The result is cached by a local signature (the paths, and
    each DTensor's mesh object), so later calls with a state of the same structure cost a pass over
    `found` and a dict lookup. Raises ValueError when the meshes holding a path hold it differently
    (another global shape, placements or mesh shape, or overlapping meshes)."""
    if world_size is None or rank is None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not (dist.is_available() and dist.is_initialized()):
            return None
        world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size <= 1:
        return None
    dtensor = _dtensor_class()
    if dtensor is None:
        return None
    meshes = {}
    for _path, leaf in found:
        if isinstance(leaf, dtensor):
            mesh = leaf.device_mesh
            meshes[id(mesh)] = mesh
    sizes = {key: mesh.size() for key, mesh in meshes.items()}
    if all(size >= world_size for size in sizes.values()):
        return None
    # Tensors (a DTensor is a torch.Tensor; a lifeline.Shard is none): their paths, and a DTensor's mesh.
    tensor_types = tuple(t for t in (getattr(sys.modules.get("torch"), "Tensor", None),
                                     getattr(sys.modules.get("numpy"), "ndarray", None)) if t is not None)
    signature = [rank, world_size]
    for path, leaf in found:
        if isinstance(leaf, tensor_types):
            signature.append((path, id(leaf.device_mesh)) if isinstance(leaf, dtensor) else path)
    signature = tuple(signature)
    layout = _LAYOUTS.get(signature)
    if layout is not None:
        _LAYOUTS.move_to_end(signature)
        return layout
    dist = _process_group(world_size)
    if dist is None:
        return None
    if dist.get_rank() != rank:
        raise ValueError(f"lifeline: rank {rank} is rank {dist.get_rank()} of torch.distributed's default group: "
                         f"the Checkpointer's rank must be the process group's")
    layout = _agree(found, rank, world_size, dist, dtensor, meshes, sizes)
    _LAYOUTS[signature] = layout
    while len(_LAYOUTS) > _LAYOUTS_KEPT:
        _LAYOUTS.popitem(last=False)
    return layout


def _agree(found, rank, world_size, dist, dtensor, meshes, sizes):
    """job_layout's collective part: two all_gather_object calls on the default group. The first
    gathers each rank's digest of its structure and the ranks of its local meshes; the second the
    structure itself from the lowest rank of each digest only, so the bytes gathered grow with the
    distinct structures (pipeline stages), not with the ranks."""
    from ._state import Shard, is_tensor
    local_meshes, index_of, structure = [], {}, []
    for path, leaf in found:
        if isinstance(leaf, dtensor):
            mesh = leaf.device_mesh
            key = id(mesh)
            if sizes[key] >= world_size:
                structure.append((path, _SPANS_JOB))
            elif mesh.get_coordinate() is None:
                structure.append((path, _OUTSIDE))
            else:
                if key not in index_of:
                    index_of[key] = len(local_meshes)
                    local_meshes.append(tuple(int(r) for r in mesh.mesh.flatten().tolist()))
                structure.append((path, index_of[key], tuple(int(d) for d in leaf.shape),
                                  tuple(str(p) for p in leaf.placements), tuple(int(d) for d in mesh.shape)))
        elif not isinstance(leaf, Shard) and is_tensor(leaf):
            structure.append((path, _PLAIN))
    digest = hashlib.sha256(repr(structure).encode("utf-8")).hexdigest()
    views = [None] * world_size
    dist.all_gather_object(views, (digest, local_meshes))
    members = {}
    for r, (d, _m) in enumerate(views):
        members.setdefault(d, []).append(r)
    representative = members[digest][0] == rank
    structures = [None] * world_size
    dist.all_gather_object(structures, structure if representative else None)
    holders = {}  # path -> [(digest, entry)]
    for d, ranks in members.items():
        for entry in structures[ranks[0]]:
            holders.setdefault(entry[0], []).append((d, entry))

    outer, plain, memo = {}, {}, {}  # memo: the holders' (digest, kind) pairs -> this rank's replica
    for entry in structure:
        path, kind = entry[0], entry[1]
        if kind in (_SPANS_JOB, _OUTSIDE):
            continue
        held = [(d, e) for d, e in holders[path] if e[1] != _OUTSIDE]
        _check_alike(path, entry, held, members)
        key = tuple((d, e[1]) for d, e in held)
        replica = memo.get(key)
        if replica is None:
            replica = memo[key] = _replica_among(entry, held, members, views, rank)
        (plain if kind == _PLAIN else outer)[path] = replica
    parts = sorted(ranks[0] for ranks in members.values())
    return JobLayout(outer, plain, parts, frozenset(holders), list(meshes.values()))


def _check_alike(path, entry, held, members):
    """Raises ValueError unless every structure holding `path` (`held`) holds it as `entry` does:
    all plain tensors, or all DTensors on meshes of one shape with one global shape and placements."""
    kind = entry[1]
    for d, e in held:
        if (e[1] == _PLAIN) != (kind == _PLAIN) or e[1] == _SPANS_JOB:
            raise ValueError(f"state[{path!r}]: the job's ranks hold it as different kinds of tensor (a DTensor on a "
                             f"slice of the job on some, a plain tensor or a DTensor spanning the job on others, as "
                             f"rank {members[d][0]}): it cannot be saved once")
        if e[2:] != entry[2:]:
            raise ValueError(f"state[{path!r}]: the meshes holding it hold it differently: global shape {entry[2]}, "
                             f"placements {entry[3]} on a mesh of shape {entry[4]} here; {e[2]}, {e[3]} on {e[4]} on "
                             f"rank {members[d][0]}")


def _replica_among(entry, held, members, views, rank):
    """This rank's (index, count) among the holders `held` ((digest, entry) of each structure
    holding a path as `entry` does): its place among the ranks (a plain tensor) or its mesh's among
    the distinct meshes (a DTensor on a slice of the job)."""
    if entry[1] == _PLAIN:
        ranks = sorted(r for d, _e in held for r in members[d])
        return ranks.index(rank), len(ranks)
    distinct = sorted({views[r][1][e[1]] for d, e in held for r in members[d]})
    ranks = [r for m in distinct for r in m]
    if len(ranks) != len(set(ranks)):
        raise ValueError(f"state[{entry[0]!r}]: the meshes holding it overlap ({distinct}): a rank's copy would be "
                         f"counted twice")
    return distinct.index(views[rank][1][entry[1]]), len(distinct)

"""Lifeline as a storage backend of torch.distributed.checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    import lifeline.dcp
    group = torch.distributed.new_group(backend="gloo")       # async_save's collectives, apart from training's
    with lifeline.dcp.StorageWriter("/ckpt/run7", keep_last=3) as writer:
        dcp.save(state_dict, storage_writer=writer)            # durable and committed on return
        response = dcp.async_save(state_dict, storage_writer=writer, process_group=group)
        response.staging_completion.result()                  # the snapshot: the state may change now
        response.upload_completion.result()                   # durable and committed
    if lifeline.dcp.resume_step("/ckpt/run7") is not None:    # the agent's choice, else the newest
        dcp.load(state_dict, storage_reader=lifeline.dcp.StorageReader("/ckpt/run7"))

What the writer produces is a Lifeline checkpoint: one step of the directory, the ranks' pieces
of every global tensor with per-chunk checksums, committed atomically, kept in the memory tier.
`lifeline ls/verify/inspect/convert/reshard` and lifeline.Checkpointer(path).load work on it, and
the reader loads any Lifeline checkpoint, however it was saved, into any mesh: DCP's planner asks
for regions of global tensors and Lifeline reads any region of a stored tensor, whichever ranks'
pieces hold it. The reader therefore presents every tensor as one chunk covering it.

Steps. Each save is one step of the directory: `step=` (or `writer.step = N` before a save) names
it; otherwise, under lifeline-agent, the training step the save follows (the agent's step clock),
else the first save of a writer continues after the newest step in the directory (rank 0's view,
shared by a broadcast), and each later save takes the next one. The reader loads `step=`, else
resume_step(path): the step lifeline-agent fixed for the launch, else the newest; its load tells
the agent from which step and source the process resumed, as lifeline.Checkpointer.load does.

async_save runs DCP's collectives from a background thread: on the default group they would pair
with training's, so give it a group of its own (process_group=); the writer warns when it has none.
A writer left open is closed when it is collected or the interpreter ends normally.

The writer is DCP's AsyncStager. With async_save (thread mode), stage() starts Lifeline's save:
the state's tensors are registered, not copied, and copied by Lifeline's threads while training
goes on; stage() returns a Future that completes when the copy is done, so async_save returns at
once with DCP's AsyncSaveResponse. Nothing may change the state before `staging_completion`
(or writer.wait_snapshot(), which lifeline.guard_optimizer(optimizer, writer) calls before each
optimizer step). `staging="copy"` makes async_save itself wait for the copy and return a plain
Future, as DCP's default stager does. DCP's process mode (AsyncCheckpointerType.PROCESS) sends the
writer to another process, which cannot hold this process's snapshot: it is refused, saying so.

Objects (DCP's bytes items: the state's non-tensor leaves) are kept per rank as Lifeline stores
them: JSON when the value is plain data (what lifeline.Checkpointer writes), else DCP's own
torch.save bytes, which lifeline.Checkpointer.load reads with torch.load(weights_only=True).
"""

import collections as _collections
import concurrent.futures as _futures
import dataclasses as _dataclasses
import io as _io
import json as _json
import os as _os
import sys as _sys
import threading as _threading
import time as _time
import warnings as _warnings
import weakref as _weakref

import torch as _torch
import torch.distributed as _dist

try:
    from torch.distributed.checkpoint import metadata as _md
    from torch.distributed.checkpoint.planner import LoadItemType as _LoadItemType
    from torch.distributed.checkpoint.planner import WriteItemType as _WriteItemType
    from torch.distributed.checkpoint.storage import StorageReader as _StorageReader
    from torch.distributed.checkpoint.storage import StorageWriter as _StorageWriter
    from torch.distributed.checkpoint.storage import WriteResult as _WriteResult
except ImportError as _e:
    raise ImportError(f"lifeline.dcp needs torch.distributed.checkpoint's storage interfaces (torch 2.x; tested with "
                      f"2.13), which torch {_torch.__version__} lacks: {_e}") from None
from torch.futures import Future as _TorchFuture

from . import Checkpointer as _Checkpointer
from . import Error
from . import _state

try:
    from torch.distributed.checkpoint.staging import AsyncStager as _AsyncStager
except ImportError:  # torch before 2.3: async_save stages with its own copy
    _AsyncStager = object

# Whether async_save takes a Future from stage() (torch 2.9 on: AsyncSaveResponse).
try:
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse as _AsyncSaveResponse  # noqa: F401
    _FUTURE_STAGING = True
except ImportError:
    _FUTURE_STAGING = False

__all__ = ["StorageWriter", "StorageReader", "resume_step"]


def _path(checkpoint_id):
    return _os.fsdecode(_os.fspath(checkpoint_id))


def _is_object_store_path(path):
    return path.startswith("s3://")


def _is_lifeline_path(checkpoint_id):
    """A local directory or an object-store prefix (s3://bucket/prefix): what a Lifeline checkpoint
    directory may be. Other schemes belong to other storage layers (fsspec)."""
    try:
        path = _path(checkpoint_id)
    except TypeError:
        return False
    return "://" not in path or _is_object_store_path(path)


def _group():
    """(rank, world size) of the default process group, (0, 1) without one."""
    if _dist.is_available() and _dist.is_initialized():
        return _dist.get_rank(), _dist.get_world_size()
    return 0, 1


def _encode(value):
    """A DCP bytes item as Lifeline keeps it: JSON for plain data, else torch.save bytes."""
    try:
        return _state.encode_object("", value)
    except TypeError:
        buf = _io.BytesIO()
        _torch.save(value, buf)
        return buf.getvalue()


def _pieces_as_dcp_names_them(state_dict):
    """(pieces, objects, mappings) of a state dict under the names DCP's planner gives its items:
    dicts are flattened (also those without tensors), lists only when they hold tensors, anything
    else is one bytes item. A DTensor is the boxes of its global tensor that this rank holds; a
    plain tensor, in a job of several ranks, one of as many identical copies (DCP's assumption too),
    written once. mappings: DCP's, from the flattened names back to the paths in the state dict."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from . import _dtensor
    flat, mappings = flatten_state_dict(state_dict)
    rank, world = _group()
    # DTensors on slices of the job (pipeline stages, modules outside tensor parallelism): which
    # ranks hold each name is agreed once per structure (collective then; every rank stages).
    layout = _dtensor.job_layout(list(flat.items()), rank, world)
    pieces, objects = [], []
    for fqn, value in flat.items():
        if _dtensor.is_dtensor(value):
            pieces.extend((fqn, p) for p in _dtensor.pieces(value, fqn, world, layout))
        elif isinstance(value, _torch.Tensor):
            replica = layout.plain[fqn] if layout is not None else (rank, world)
            pieces.append((fqn, _state.Shard(value, replica=replica) if world > 1 else value))
        else:
            objects.append((fqn, _encode(value)))
    return pieces, objects, mappings


def _metadata(mappings):
    """The checkpoint's metadata for a save through DCP, with DCP's map from the flattened names
    back to the nested state dict's paths (DefaultSavePlanner's mappings), which DCP keeps as its
    metadata's planner_data for loads that build the state dict from the checkpoint alone
    (dcp_to_torch_save, _EmptyStateDictLoadPlanner): StorageReader gives it back."""
    metadata = {"dcp": True}
    if mappings:
        metadata["dcp_planner_data"] = {fqn: list(path) for fqn, path in mappings.items()}
    return metadata


def _shares_default_group(group):
    """Whether DCP's collectives on `group` (None: the default) share the default group of a job of
    several ranks, which its training uses too."""
    if not (_dist.is_available() and _dist.is_initialized()) or _dist.get_world_size() <= 1:
        return False
    if group is None:
        return True
    world = getattr(_dist.group, "WORLD", None)
    return group is world


def _close_left_open(ckpt, directory):
    """Closes the Checkpointer of a writer that was never closed, when the writer is collected or
    the interpreter ends (weakref.finalize), so that a job whose script never closes its writer
    (DCP's examples have none) leaves its snapshots in the memory tier only while they are not on
    disk. A process ending on an uncaught exception keeps them, as a Checkpointer left open does,
    for its relaunch to resume from memory; a killed one runs no finalizer."""
    if ckpt.closed:
        return
    failed = hasattr(_sys, "last_value") or hasattr(_sys, "last_exc")
    try:
        ckpt.close(keep_memory_tier=failed)
    except Error as e:  # the last save failed: said, as a close would have raised it
        _warnings.warn(f"lifeline.dcp.StorageWriter({directory!r}), closed at the end: {e}", RuntimeWarning)


class StorageWriter(_StorageWriter, _AsyncStager):
    """DCP's StorageWriter (and AsyncStager) writing Lifeline checkpoints into `path`.

    StorageWriter(path, step=None, staging="lazy", **options): `options` are those of
    lifeline.Checkpointer (keep_last, memory_tier, codec, staging_budget_bytes, ...). A
    `checkpoint_id` given to dcp.save names the directory instead of `path`."""

    _synchronize_after_execute = False

    def __init__(self, path, step=None, staging="lazy", **options):
        if staging not in ("lazy", "copy"):
            raise ValueError(f"lifeline.dcp.StorageWriter: staging={staging!r}: 'lazy' or 'copy'")
        self.directory = _path(path)
        self.step = None if step is None else int(step)
        self._synchronize_after_execute = staging == "copy" or not _FUTURE_STAGING
        self._options = dict(options)
        self._ckpt = None
        self._next = None            # the step after the last one this writer saved
        # (step, ticket, thread) of the saves stage() started, oldest first, until a DCP save takes one
        self._staged = _collections.deque()
        # tickets of the saves stage() started whose snapshot synchronize_staging() has not yet seen
        # complete (the upload thread may take a save off _staged before async_save synchronizes)
        self._copying = []
        self._lock = _threading.Lock()
        # .saving: (step, ticket) of the DCP save this thread runs; .local_bytes: its rank's bytes
        # items before DCP left each to one rank
        self._call = _threading.local()
        self._is_coordinator = False
        self._group_warned = False
        self._overlap_warned = False
        self._uploading = None       # the ticket of the newest save stage() started

    # ---- the Lifeline side ----

    @property
    def checkpointer(self):
        """The lifeline.Checkpointer that saves (made on first use, for the process group's rank)."""
        if self._ckpt is None:
            rank, world = _group()
            self._ckpt = _Checkpointer(self.directory, rank=rank, world_size=world, **self._options)
            _weakref.finalize(self, _close_left_open, self._ckpt, self.directory)
        return self._ckpt

    def _take_step(self):
        if self.step is not None:
            step, self.step = self.step, None
        else:
            if self._next is None:
                latest = self.checkpointer.latest_step()
                tier = [c["step"] for c in self.checkpointer.list(True) if c["complete"]]
                newest = max([s for s in [latest] + tier if s is not None], default=-1)
                if _dist.is_available() and _dist.is_initialized() and _dist.get_world_size() > 1:
                    box = [newest]
                    _dist.broadcast_object_list(box, src=0)
                    newest = box[0]
                self._next = newest + 1
            step = self._next
            # Under lifeline-agent, the training step the save follows, so that a checkpoint's step
            # is the step the agent's clock, metrics and restarts name (a relaunch's clock goes on
            # from the loaded step).
            autotrace = _sys.modules.get("lifeline._autotrace")
            trained = autotrace.last_step() if autotrace is not None else None
            if trained is not None and trained > step:
                step = trained
        self._next = step + 1
        return step

    def wait_snapshot(self):
        """Waits until no save reads the state's tensors any more (lifeline.guard_optimizer calls it)."""
        if self._ckpt is not None:
            self._ckpt.wait_snapshot()

    def close(self, keep_memory_tier=False):
        """Waits for every save to be durable, then frees the staging memory and this rank's
        memory-tier snapshots that are on disk (keep_memory_tier=True keeps them, as a crash does).
        Raises lifeline.Error when the newest save failed. Idempotent; a writer still open when the
        interpreter ends normally is closed then (see __init__)."""
        if self._ckpt is not None:
            self._ckpt.close(keep_memory_tier=keep_memory_tier)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # Leaving on an exception is not the end of the job: the relaunch wants the snapshots.
        self.close(keep_memory_tier=exc_type is not None)
        return False

    _PROCESS_MODE = ("lifeline.dcp.StorageWriter works in DCP's thread mode only "
                     "(async_save(..., async_checkpointer_type=AsyncCheckpointerType.THREAD), the default): "
                     "process mode sends the writer to another process, which cannot read the snapshot this "
                     "process takes; Lifeline already persists from threads of its own, off the GIL")

    def __reduce__(self):
        raise TypeError(self._PROCESS_MODE)

    _SHARED_GROUP = ("lifeline.dcp: dcp.async_save was given no process_group, so DCP runs its save's collectives "
                     "(plan, metadata) on the default group from a background thread while training uses that "
                     "group too: their messages can pair with training's (gloo fails with 'collective mismatch' "
                     "or 'EnforceNotMet', NCCL may hang). Make a group for checkpoints once, on every rank, and "
                     "pass it: async_save(..., process_group=torch.distributed.new_group(backend=\"gloo\"))")

    _OVERLAP = ("lifeline.dcp: dcp.async_save was called while this writer's previous async_save was still "
                "uploading: DCP runs each upload's collectives in a thread of its own, and two at once on one "
                "process group can pair wrongly and hang. This save waited for the previous one to be durable; "
                "wait for its upload_completion before the next async_save, as DCP asks")

    def _one_upload_at_a_time(self):
        """Before a new async_save: the previous one's upload must be past its writes (DCP's next
        collectives would otherwise run beside its own, in another thread, on the same group)."""
        previous = self._uploading
        if previous is None or previous.done():
            return
        if not self._overlap_warned:
            self._overlap_warned = True
            _warnings.warn(self._OVERLAP, RuntimeWarning, stacklevel=3)
        try:
            previous.wait_persisted()
        except Error:
            pass  # its own upload_completion reports it

    def _check_async_save_call(self):
        """Checks how the async_save calling stage() was called, before anything is saved. DCP does
        not tell a stager its mode or group, but its frame does. Process mode is refused (the
        writer's pickling error would be seen only as "background process is dead"); no group in a
        job of several ranks is warned of, once per writer."""
        frame = _sys._getframe(2)
        for _ in range(8):
            if frame is None:
                return
            if frame.f_code.co_name == "async_save" and "async_checkpointer_type" in frame.f_locals:
                kind = frame.f_locals["async_checkpointer_type"]
                if getattr(kind, "name", str(kind)).upper().endswith("PROCESS"):
                    raise ValueError(self._PROCESS_MODE)
                group = frame.f_locals.get("process_group")
                if not self._group_warned and _shares_default_group(group):
                    self._group_warned = True
                    _warnings.warn(self._SHARED_GROUP, RuntimeWarning, stacklevel=2)
                return
            frame = frame.f_back

    # ---- AsyncStager ----

    def stage(self, state_dict):
        """Starts Lifeline's save of `state_dict` (its tensors copied in the background) and returns
        a Future of the state dict that completes once the copy is done (staging="lazy", torch with
        AsyncSaveResponse), else the state dict after synchronize_staging()."""
        self._check_async_save_call()
        self._one_upload_at_a_time()
        step = self._take_step()
        pieces, objects, mappings = _pieces_as_dcp_names_them(state_dict)
        ticket = self.checkpointer._save_pieces(step, pieces, objects, _metadata(mappings))
        staged = (step, ticket, _threading.get_ident())
        self._uploading = ticket
        with self._lock:
            self._staged.append(staged)
            if self._synchronize_after_execute:
                self._copying.append(ticket)
        if self._synchronize_after_execute:
            return state_dict
        done = _futures.Future()

        def wait():
            try:
                ticket.wait_snapshot()
                done.set_result(state_dict)
            except BaseException as e:  # noqa: B902 - handed to whoever waits on the future
                # DCP will not save what failed to stage: no later save may take it for its own.
                with self._lock:
                    if staged in self._staged:
                        self._staged.remove(staged)
                done.set_exception(e)
        _threading.Thread(target=wait, name="lifeline-dcp-stage", daemon=True).start()
        return done

    def synchronize_staging(self):
        with self._lock:
            copying, self._copying = self._copying, []
        failed = None
        for ticket in copying:  # every one, even after one failed: none may still read the state
            try:
                ticket.wait_snapshot()
            except BaseException as e:  # noqa: B902 - raised below, once all are waited for
                failed = failed or e
        if failed is not None:
            raise failed

    # ---- StorageWriter ----

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None and _path(checkpoint_id) != self.directory:
            if self._staged:
                raise ValueError(f"lifeline.dcp.StorageWriter: async_save's checkpoint_id {_path(checkpoint_id)!r} "
                                 f"differs from the writer's directory {self.directory!r}, where stage() has saved "
                                 f"step {self._staged[0][0]} already: give the directory to the writer")
            if self._ckpt is not None:
                self._ckpt.close()
                self._ckpt = None
            self.directory = _path(checkpoint_id)
            self._next = None

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self._is_coordinator = bool(is_coordinator)
        # The first call of a DCP save, in the thread that runs it: async_save's takes the oldest
        # save stage() started (its upload thread is never the thread that staged it), so a save that
        # fails later leaves nothing a later save could take; dcp.save's, none.
        with self._lock:
            mine = self._staged and self._staged[0][2] != _threading.get_ident()
            self._call.saving = self._staged.popleft()[:2] if mine else None

    def storage_meta(self):
        return _md.StorageMeta(checkpoint_id=self.directory)

    def prepare_local_plan(self, plan):
        # Every rank keeps its own objects (lifeline.Checkpointer.load gives each rank its own),
        # also those DCP will leave to one rank.
        self._call.local_bytes = [item.index.fqn for item in plan.items if item.type == _WriteItemType.BYTE_IO]
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def write_data(self, plan, planner):
        # async_save: the save stage() started (set_up_storage_writer took it); dcp.save: the plan's
        # items are the state, even while an async_save of this writer is still being uploaded.
        staged = getattr(self._call, "saving", None)
        if staged is None:
            step = self._take_step()
            staged = (step, self._save_plan(step, plan, planner))
        self._call.saving = staged
        step, ticket = staged
        ticket.wait_persisted()
        results = []
        for item in plan.items:
            size = 0
            if item.type != _WriteItemType.BYTE_IO:
                chunk = item.tensor_data.chunk
                size = _torch.Size(chunk.sizes if chunk is not None else item.tensor_data.size).numel()
                size *= _torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()
            results.append(_WriteResult(index=item.index, size_in_bytes=size, storage_data={"step": step}))
        fut = _TorchFuture()
        fut.set_result(results)
        return fut

    def _save_plan(self, step, plan, planner):
        """Starts the save of this rank's share of a DCP plan: its tensor items as pieces of their
        global tensors, its bytes items (and those DCP left to another rank) as objects."""
        pieces, objects, written = [], [], set()
        lookup = getattr(planner, "lookup_object", None)  # DefaultSavePlanner's: the value itself
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == _WriteItemType.BYTE_IO:
                written.add(fqn)
                data = _encode(lookup(item.index)) if lookup is not None else planner.resolve_data(item).getvalue()
                objects.append((fqn, data))
                continue
            tensor = planner.resolve_data(item).detach()
            chunk = item.tensor_data.chunk
            global_shape = tuple(item.tensor_data.size)
            shape = tuple(chunk.sizes) if chunk is not None else global_shape
            offsets = tuple(chunk.offsets) if chunk is not None else (0,) * len(global_shape)
            pieces.append((fqn, _state.Shard(tensor.reshape(shape), global_shape=global_shape, offsets=offsets)))
        if lookup is not None:
            for fqn in getattr(self._call, "local_bytes", ()):
                if fqn not in written:
                    objects.append((fqn, _encode(lookup(_md.MetadataIndex(fqn)))))
        return self.checkpointer._save_pieces(step, pieces, objects, _metadata(getattr(planner, "mappings", None)))

    def finish(self, metadata, results):
        saving = getattr(self._call, "saving", None)
        self._call.saving = None
        if saving is not None and self._is_coordinator:
            saving[1].wait_committed()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _is_lifeline_path(checkpoint_id)


class StorageReader(_StorageReader):
    """DCP's StorageReader loading a Lifeline checkpoint of `path` (however it was saved) into any
    mesh. StorageReader(path, step=None): `step`, else the step resume_step(path) names (under
    lifeline-agent the one it fixed for this launch, else the newest complete one). The bytes come
    from this node's memory tier when it holds the step, else from the disk, checksums verified
    either way. Like lifeline.Checkpointer.load, a load tells lifeline-agent (when there is one)
    from which step and source the process resumed, and `last_load` says it too (step,
    from_memory_tier, saved_world_size, bytes_read, ...). The reader creates nothing and never
    saves."""

    def __init__(self, path, step=None, **options):
        self.directory = _path(path)
        self.step = None if step is None else int(step)
        self._options = dict(options)
        self._ckpt = None
        self._metadata = None
        self._is_coordinator = False
        self._load_began = None
        self.last_load = None

    def _checkpointer(self):
        if self._ckpt is None:
            rank, world = _group()
            options = dict(self._options)
            options.setdefault("run_id", "dcp-reader")  # it never saves: no launch id to agree on
            options.setdefault("load_only", True)
            self._ckpt = _Checkpointer(self.directory, rank=rank, world_size=world, **options)
        return self._ckpt

    def close(self):
        """Releases the reader's handle on the directory (a later load opens it again)."""
        if self._ckpt is not None:
            self._ckpt.close()
            self._ckpt = None

    def _step_to_load(self):
        if self.step is not None:
            return self.step
        ckpt = self._checkpointer()
        pinned = ckpt._impl.resume_step  # lifeline-agent's choice for this launch, for this directory
        if pinned == "none":
            return None
        if pinned:
            return int(pinned)
        if not _is_object_store_path(self.directory) and not _os.path.exists(self.directory):
            return None  # a first run: the writer creates it
        return ckpt.latest_step()

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None and _path(checkpoint_id) != self.directory:
            self.directory = _path(checkpoint_id)
            self.close()
        self._load_began = None

    def read_metadata(self, *args, **kwargs):
        if self._load_began is None:
            self._load_began = _time.monotonic()
        try:
            step = self._step_to_load()
        except Error as e:
            raise Error(f"lifeline.dcp.StorageReader: {self.directory}: {e}") from None
        if step is None:
            pinned = self._checkpointer()._impl.resume_step == "none"
            raise Error(f"NotFound: lifeline.dcp.StorageReader: no complete checkpoint in {self.directory}" +
                        (" (lifeline-agent found none when it launched this job: it starts fresh)" if pinned else "") +
                        "; lifeline.dcp.resume_step(path) returns None then, for the script to start fresh")
        try:
            described = self._describe(step)
        except Error as e:
            raise Error(f"lifeline.dcp.StorageReader: {self.directory}: {e}") from None
        if described.get("format") != "lifeline":
            raise Error(f"lifeline.dcp.StorageReader: {self.directory} is not a Lifeline checkpoint directory")
        dtypes = {name: dtype for dtype, name in _state._torch_dtype_names().items()}
        state = {}
        for t in described["tensors"]:
            dtype = dtypes.get(t["dtype"])
            if dtype is None:
                raise Error(f"lifeline.dcp.StorageReader: tensor {t['name']!r} of {self.directory} is "
                            f"{t['dtype']}, which this torch has no dtype for")
            size = _torch.Size(t["shape"])
            state[t["name"]] = _md.TensorStorageMetadata(
                properties=_md.TensorProperties(dtype=dtype), size=size,
                chunks=[_md.ChunkStorageMetadata(offsets=_torch.Size([0] * len(size)), sizes=size)])
        holders = {}
        for o in described["objects"]:
            holders.setdefault(o["name"], []).append(int(o["rank"]))
        for name in holders:
            if name in state:
                raise Error(f"lifeline.dcp.StorageReader: {name!r} is both a tensor and an object in {self.directory}")
            state[name] = _md.BytesStorageMetadata()
        try:
            saved = _json.loads(described.get("metadata") or "{}")
        except ValueError:
            saved = {}
        planner_data = saved.get("dcp_planner_data") if isinstance(saved, dict) else None
        if isinstance(planner_data, dict):
            planner_data = {fqn: tuple(path) for fqn, path in planner_data.items()
                            if isinstance(path, list) and all(isinstance(k, (str, int)) for k in path)}
        else:
            planner_data = None
        return _md.Metadata(state_dict_metadata=state, planner_data=planner_data,
                            storage_data={"step": described["step"], "objects": holders},
                            storage_meta=_md.StorageMeta(checkpoint_id=self.directory))

    def _describe(self, step):
        """The step's tensors and objects, from the disk, else (a step the disk does not hold: the
        process died before its copy) from this node's memory tier."""
        try:
            return _lifeline_describe(self.directory, step)
        except Error as e:
            tier = self._checkpointer().memory_tier_directory
            if getattr(e, "code", None) != "NotFound" or not tier:
                raise
            try:
                return _lifeline_describe(tier, step)
            except Error:
                raise e from None

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self._metadata = metadata
        self._is_coordinator = bool(is_coordinator)

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        # Every rank reads the coordinator's step, whatever another save made newest meanwhile.
        step = self._metadata.storage_data["step"]
        return [_dataclasses.replace(p, storage_data={"step": step}) for p in plans]

    def read_data(self, plan, planner):
        step = plan.storage_data["step"] if isinstance(plan.storage_data, dict) else \
            self._metadata.storage_data["step"]
        ckpt = self._checkpointer()
        rank, _world = _group()
        specs, fills, byte_items = [], [], []
        for item in plan.items:
            if item.type == _LoadItemType.BYTE_IO:
                byte_items.append(item)
                continue
            fqn = item.storage_index.fqn
            stored = self._metadata.state_dict_metadata[fqn]
            target = planner.resolve_tensor(item).detach()
            begin = [a + b for a, b in zip(item.storage_index.offset or [0] * len(item.lengths),
                                           item.storage_offsets)]
            lengths = [int(n) for n in item.lengths]
            buffer = target
            if target.dtype != stored.properties.dtype or target.device.type != "cpu" \
                    or not target.is_contiguous() or tuple(target.shape) != tuple(lengths):
                buffer = _torch.empty(lengths, dtype=stored.properties.dtype)
            spec, _keep = _state.tensor_spec(fqn, _state.Shard(buffer, global_shape=tuple(stored.size), offsets=begin))
            specs.append(spec)
            fills.append((item, target, buffer))
        objects = {}
        loaded = None  # this rank's own load (its tensors, or else its objects)
        if specs:
            loaded = result = ckpt._impl.load(step, specs, rank)
            if result is None:
                raise Error(f"NotFound: step {step} of {self.directory} is gone")
            objects.update(dict(result["objects"]))
        for item, target, buffer in fills:
            if buffer is not target:
                target.copy_(buffer.reshape(target.shape))
            planner.commit_tensor(item, target)
        holders = self._metadata.storage_data.get("objects", {})
        for item in byte_items:
            fqn = item.storage_index.fqn
            ranks = holders.get(fqn, [])
            owner = rank if rank in ranks else min(ranks, default=rank)
            data = objects.get(fqn) if owner == rank else None
            if data is None:
                result = ckpt._impl.load(step, [], owner)
                if result is None:
                    raise Error(f"NotFound: step {step} of {self.directory} is gone")
                data = dict(result["objects"]).get(fqn)
                if owner == rank:
                    objects.update(dict(result["objects"]))
                    loaded = result
            if data is None:
                raise Error(f"NotFound: object {fqn!r} of rank {owner} is not in step {step} of {self.directory}")
            planner.load_bytes(item, _io.BytesIO(_as_torch_save(fqn, data)))
        self._say_loaded(step, loaded)
        fut = _TorchFuture()
        fut.set_result(None)
        return fut

    def _say_loaded(self, step, result):
        # What lifeline.Checkpointer.load does after a load: last_load, and lifeline-agent told from
        # which step and source the process resumed (its step clock, time lost and ETTR follow).
        ckpt = self._ckpt
        ckpt._load_began = self._load_began
        if result is None:  # nothing of this rank's own was read: the step is all it can say
            result = {"step": step, "from_memory_tier": False, "saved_world_size": None, "bytes_read": 0,
                      "metadata_json": "", "skipped": []}
        ckpt._loaded(result, [], False)
        self.last_load = ckpt.last_load
        self._load_began = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _is_lifeline_path(checkpoint_id)


def resume_step(path):
    """The step that dcp.load through StorageReader(path) loads when given none, without reading
    any tensor: under lifeline-agent the step it fixed for this launch (None: it found no complete
    checkpoint, so the launch starts fresh); otherwise the newest complete step of `path` (None:
    there is none). The same on every rank of a job sharing the directory; no collective."""
    reader = StorageReader(path)
    try:
        step = reader._step_to_load()
        if step is None:  # the script starts fresh: lifeline-agent hears it as from Checkpointer.load
            reader._checkpointer()._announce(None)
        return step
    finally:
        reader.close()


def _lifeline_describe(directory, step):
    from . import describe_source
    return describe_source(directory, step)


def _as_torch_save(name, data):
    """An object as DCP's load_bytes wants it: torch.save bytes (a Lifeline JSON object re-encoded)."""
    if _state.is_torch_save(data):
        return data
    buf = _io.BytesIO()
    _torch.save(_state.decode_object(name, data), buf)
    return buf.getvalue()

"""Lifeline: lazy, resharding checkpoints and supervision for distributed training.

    import lifeline
    ckpt = lifeline.Checkpointer("/ckpt/run7", rank=rank, world_size=world, memory_tier=True, keep_last=3)
    step = ckpt.load(state)            # newest complete checkpoint, any world size; None when there is none
    lifeline.guard_optimizer(optimizer, ckpt)
    for step in range(...):
        with lifeline.trace.step(step):
            loss = model(batch); loss.backward()
            optimizer.step()           # waits for the snapshot of the last save first
            if step % 100 == 0:
                ckpt.save(step, state) # returns at once; the state is copied while training goes on

`state` is a tree of dicts and lists whose tensors (or lifeline.Shard pieces of global tensors) are
saved zero-copy in Lifeline's universal format and whose other leaves are kept per rank;
lifeline.torch.state_dict(model, optimizer) makes one of a PyTorch model (plain or DDP) and
lifeline.torch.load(ckpt, model, optimizer) loads it. See docs/python.md.
"""

import json as _json
import os as _os
import sys as _sys
import time as _time
import warnings as _warnings

from . import _lifeline
from . import trace
from .trace import report
from ._state import Shard
from . import _state

Error = _lifeline.Error

__all__ = ["Checkpointer", "Ticket", "Shard", "Error", "trace", "report", "guard_optimizer", "convert", "describe_source", "dcp",
           "skip_steps", "StepSet"]


def __getattr__(name):
    # lifeline.torch is imported on first use: `import lifeline` does not need torch.
    if name in ("torch", "dcp"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class StepSet:
    """Steps as ranges, first and last included: `step in steps`, len(), iteration in order, and
    `ranges` [(first, last), ...]. What lifeline.skip_steps() returns."""

    def __init__(self, ranges=()):
        self.ranges = sorted((int(a), int(b)) for a, b in ranges)

    @classmethod
    def parse(cls, text):
        """"41-47,60" -> StepSet([(41, 47), (60, 60)]); "" -> an empty one. ValueError when malformed."""
        ranges = []
        for part in (text or "").split(","):
            part = part.strip()
            if not part:
                continue
            first, _, last = part.partition("-")
            a, b = int(first), int(last) if last else int(first)
            if a < 0 or b < a:
                raise ValueError(f"not a step range: {part!r}")
            ranges.append((a, b))
        return cls(ranges)

    def __contains__(self, step):
        return any(a <= step <= b for a, b in self.ranges)

    def __iter__(self):
        for a, b in self.ranges:
            yield from range(a, b + 1)

    def __len__(self):
        return sum(b - a + 1 for a, b in self.ranges)

    def __bool__(self):
        return bool(self.ranges)

    def __eq__(self, other):
        return isinstance(other, StepSet) and self.ranges == other.ranges

    def __repr__(self):
        return "StepSet(" + ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.ranges) + ")"


def skip_steps():
    """The steps whose data this launch must skip: lifeline-agent's rollbacks (policy rollback with
    rollback.skip_data) name the steps between the checkpoint resumed from and a loss spike or a
    non-finite value that came back after a replay (LIFELINE_SKIP_STEPS). Empty without an agent or
    with nothing to skip. The recipe: draw the step's batch as usual, and do not train on it:

        for step in range(start, steps):
            batch = next(batches)              # the data stays where the step count says
            if step in skip:                   # skip = lifeline.skip_steps(), read once
                continue
            ...

    See docs/reliability.md."""
    return StepSet.parse(_os.environ.get("LIFELINE_SKIP_STEPS", ""))


class Ticket:
    """A save in flight. Copies of it refer to the same save; dropping it never cancels the save."""

    def __init__(self, impl, names):
        self._impl = impl
        self._names = names  # tensor path -> index in the request
        self.raised = False  # a wait raised this save's error to the caller (close() does not again)

    def _waiting(self, wait, *args):
        try:
            return wait(*args)
        except Error:
            self.raised = True
            raise

    @property
    def step(self):
        return self._impl.step

    def wait_snapshot(self):
        """Blocks until this rank's state is copied; then the tensors may be mutated.

        Raises lifeline.Error if the save failed or was skipped (the tensors are not read any more)."""
        self._waiting(self._impl.wait_snapshot)

    def wait_tensor(self, path):
        """Blocks until the tensor at `path` ("optim.3.exp_avg") is copied, so it alone may be mutated."""
        try:
            indexes = self._names[path]
        except KeyError:
            raise KeyError(f"no tensor {path!r} in the save of step {self.step}") from None
        for index in indexes:  # a DTensor's pieces
            self._impl.wait_tensor(index)

    def fence_on(self, stream=None):
        """CUDA tensors: makes `stream` (a torch.cuda.Stream; default: the current stream) wait on the
        GPU until this save's device-to-host copies are done, and returns at once. Kernels queued on
        it afterwards (the optimizer step) may overwrite the tensors; the checkpoint still holds their
        values at save(). Host tensors of the same save still need wait_snapshot()."""
        import torch
        if stream is None:
            stream = torch.cuda.current_stream()
        self._impl.fence_on(int(stream.cuda_stream))

    def wait_persisted(self):
        """Blocks until this rank's data and index are durable."""
        self._waiting(self._impl.wait_persisted)

    def wait_committed(self, timeout=600.0):
        """Blocks until every rank's part is durable and the checkpoint is visible."""
        self._waiting(self._impl.wait_committed, float(timeout))

    def wait(self, timeout=600.0):
        """Persisted and committed; raises lifeline.Error on failure (naming the file, rank or step)."""
        self.wait_committed(timeout)

    def progress(self):
        """A dict, without blocking: step, phase (copying/persisting/persisted/committed/failed/skipped),
        error (None or the message), bytes_total, bytes_copied, bytes_stored, stall_seconds,
        snapshot_seconds, persist_seconds, staged, memory_tier."""
        return self._impl.progress()

    @property
    def phase(self):
        return self._impl.progress()["phase"]

    def error(self):
        """None while the save is fine, else the error message; never blocks."""
        return self._impl.progress()["error"]

    def done(self):
        return self._impl.progress()["phase"] in ("persisted", "committed", "failed", "skipped")

    def __repr__(self):
        p = self._impl.progress()
        return f"<lifeline.Ticket step={p['step']} {p['phase']}{' ' + p['error'] if p['error'] else ''}>"


def _env_int(*names):
    for n in names:
        v = _os.environ.get(n)
        if v not in (None, ""):
            return int(v)
    return None


def _process_group(world_size):
    """torch.distributed when it is initialised with more than one rank, else None."""
    dist = _sys.modules.get("torch.distributed")  # none is initialised unless the program imported it
    if world_size <= 1 or dist is None:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world_size:
        return None
    return dist


def _agreed_launch_id(dist):
    """A random id made by rank 0 and broadcast: the same on every rank, new for every launch."""
    box = [_os.urandom(8).hex() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return "torch:" + box[0]


class _SavedTensors:
    """The tensors of a save, for the next save of the same tensors: their leaves (by identity), the
    tensors whose memory the save read (and their addresses then), and what was sent to the C++
    side. A save that read a copy of a leaf (a non-contiguous tensor, a DTensor's box gathered from
    runs) is not reused: the copy must be made again."""

    __slots__ = ("paths", "leaves", "addresses", "kinds", "streams", "keep", "names", "device_only")

    @classmethod
    def of(cls, tensors, specs, keep, names):
        torch = _sys.modules.get("torch")
        if torch is None:
            return None
        dtensor = _state._dtensor
        self = cls()
        self.paths = [path for path, _ in tensors]
        self.leaves = [leaf for _, leaf in tensors]
        # kinds: where a leaf's memory is (_lifeline.leaves_unmoved): 0 the leaf, 1 a Shard's tensor,
        # 2 a DTensor's local tensor.
        probes, self.kinds = [], []
        for leaf in self.leaves:
            if isinstance(leaf, _state.Shard):
                probe, kind = leaf.tensor, 1
            elif dtensor.is_dtensor(leaf):
                probe, kind = getattr(leaf, "_local_tensor", None), 2
            else:
                probe, kind = leaf, 0
            self.kinds.append(kind)
            if not isinstance(probe, torch.Tensor):
                return None  # numpy: not reused
            probes.append(probe)
        # Every piece read the memory of its leaf (no copy was made): its address follows the probe's.
        probe_of = dict(zip(self.paths, probes))
        for path, indexes in names.items():
            for i in indexes:
                if keep[i].numel() > 0 and not _same_storage(keep[i], probe_of.get(path)):
                    return None
        self.addresses = [p.data_ptr() for p in probes]
        self.streams = {spec[10]: spec[11] for spec in specs if spec[10] >= 0}
        self.keep, self.names = keep, names
        self.device_only = bool(specs) and all(spec[10] >= 0 for spec in specs)
        return self

    def matches(self, tensors):
        """Whether `tensors` (flatten's) are this save's leaves, at the same paths, in the same memory."""
        if not _lifeline.leaves_unmoved(tensors, self.leaves, self.kinds, self.addresses):
            return False
        if [path for path, _ in tensors] != self.paths:
            return False
        if self.streams:
            torch = _sys.modules["torch"]
            if any(torch.cuda.current_stream(d).cuda_stream != s for d, s in self.streams.items()):
                return False
        return True


def _same_storage(buffer, probe):
    """Whether `buffer`, a piece a save read, lies in the memory of `probe`, the tensor of its leaf."""
    if probe is None:
        return False
    try:
        return buffer.untyped_storage().data_ptr() == probe.untyped_storage().data_ptr()
    except (AttributeError, RuntimeError):
        return False


class Checkpointer:
    """Saves and loads this rank's share of the training state.

    Checkpointer(directory, rank=None, world_size=None, **options): rank and world_size default to
    RANK and WORLD_SIZE from the environment (torchrun, lifeline-agent), else 0 and 1. Options:
    keep_last, memory_tier, memory_tier_directory, memory_tier_cleanup_on_close, codec (None, "zstd",
    "zstd-bytegroup"), codec_level, staging_budget_bytes, staging_slots, busy_policy ("wait", "skip"),
    copy_threads, background_nice, direct_io, drain_directory, drain_keep_last, run_id, chunk_bytes,
    write_block_bytes, save_memory_budget, load_memory_budget, queue_depth, replica_split_bytes, column_blocks,
    register_buffers, fault_injection (enables inject_faults, for tests), resume_step. Each has the
    meaning of the C++ CheckpointerOptions field of the same name.

    Every launch needs an id of its own, the same on all ranks (so that no step is ever completed by
    ranks of two launches). Under lifeline-agent it comes from the agent; when torch.distributed is
    initialised before the Checkpointer is created, the ranks agree on a new one here (creating it
    is then collective); otherwise pass run_id=, or saves with world_size > 1 fail saying so.
    """

    def __init__(self, directory, rank=None, world_size=None, **options):
        if rank is None:
            rank = _env_int("RANK") or 0
        if world_size is None:
            world_size = _env_int("WORLD_SIZE") or 1
        self.directory = _os.fsdecode(directory)  # str, bytes or a path-like object
        self.rank = int(rank)
        self.world_size = int(world_size)
        self._dist = _process_group(self.world_size)
        if "run_id" not in options and not _os.environ.get("LIFELINE_LAUNCH_ID") and self._dist is not None:
            options["run_id"] = _agreed_launch_id(self._dist)
        # A path is bytes to the OS: one that is not UTF-8 (os.fsdecode's surrogates) goes as its bytes.
        self._impl = _lifeline.Checkpointer(_os.fsencode(self.directory), self.rank, self.world_size, options)
        # Load(latest) agrees on the step collectively unless the agent fixed it for the launch.
        self._pinned = bool(self._impl.resume_step)
        self._pending = []        # (ticket, device_only) whose snapshot may still read the caller's tensors
        self._fenced = []         # device-only tickets a stream was fenced on, kept until copied
        self._last = None
        self._saved = None        # _SavedTensors of the last save(), reused while its tensors stay
        self._final_reported = False  # close() raised for a failed last save once already
        self._tier_warned = False     # a save missing from the memory tier was said
        self._announced = False   # process_start sent to the agent
        self.last_load = None

    # ---- saving ----

    def _request(self, state, found=None):
        """(specs, buffers to keep alive, encoded objects, path -> spec indexes) of `state`; `found`:
        its walk (_state.walk) when the caller made it already."""
        specs, keep, objects, names = [], [], [], {}
        for path, leaf, parts in _state.leaves(state, self.rank, self.world_size, found):
            if parts is None:
                objects.append((path, _state.encode_object(path, leaf)))
                continue
            names[path] = []
            for piece in parts:
                spec, buffer = _state.tensor_spec(path, piece)
                names[path].append(len(specs))
                specs.append(spec)
                keep.append(buffer)
        return specs, keep, objects, names

    def _say_memory_tier_problems(self):
        # A memory tier that silently holds nothing (a container's 64 MB /dev/shm) would make every
        # restart read the disk: said once per Checkpointer, with the reason.
        last = self._last
        if last is None or self._tier_warned:
            return
        note = last.progress().get("memory_tier_note")
        if note:
            self._tier_warned = True
            _warnings.warn(f"lifeline: step {last.step} is not in the memory tier: {note}", RuntimeWarning,
                           stacklevel=3)

    def save(self, step, state, metadata=None):
        """Starts saving `state` as step `step` and returns a Ticket at once.

        The tensors are read in the background: do not mutate them before ticket.wait_snapshot()
        (or use guard_optimizer). Errors (a bad request, I/O failures, a step already committed)
        are raised by the ticket's waits; earlier checkpoints are never harmed by a failed save.

        A state holding the same tensor objects at the same addresses as the last save's (what
        lifeline.torch.state_dict returns for an unchanged model and optimizer) is not described
        again: the save costs a walk of the state and a check of each tensor's address."""
        tensors, objects = _state.flatten(state)
        again = self._saved is not None and self._saved.matches(tensors)
        if not again:
            specs, keep, encoded, names = self._request(state, tensors + objects)
        else:
            specs, keep, names = None, self._saved.keep, self._saved.names
            encoded = [(path, _state.encode_object(path, value)) for path, value in objects]
        ticket = self._submit(step, specs, keep, encoded, names, metadata)
        if not again:
            self._saved = _SavedTensors.of(tensors, specs, keep, names)
        return ticket

    def _save_pieces(self, step, pieces, objects, metadata=None):
        """save() of explicit pieces: (path, tensor or Shard) pairs, several per path allowed, and
        (path, bytes) objects as they are to be stored (lifeline.dcp saves DCP's items this way)."""
        specs, keep, names = [], [], {}
        for path, piece in pieces:
            spec, buffer = _state.tensor_spec(path, piece)
            names.setdefault(path, []).append(len(specs))
            specs.append(spec)
            keep.append(buffer)
        return self._submit(step, specs, keep, list(objects), names, metadata)

    def _submit(self, step, specs, keep, objects, names, metadata):
        """Saves `specs` (None: those of the last save, self._saved)."""
        self._prune()
        self._say_memory_tier_problems()
        meta = _json.dumps(metadata) if metadata is not None else ""
        if specs is None:
            impl = self._impl.save_again(int(step), objects, meta, keep)
            device_only = self._saved.device_only
        else:
            self._saved = None  # the C++ side now holds these specs, not the cached ones
            impl = self._impl.save(int(step), specs, objects, meta, keep)
            # A save of CUDA tensors only: the optimizer may be ordered after its copies on the GPU.
            device_only = bool(specs) and all(spec[10] >= 0 for spec in specs)
        self._pending.append((impl, device_only))
        autotrace = _sys.modules.get("lifeline._autotrace")  # loaded only under lifeline-agent
        if autotrace is not None:
            autotrace.saved_at(step)
        self._last = Ticket(impl, names)
        self._say_memory_tier_problems()
        return self._last

    def prepare_staging(self, state):
        """Sizes and faults in the host staging memory for saves shaped like `state`, so the first
        checkpoints cost what later ones do. Call once at start-up; the tensors are not read."""
        specs, _keep, objects, _names = self._request(state)
        self._impl.prepare_staging(specs, objects, "")

    def wait_snapshot(self):
        """Waits until no save reads the caller's tensors any more (guard_optimizer calls this).

        Saves of CUDA tensors only are not waited for: the current CUDA stream is made to wait for
        their copies on the GPU instead (Ticket.fence_on), so the CPU goes on at once."""
        pending, self._pending = self._pending, []
        errors = []
        for impl, device_only in pending:
            try:
                if device_only:
                    import torch
                    impl.fence_on(int(torch.cuda.current_stream().cuda_stream))
                    self._fenced.append(impl)
                else:
                    impl.wait_snapshot()
            except Error as e:  # a failed save has let go of the tensors too; report it via its ticket
                errors.append(e)
        return errors

    def _prune(self):
        self._pending = [(t, d) for t, d in self._pending if not t.snapshot_done()]
        self._fenced = [t for t in self._fenced if not t.snapshot_done()]

    @property
    def last_ticket(self):
        return self._last

    # ---- loading ----

    def load(self, state, step=None, objects_of_rank=None, strict_objects=False, required=False):
        """Fills the tensors of `state` in place from step `step` (default: the newest complete
        checkpoint, from the memory tier when it is at least as new as the disk's) and puts the
        saved non-tensor leaves back into their containers. Returns the step, or None when there is
        no complete checkpoint (required=True raises lifeline.Error NotFound instead, naming the
        directory: a mistyped path must not start training from scratch). The checkpoint may have
        been saved with any world size and layout: each tensor or Shard gets its region of the
        stored global tensor. `last_load` then holds step, from_memory_tier, saved_world_size,
        bytes_read, metadata, missing_objects and skip_steps (lifeline.skip_steps(): the steps whose
        data a rollback of lifeline-agent tells this launch to skip)."""
        self._load_began = _time.monotonic()
        targets = _state.LoadTargets(state)
        if step is None and self._dist is not None and not self._pinned:
            result = self._load_agreed(targets.specs, objects_of_rank)
        else:
            result = self._impl.load(None if step is None else int(step), targets.specs, objects_of_rank)
        if result is None:  # no complete checkpoint anywhere: a fresh start
            return self._loaded(None, [], required)
        targets.finish()
        missing = []
        _state.restore(state, dict(result["objects"]), missing)
        if strict_objects and missing:
            raise Error(f"NotFound: step {result['step']} holds no per-rank object for {', '.join(missing)}")
        return self._loaded(result, missing, required)

    def _loaded(self, result, missing_objects, required):
        """Records a finished load (None: there was no checkpoint) in last_load and returns its step."""
        if result is None:
            if required:
                e = Error(f"NotFound: no checkpoint in {self.directory} (required=True): is the path right?")
                e.code = "NotFound"
                raise e
            self.last_load = None
            self._announce(None)
            return None
        for s in result["skipped"]:
            _warnings.warn(f"lifeline: step {s['step']} ({s['location']}) could not be loaded, loaded step "
                           f"{result['step']} instead: {s['reason']}", RuntimeWarning, stacklevel=3)
        meta = result["metadata_json"]
        self.last_load = {
            "step": result["step"],
            "from_memory_tier": result["from_memory_tier"],
            "saved_world_size": result["saved_world_size"],
            "bytes_read": result["bytes_read"],
            "metadata": _json.loads(meta) if meta else None,
            "missing_objects": missing_objects,
            "skipped": result["skipped"],
            "skip_steps": skip_steps(),
        }
        self._announce(result["step"], "memory" if result["from_memory_tier"] else "disk")
        autotrace = _sys.modules.get("lifeline._autotrace")  # loaded only under lifeline-agent
        if autotrace is not None:
            autotrace.resumed_at(result["step"])
        return result["step"]

    def _load_agreed(self, specs, objects_of_rank, attempt=None):
        """Load(latest) on every rank of a torch.distributed job from one step: the newest that every
        rank sees complete (on disk or in its memory tier) and every rank loads; a step some rank
        cannot load is passed over by all, and reported in `skipped`. `attempt(step)` loads one
        candidate (default: `specs`), raising lifeline.Error on failure; without a process group the
        candidates are this rank's own (lifeline.torch loads in two phases this way)."""
        dist = self._dist
        if attempt is None:
            def attempt(candidate):
                return self._impl.load(candidate, specs, objects_of_rank)
        mine = sorted({c["step"] for tier in (False, True) for c in self._impl.list(tier) if c["complete"]},
                      reverse=True)[:64]
        views = [mine]
        if dist is not None:
            views = [None] * self.world_size
            dist.all_gather_object(views, mine)
        common = sorted(set(views[0]).intersection(*views[1:]), reverse=True)
        skipped = []
        for candidate in common:
            try:
                result, error = attempt(candidate), None
            except Error as e:
                result, error = None, (getattr(e, "code", None) or "Unknown", str(e))
            errors = [error]
            if dist is not None:
                errors = [None] * self.world_size
                dist.all_gather_object(errors, error)
            failed = [(r, e) for r, e in enumerate(errors) if e is not None]
            if not failed:
                result["skipped"] = skipped + result["skipped"]
                return result
            # The C++ rule decides, by code: only damage on some rank makes every rank try an older
            # step; a mismatch (a tensor the checkpoint lacks) or the machine's trouble stops the load.
            for rank, (code, message) in failed:
                if _lifeline.load_failure(code) != "damage":
                    e = Error(message if dist is None else f"rank {rank}: {message}")
                    e.code = code
                    raise e
            skipped.append({"step": candidate, "location": "any",
                            "reason": "; ".join(f"rank {r}: {m}" for r, (_, m) in failed)})
        if skipped:
            raise Error(f"NotFound: no checkpoint every rank can load; tried {[s['step'] for s in skipped]}: "
                        + skipped[0]["reason"])
        return None

    def _announce(self, step, source=None):
        # Tells lifeline-agent (if any) that this process has resumed, and from where, once: it times
        # restarts by it and checks the step against the one the launch was to resume from.
        if not self._announced:
            self._announced = True
            began = getattr(self, "_load_began", None)
            trace.process_start(step, source, None if began is None else _time.monotonic() - began)

    # ---- housekeeping ----

    def latest_step(self):
        """The newest complete step on disk, or None."""
        return self._impl.latest_step()

    def list(self, memory_tier=False):
        """Every checkpoint under the directory (or in the memory tier), newest first, as dicts."""
        return self._impl.list(bool(memory_tier))

    def flush(self):
        """Waits until every save so far is persisted; raises the first error among them."""
        self._impl.flush()
        self._pending = []
        self._fenced = []

    def collect_garbage(self):
        self._impl.collect_garbage()

    def wait_for_commit(self, step, timeout=600.0):
        self._impl.wait_for_commit(int(step), float(timeout))

    @property
    def memory_tier_directory(self):
        return self._impl.memory_tier_directory

    def inject_faults(self, fail_writes_after_bytes=-1, fail_syncs=False, fail_renames=False, paths_containing=""):
        """For tests: writes fail with ENOSPC after N more bytes, syncs or renames fail. Needs
        fault_injection=True at construction. Call with no arguments to heal."""
        self._impl.inject_faults(int(fail_writes_after_bytes), bool(fail_syncs), bool(fail_renames),
                                 str(paths_containing))

    def close(self, keep_memory_tier=False):
        """Waits for every save to be persisted, then releases the staging memory. Idempotent.
        An orderly close removes this rank's memory-tier snapshots that are on disk (unless
        memory_tier_cleanup_on_close=False); keep_memory_tier=True leaves them, as a crash would.
        Raises lifeline.Error when the newest save failed (after closing) and no wait on its ticket
        raised that already: the final state is not saved, and a script ending on it must not exit 0.
        A Checkpointer that is never closed (a process ending on an exception) keeps them too, so
        that its relaunch resumes from memory."""
        if not self._impl.closed:
            self._impl.close(bool(keep_memory_tier))
            self._say_memory_tier_problems()
        self._pending = []
        self._fenced = []
        # The newest save is the job's final state: a script must not end "successfully" without it
        # (a second job holding the directory, a full disk). Once per failure; not over another error.
        last = self._last
        if last is not None and not keep_memory_tier and not self._final_reported and not last.raised:
            self._final_reported = True
            error = last.error()
            if error is not None and last.phase != "skipped":
                raise Error(f"the last checkpoint (step {last.step}) was not saved: {error}")

    @property
    def closed(self):
        return self._impl.closed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # Leaving on an exception is not the end of the job: the relaunch wants the snapshots.
        self.close(keep_memory_tier=exc_type is not None)
        return False

    def __repr__(self):
        return f"<lifeline.Checkpointer {self.directory!r} rank {self.rank}/{self.world_size}>"


def guard_optimizer(optimizer, checkpointer):
    """Makes optimizer.step() wait for the snapshots of `checkpointer`'s pending saves first, so a
    lazy save never sees a half-updated state. Returns a handle whose remove() undoes it."""
    def before_step(*_args, **_kwargs):
        checkpointer.wait_snapshot()

    if hasattr(optimizer, "register_step_pre_hook"):  # torch >= 2.0
        return optimizer.register_step_pre_hook(lambda opt, args, kwargs: before_step())

    original = optimizer.step

    def step(*args, **kwargs):
        before_step()
        return original(*args, **kwargs)

    optimizer.step = step

    class _Handle:
        def remove(self):
            if optimizer.step is step:
                optimizer.step = original
    return _Handle()


def convert(src, dst, to, **options):
    """Converts `src` (a checkpoint directory, an HDF5 file, a safetensors file or a directory of
    safetensors shards) into `dst` as `to` = "hdf5", "safetensors" or "lifeline", streaming within
    `memory_budget`; the same conversion as `lifeline convert` (docs/cli.md, "Conversions").

    Options (None leaves the default): step (of a checkpoint source), memory_budget (bytes),
    select (prefixes of the source's tensor names), rename ("PATTERN=REPLACEMENT" or a list of
    those or of (pattern, replacement) pairs: a tensor whose whole name matches a pattern gets the
    replacement, $1.. its groups; the first matching rule decides, unmatched names are kept),
    rename_file (a file of such rules, one a line, '#' comments; its rules come after rename's),
    dtype ("bf16", "f16", "f32", "f64" or a torch dtype: every floating tensor cast to it,
    rounding to nearest even; integers and bool kept), force, deflate (hdf5, 0..9),
    max_shard_bytes (safetensors into a directory), out_step, ranks, tp, dp, codec, codec_level,
    direct_io (lifeline).
    Returns a dict: source, source_format, format, tensors, objects, bytes (written, in the output's
    dtypes), outputs, renamed and cast (lists of {source_name, name, source_dtype, dtype}), and for
    "lifeline" step, ranks, tp, dp, placement. Raises lifeline.Error; nothing is published then.
    """
    return _lifeline.convert(_os.fspath(src), _os.fspath(dst), to, options)


def describe_source(path, step=None):
    """What lifeline.convert() would read from `path`: a dict with format, description, step,
    saved_world_size, metadata (JSON text), tensors (name, dtype, shape) and objects (rank, name).
    Only metadata is read."""
    return _lifeline.describe_source(_os.fspath(path), {"step": step})

"""Step and collective tracing for lifeline-agent.

    with lifeline.trace.step(step):
        ...
        with lifeline.trace.collective("allreduce", grad.numel() * grad.element_size(), comm=dp_group_id):
            dist.all_reduce(grad, group=dp_group)

Events go to this rank's shared-memory ring when the process runs under lifeline-agent (which sets
LIFELINE_AGENT); otherwise every call returns at once. `comm` names a communicator (process group)
with an integer that every member uses alike (0: the world); the agent matches the n-th collective
on a communicator across its ranks to find who never joined it.
"""

import contextlib

from . import _lifeline

OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "send", "recv", "barrier")


def active():
    """True when events reach an agent."""
    return _lifeline.trace_active()


class step(contextlib.ContextDecorator):
    """Marks training step `n` (its beginning and its end) for the agent's hang and straggler detectors."""

    def __init__(self, n):
        self.n = int(n)

    def __enter__(self):
        _lifeline.trace_step_begin(self.n)
        return self

    def __exit__(self, *exc):
        _lifeline.trace_step_end(self.n)
        return False


class collective(contextlib.ContextDecorator):
    """Marks one collective: this rank entered it on enter, and completed it on exit.

    op: "allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "send",
    "recv", "barrier" (others are recorded as "other"); nbytes: this rank's payload."""

    def __init__(self, op, nbytes=0, comm=0):
        self.op = str(op)
        self.nbytes = int(nbytes)
        self.comm = int(comm)
        self.seq = 0

    def __enter__(self):
        self.seq = _lifeline.trace_collective_begin(self.op, self.nbytes, self.comm)
        return self

    def posted(self):
        """This rank's contribution has left (for split-phase collectives)."""
        if self.seq:
            _lifeline.trace_collective_posted(self.seq, self.comm)

    def __exit__(self, *exc):
        if self.seq:
            _lifeline.trace_collective_end(self.seq, self.comm)
        return False


def heartbeat():
    """Tells the agent this rank is alive outside steps (long evaluation, data loading)."""
    _lifeline.trace_heartbeat()


def process_start(resumed_step=None, source=None, load_seconds=None):
    """This process resumed from `resumed_step` (None: started fresh), read from `source` ("memory"
    for the memory tier, "disk", or None: not said), its load having taken `load_seconds` (None:
    not measured; the agent then counts the load in the relaunch). Checkpointer.load calls it."""
    _lifeline.trace_process_start(None if resumed_step is None else int(resumed_step), source or "",
                                  float(load_seconds or 0.0))


def process_exit():
    """An orderly end, so the agent does not mistake it for a crash."""
    _lifeline.trace_process_exit()


def dropped():
    """Events this process could not record because its ring was full."""
    return _lifeline.trace_dropped()


def dump(path, max_events=1000):
    """Writes the ring's newest events to `path` as JSON lines (raises lifeline.Error without an agent)."""
    _lifeline.trace_dump(str(path), int(max_events))


# ---- training signals -------------------------------------------------------------------------
#
# lifeline.report(loss=..., grad_norm=..., **scalars) sends one value per scalar and step to the
# agent's training-signal detectors (non-finite values, spikes, replicas that disagree). A value
# on a GPU is not read at once, which would make the CPU wait for the device every step: it is
# copied into pinned host memory on the current stream, an event is recorded behind the copy, and
# the value is sent by a later call (or at exit) once the event has completed, with the step it
# belongs to.

import sys as _sys
import threading as _threading

_SCALAR_IDS = {"loss": 0, "grad_norm": 1}  # name -> the id the ring carries (RegisterScalar)
_NO_STEP = 2**64 - 1
_MAX_IN_FLIGHT = 64      # device copies not yet complete; beyond, a value is dropped (counted)
_signals_lock = _threading.Lock()
_in_flight = []          # [(event, host tensor, id, step)], oldest first
_free_hosts = {}         # dtype -> [pinned 0-d tensors] ready for reuse
_signals_dropped = 0
_exit_flush_registered = False


def _scalar_id(name):
    sid = _SCALAR_IDS.get(name)
    if sid is None:
        if not isinstance(name, str):
            raise TypeError(f"lifeline.report: scalar names are strings, got {name!r}")
        try:
            sid = _lifeline.trace_register_scalar(name)
        except _lifeline.Error as e:
            raise ValueError(f"lifeline.report: {e}") from None
        _SCALAR_IDS[name] = sid
    return sid


_autotrace = None  # lifeline._autotrace once loaded (under the agent, when torch is imported)


def _step_now():
    """The step a value reported now belongs to: the Python tracing clock's when it counts steps
    (the open step, else the one that just ended), else the library's current step (lifeline.trace.step)."""
    global _autotrace
    autotrace = _autotrace or _sys.modules.get("lifeline._autotrace")
    if autotrace is not None:
        _autotrace = autotrace
        step = autotrace.signal_step()
        if step is not None:
            return step
    return _NO_STEP


def _drain(wait=False):
    """Sends the device values whose copies completed, oldest first (all of them with wait=True)."""
    while _in_flight:
        event, host, sid, step = _in_flight[0]
        if not wait and not event.query():
            return
        if wait:
            event.synchronize()
        _in_flight.pop(0)
        _lifeline.trace_scalar(sid, float(host), step)
        _free_hosts.setdefault(host.dtype, []).append(host)


def _flush_at_exit():
    try:
        with _signals_lock:
            _drain(wait=True)
    except Exception:
        pass


def _send_device(torch, sid, tensor, step):
    global _signals_dropped, _exit_flush_registered
    if len(_in_flight) >= _MAX_IN_FLIGHT:
        _signals_dropped += 1  # the device is that far behind: not worth a wait
        return
    free = _free_hosts.get(tensor.dtype)
    host = free.pop() if free else torch.empty((), dtype=tensor.dtype, pin_memory=True)
    stream = torch.cuda.current_stream(tensor.device)
    host.copy_(tensor.detach().reshape(()), non_blocking=True)
    event = torch.cuda.Event()
    event.record(stream)
    _in_flight.append((event, host, sid, step))
    if not _exit_flush_registered:
        _exit_flush_registered = True
        import atexit
        atexit.register(_flush_at_exit)


def _send(sid, value, step):
    """Sends one value now, or, for a device tensor, once its asynchronous copy has completed."""
    if isinstance(value, float):
        _lifeline.trace_scalar(sid, value, step)
        return
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and hasattr(value, "to_local"):  # a DTensor: its global value
            if any(type(p).__name__ == "Partial" for p in value.placements):
                value = value.full_tensor()  # a collective, as every rank's clip_grad_norm_ is
            else:
                value = value.to_local()
        if value.numel() != 1:
            raise ValueError(f"lifeline.report: a one-element tensor is needed, got shape {tuple(value.shape)}")
        if value.is_cuda:
            with _signals_lock:
                _send_device(torch, sid, value, step)
            return
        value = value.item()
    _lifeline.trace_scalar(sid, float(value), step)


def report(loss=None, grad_norm=None, *, step=None, **scalars):
    """Reports this step's training signals to lifeline-agent: `loss`, `grad_norm` (the global
    gradient norm; under lifeline-agent, torch.nn.utils.clip_grad_norm_ reports it by itself) and
    any other scalars by name (1-32 characters of A-Z a-z 0-9 _ . : / -). Each value is a number
    or a one-element tensor; a CUDA tensor is copied asynchronously and sent once the copy is done
    (a step or so later, never waiting for the device). `step`: the step the values belong to;
    default: the step Python tracing counts (the open one, else the one that just ended), or the
    one lifeline.trace.step marks. Without an agent it only checks the names and returns."""
    others = [(_scalar_id(name), value) for name, value in scalars.items() if value is not None] if scalars else ()
    if not _lifeline.trace_active():
        return
    at = _step_now() if step is None else int(step)
    if _in_flight:
        with _signals_lock:
            _drain()
    if loss is not None:
        _send(0, loss, at)
    if grad_norm is not None:
        _send(1, grad_norm, at)
    for sid, value in others:
        _send(sid, value, at)


def signals_dropped():
    """Device values not sent because their copies were still running many steps later."""
    return _signals_dropped

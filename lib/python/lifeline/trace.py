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

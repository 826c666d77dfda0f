"""Tracing of an unchanged PyTorch training script for lifeline-agent.

lifeline-agent puts lifeline_startup/sitecustomize.py on its ranks' Python path; that hook calls
install(module) here as soon as torch.distributed, torch.optim.optimizer or
torch.nn.parallel.distributed has been imported (a script that never imports torch never loads
this module). What is recorded, through lifeline.trace's ring API:

- collectives: every torch.distributed collective and point-to-point call, and the calls DDP's
  reducer makes on its process group (the gradient buckets' all-reduce, the bucket-rebuild
  broadcasts): the reducer is given a process group that records each call and passes it on to
  DDP's own (tested on torch 1.13 and 2.13; LIFELINE_DDP_TRACE=hook uses a comm hook doing what
  DDP's builtin reduction does instead, which costs a second pass over the gradients).
  An async call is posted when issued and ends when its work completes. The
  DTensor's functional collectives (tensor parallelism) are posted when called and end when their
  output is waited for; FSDP2's all-gathers and reduce-scatters are torch.distributed calls. The
  communicator is 0 for the world group, a stable id for any other group (a hash of its ranks),
  and the pair of ranks for point-to-point calls; every member numbers a communicator's calls alike.
- steps (LIFELINE_STEP_FROM=optimizer, the default; "none" records none): step k ends when
  optimizer.step() returns; it began at the first training forward of DDP or collective issued with
  autograd enabled after step k-1 ended, else at the optimizer.step() call. Step 0 is the first
  optimizer.step() call itself (before it, nothing tells training from set-up). Steps count from 0,
  or from the step after the checkpoint that lifeline loaded (so a relaunch goes on numbering); a
  script that saves step k+1 right after the clock's step k counts from 1, and the clock takes
  its numbers from then on.
  Time outside steps (evaluation under torch.no_grad(), set-up, shut-down) is never a step, so a
  long evaluation is not taken for a hang; collectives are traced throughout. Only the first
  optimizer that steps is the clock. A script that marks its own steps with lifeline.trace.step
  turns this off at its first step, and
  collectives inside its own lifeline.trace.collective scopes are not recorded twice.

- training signals: torch.nn.utils.clip_grad_norm_ reports the norm it returns as the step's
  grad_norm (lifeline.trace.report: a CUDA norm is read a step later, never waiting for the device;
  LIFELINE_REPORT_GRAD_NORM=0 turns it off). DDP's, FSDP2's and DTensor's norms come through it.

- start-up: a rank other than 0 initialising from the environment waits until rank 0's store takes
  a connection before init_process_group asks it (torch's client would retry a second later).

No patch changes what the patched call does or returns (async calls return the same work object,
except where a backend's work has no future; then a proxy ends the record on wait()). A failure in
the tracing itself is written once to stderr and tracing stops; the script goes on.
"""

import functools
import itertools
import os
import sys
import threading
import weakref
import zlib

from . import _lifeline
from . import trace as _trace

_begin = _lifeline.trace_collective_begin
_posted = _lifeline.trace_collective_posted
_end = _lifeline.trace_collective_end

_local = threading.local()  # .depth: traced calls open on this thread; .in_step: inside optimizer.step
_failed = False
_report_lock = threading.Lock()


def report(what, err):
    """Says once on stderr that tracing stopped, and stops it; never raises."""
    global _failed
    with _report_lock:
        if _failed:
            return
        _failed = True
    try:
        sys.stderr.write(f"lifeline: Python tracing stopped ({what}: {type(err).__name__}: {err}); "
                         "the script goes on untraced\n")
    except Exception:
        pass


# ---- steps ------------------------------------------------------------------------------------

def _making_optimizer_state():
    """Whether this optimizer.step() is one made to create an optimizer's state with zero gradients
    and lr 0 (torch.distributed.checkpoint.state_dict._init_optim_state, as get_state_dict and
    set_state_dict make for an optimizer that has not stepped; torchtitan's own init_optim_state
    before its saves and loads): a relaunch's load would otherwise count as step 0. Looked for only
    before training has begun."""
    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            return False
        if frame.f_code.co_name in ("_init_optim_state", "init_optim_state"):
            return True
        frame = frame.f_back
    return False


class _StepClock:
    """Step boundaries from optimizer.step(). Thread-compatible: used from the training thread."""

    def __init__(self, mode):
        self.enabled = mode == "optimizer"
        self.next = 0          # the number of the step to begin next
        self.open = False
        self.training = False  # an optimizer has stepped: forwards and collectives now begin steps
        self.owner = None      # () -> the optimizer whose steps count (the first to step)
        self.pending = None    # the next step's number, set by a load during a step

    def begin(self):
        """Training work started (a forward, a collective): the next step begins, if none is open."""
        if self.training and self.enabled and not self.open and not _failed:
            self.open = True
            _lifeline.trace_step_begin(self.next)

    def _is_owner(self, optimizer):
        owner = self.owner() if self.owner is not None else None
        if owner is None:
            try:
                self.owner = weakref.ref(optimizer)
            except TypeError:
                self.owner = lambda o=optimizer: o
            return True
        return owner is optimizer

    def before_step(self, optimizer):
        if self.enabled and not self.training and _making_optimizer_state():
            return  # not training: DCP making the optimizer's state before a load or a first save
        if self.enabled and self._is_owner(optimizer):
            self.training = True
            self.begin()

    def after_step(self, optimizer):
        if self.enabled and self.open and self._is_owner(optimizer):
            self.open = False
            _lifeline.trace_step_end(self.next)
            self.next += 1
            if self.pending is not None:
                self.next, self.pending = self.pending, None

    def resume(self, step):
        """A checkpoint of step `step` was loaded: the step after it comes next (applied once the
        open step, if any, has ended)."""
        if self.open:
            self.pending = step + 1
        else:
            self.next = step + 1

    def saved(self, step):
        """The script saved a checkpoint it calls `step` between two steps. Scripts that count steps
        from 1 (torchtitan, Megatron, the Hugging Face Trainer) name the step just finished one more
        than the clock, which counts from 0: from then on the clock uses the script's numbers, so
        that a hang names the step the script would. Any other difference is left alone."""
        if self.enabled and self.training and not self.open and step == self.next:
            self.next = step + 1

    def user_marks_steps(self):
        if self.enabled:
            if self.open:
                self.open = False
                _lifeline.trace_step_end(self.next)
            self.enabled = False


_mode = os.environ.get("LIFELINE_STEP_FROM", "optimizer").strip().lower() or "optimizer"
if _mode not in ("optimizer", "none"):
    sys.stderr.write(f"lifeline: LIFELINE_STEP_FROM={_mode!r} is not 'optimizer' or 'none'; using 'optimizer'\n")
    _mode = "optimizer"
_clock = _StepClock(_mode)
_torch = None  # the torch module, once install() saw it


def _grad_enabled():
    return _torch is not None and _torch.is_grad_enabled()


def saved_at(step):
    """Called by lifeline's saves (see _StepClock.saved)."""
    if step is not None and not _failed:
        _clock.saved(int(step))


def last_step():
    """The number of the newest step that ended (optimizer.step() returned), in the clock's
    numbering, which goes on from a loaded checkpoint's; None before training or without a clock."""
    if _failed or not _clock.enabled or not _clock.training or _clock.next == 0:
        return None
    return _clock.next - 1


def signal_step(begin=False):
    """The step a training signal reported now belongs to, by the clock: the open step, else the
    one that just ended (a loss logged after optimizer.step()), else, before the first
    optimizer.step(), the first step; None without a clock. begin=True: the caller is inside a
    training step (clip_grad_norm_), which begins it if none is open."""
    if _failed or not _clock.enabled:
        return None
    if not _clock.training:  # before the first optimizer.step(), which is the first step's
        return _clock.next
    if begin:
        _clock.begin()
    if _clock.open:
        return _clock.next
    return _clock.next - 1


def resumed_at(step):
    """Called by lifeline's loads: steps go on from the loaded checkpoint's, so that a relaunched
    job's steps continue the numbering of the one before it."""
    if step is not None and not _failed:
        _clock.resume(int(step))


# ---- communicators ----------------------------------------------------------------------------

_c10d = None             # torch.distributed.distributed_c10d
_all_reduce = None       # its all_reduce, untraced (the DDP comm hook records its own)
_groups = {}             # id(group) -> (group, comm id, sequence counter); the group is held so its id stays its own
_pairs = {}              # pair comm id -> sequence counter


def _stable_id(text):
    # Above 255: the library numbers communicators 0..255 itself; these are numbered here.
    return 256 + zlib.crc32(text.encode()) % (2**32 - 256)


def _group_ranks(group):
    get = getattr(_c10d, "get_process_group_ranks", None)
    if get is not None:
        return sorted(get(group))
    return sorted(_c10d._pg_group_ranks[group].keys())


def _group_registry():
    registry = getattr(_c10d, "_pg_group_ranks", None)
    if registry is None:
        registry = getattr(getattr(_c10d, "_world", None), "pg_group_ranks", {})
    return registry


def _is_world(group):
    return group is None or group is _c10d.GroupMember.WORLD


def _group_entry(group):
    entry = _groups.get(id(group))
    if entry is None:
        ranks = _group_ranks(group)
        # Groups over the same ranks are told apart by their order of creation, which every
        # member shares (new_group is called by all ranks in the same order).
        ordinal = 0
        for g in _group_registry():
            if g is group:
                break
            try:
                if _group_ranks(g) == ranks:
                    ordinal += 1
            except Exception:
                pass
        comm = _stable_id(f"group:{ordinal}:{','.join(map(str, ranks))}")
        entry = (group, comm, itertools.count(1))
        _groups[id(group)] = entry
    return entry


def _comm_seq(group):
    """(comm, seq) for a collective on `group`; seq 0: the library numbers it (the world)."""
    if _is_world(group):
        return 0, 0
    _, comm, counter = _group_entry(group)
    return comm, next(counter)


def _pair_comm_seq(group, peer):
    me = _c10d.get_rank()
    base = 0 if _is_world(group) else _group_entry(group)[1]
    lo, hi = min(me, int(peer)), max(me, int(peer))
    comm = _stable_id(f"p2p:{base}:{lo}:{hi}")
    counter = _pairs.get(comm)
    if counter is None:
        counter = _pairs.setdefault(comm, itertools.count(1))
    return comm, next(counter)


def _nbytes(x):
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    try:
        return x.numel() * x.element_size()
    except Exception:
        return 0


# ---- collectives ------------------------------------------------------------------------------

class _TracedWork:
    """A work whose backend gives no future: the record ends on wait(), on is_completed() being
    true, or when the work is dropped."""

    def __init__(self, work, seq, comm):
        self._work, self._seq, self._comm, self._open = work, seq, comm, True

    def _close(self):
        if self._open:
            self._open = False
            _end(self._seq, self._comm)

    def wait(self, *args, **kwargs):
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._close()

    def is_completed(self):
        done = self._work.is_completed()
        if done:
            self._close()
        return done

    def __getattr__(self, name):
        return getattr(self._work, name)

    def __del__(self):
        try:
            self._close()
        except Exception:
            pass


# ---- callbacks on communication threads -------------------------------------------------------
#
# A torch future runs the Python callbacks given to it on the thread that completes it (gloo's
# worker), and releases them there, taking the GIL each time. A thread that takes the GIL once the
# interpreter is finalizing is ended by Python in the middle of torch's C++, which aborts the
# process ("terminate called without an active exception"): a script that exits right after its
# last backward, with DDP's bucket callbacks still being released, died with SIGABRT about one
# run in four. So each callback holds a _Pending token, freed with the callback, and at exit
# (before finalization) the interpreter waits for every token, for at most _EXIT_WAIT_S. The
# worker thread goes on to release the finished work (and the tensors it held) just after our
# callback, which may need the GIL once more: a fixed 50 ms for it (2 runs in 30 of a DDP script
# aborted without it, none in 40 with it) still lost one FSDP2 run in a full test suite on 2 busy
# cores, where a worker can wait longer than that for a core. So after the tokens the exit waits
# until no other thread of the process is runnable (state R in /proc: running, or ready and waiting
# for a core) twice in a row, for at most _EXIT_QUIET_S: a worker still on its way to the GIL is
# runnable, one parked on its queue is not.

_pending = set()  # ids of the live tokens; set.add and set.discard are atomic under the GIL
_used = False     # whether any callback was ever given to a torch future
_EXIT_WAIT_S = 1.0  # a collective still in flight at exit will not finish for us; its callback is not waited on longer
_EXIT_GRACE_S = 0.01
_EXIT_QUIET_S = 0.5


class _Pending:
    __slots__ = ()

    def __init__(self):
        global _used
        _used = True
        _pending.add(id(self))

    def __del__(self):
        _pending.discard(id(self))


def _runnable_threads(me):
    """Threads of this process other than `me` (a native id) that are running or ready to run;
    None where /proc cannot tell."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    busy = 0
    for tid in tids:
        if tid == str(me):
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        # "tid (comm) S ...": the state follows the last ')', as comm may hold anything.
        if stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"R":
            busy += 1
    return busy


def _wait_for_callbacks():
    import time
    deadline = time.monotonic() + _EXIT_WAIT_S
    while _pending and time.monotonic() < deadline:
        time.sleep(0.001)  # lets the communication threads take the GIL and finish
    if not _used:
        return
    time.sleep(_EXIT_GRACE_S)
    me = threading.get_native_id()
    quiet, deadline = 0, time.monotonic() + _EXIT_QUIET_S
    while quiet < 2 and time.monotonic() < deadline:
        busy = _runnable_threads(me)
        if busy is None:
            time.sleep(0.05)  # no /proc: the old fixed grace
            return
        quiet = quiet + 1 if busy == 0 else 0
        time.sleep(0.002)


def _track(work, seq, comm, proxy=True):
    """Posted now, ended when `work` completes. A work without a future is wrapped in a proxy that
    ends the record on wait(); where the caller is torch's C++ (proxy=False), which needs the work
    itself, such a record ends at once."""
    _posted(seq, comm)
    try:
        future = work.get_future()
        future.add_done_callback(lambda _f, _token=_Pending(): _end(seq, comm))
        return work
    except Exception:
        if proxy:
            return _TracedWork(work, seq, comm)
        _end(seq, comm)
        return work


def _param_index(fn, name, fallback):
    import inspect
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return fallback
    return params.index(name) if name in params else fallback


def _arg(args, kwargs, name, index, default=None):
    if name in kwargs:
        return kwargs[name]
    if index is not None and index < len(args):
        return args[index]
    return default


def _wrap(fn, op, payload, always_async=False, peer=None, group_name="group"):
    """`fn` recording one collective `op` on its group; `payload`: the argument holding this
    rank's data; `peer`: "dst"/"src" for point-to-point calls."""
    payload_i = _param_index(fn, payload, 0) if payload else None
    group_i = _param_index(fn, group_name, None)
    async_i = _param_index(fn, "async_op", None)
    peer_i = _param_index(fn, peer, None) if peer else None

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        depth = getattr(_local, "depth", 0)
        if depth or _failed:
            return fn(*args, **kwargs)
        try:
            group = _arg(args, kwargs, group_name, group_i)
            if group is not None and _c10d._rank_not_in_group(group):
                return fn(*args, **kwargs)  # returns at once, nothing exchanged
            if peer:
                other = _arg(args, kwargs, peer, peer_i)
                if other is None:
                    return fn(*args, **kwargs)  # recv from any source: no pair to number it on
                comm, seq = _pair_comm_seq(group, other)
            else:
                comm, seq = _comm_seq(group)
            nbytes = _nbytes(_arg(args, kwargs, payload, payload_i)) if payload else 0
            if _grad_enabled():
                _clock.begin()
            seq = _begin(op, nbytes, comm, seq)
        except Exception as err:
            report(f"recording {fn.__name__}", err)
            return fn(*args, **kwargs)
        _local.depth = depth + 1
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            _end(seq, comm)  # the call is over for this rank (a timeout, a peer gone)
            raise
        finally:
            _local.depth = depth
        if result is not None and (always_async or _arg(args, kwargs, "async_op", async_i, False)):
            return _track(result, seq, comm)
        _end(seq, comm)
        return result

    traced._lifeline_traced = True
    return traced


# name in torch.distributed -> (op, payload argument, extra _wrap arguments)
_COLLECTIVES = {
    "all_reduce": ("allreduce", "tensor", {}),
    "all_reduce_coalesced": ("allreduce", "tensors", {}),
    "all_gather": ("allgather", "tensor", {}),
    "all_gather_into_tensor": ("allgather", "input_tensor", {}),
    "all_gather_single": ("allgather", "input_tensor", {}),  # what FSDP2 calls in torch 2.13
    "_all_gather_base": ("allgather", "input_tensor", {}),
    "all_gather_coalesced": ("allgather", "input_tensor_list", {}),
    "reduce_scatter": ("reducescatter", "input_list", {}),
    "reduce_scatter_tensor": ("reducescatter", "input", {}),
    "reduce_scatter_single": ("reducescatter", "input", {}),  # what FSDP2 calls in torch 2.13
    "_reduce_scatter_base": ("reducescatter", "input", {}),
    "broadcast": ("broadcast", "tensor", {}),
    "reduce": ("reduce", "tensor", {}),
    "barrier": ("barrier", None, {}),
    "monitored_barrier": ("barrier", None, {}),
    "all_to_all": ("alltoall", "input_tensor_list", {}),
    "all_to_all_single": ("alltoall", "input", {}),
    "gather": ("other", "tensor", {}),
    "scatter": ("other", "tensor", {}),
    "send": ("send", "tensor", {"peer": "dst"}),
    "recv": ("recv", "tensor", {"peer": "src"}),
    "isend": ("send", "tensor", {"peer": "dst", "always_async": True}),
    "irecv": ("recv", "tensor", {"peer": "src", "always_async": True}),
}


def _wrap_broadcast_coalesced(fn):
    # A builtin (no signature): (process_group, tensors, buffer_size, src). DDP syncs its module
    # state with it at construction and its buffers before every forward.
    @functools.wraps(fn)
    def traced(process_group, tensors, *args, **kwargs):
        if getattr(_local, "depth", 0) or _failed:
            return fn(process_group, tensors, *args, **kwargs)
        try:
            comm, seq = _comm_seq(process_group)
            seq = _begin("broadcast", _nbytes(list(tensors)), comm, seq)
        except Exception as err:
            report("recording _broadcast_coalesced", err)
            return fn(process_group, tensors, *args, **kwargs)
        _local.depth = 1
        try:
            return fn(process_group, tensors, *args, **kwargs)
        finally:
            _local.depth = 0
            _end(seq, comm)

    traced._lifeline_traced = True
    return traced


def install_distributed(dist):
    """Wraps torch.distributed's collectives, in the package and in distributed_c10d (whose own
    helpers, such as all_gather_object, call them by module-global name)."""
    global _c10d
    _c10d = dist.distributed_c10d
    for name, (op, payload, extra) in _COLLECTIVES.items():
        fn = getattr(_c10d, name, None)
        if fn is None or getattr(fn, "_lifeline_traced", False):
            continue
        traced = _wrap(fn, op, payload, **extra)
        setattr(_c10d, name, traced)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, traced)
    global _all_reduce
    _all_reduce = getattr(_c10d.all_reduce, "__wrapped__", _c10d.all_reduce)
    fn = getattr(dist, "_broadcast_coalesced", None)
    if fn is not None and not getattr(fn, "_lifeline_traced", False):
        dist._broadcast_coalesced = _wrap_broadcast_coalesced(fn)
    fn = getattr(_c10d, "init_process_group", None)
    if fn is not None and not getattr(fn, "_lifeline_traced", False):
        waiting = _wait_for_store_first(fn)
        _c10d.init_process_group = waiting
        if getattr(dist, "init_process_group", None) is fn:
            dist.init_process_group = waiting
    _install_user_scopes()


# ---- functional collectives ------------------------------------------------------------------
#
# DTensor (tensor parallelism's redistributions) calls torch.distributed._functional_collectives:
# each call starts the collective and returns its output at once (an AsyncCollectiveTensor), and
# the rank waits for it when the output is first used, through the module's wait_tensor. So the
# record is posted at the call and ends at that wait (on the output or a view of it), or when the
# output is freed unwaited: an open record would look like a rank stuck in a collective. An
# output that is not asynchronous was waited for inside the call.

# name in _functional_collectives -> op; the payload is the first argument, the group "group"
_FUNCTIONAL = {
    "all_reduce": "allreduce",
    "all_reduce_coalesced": "allreduce",
    "all_gather_tensor": "allgather",
    "all_gather_tensor_autograd": "allgather",
    "all_gather_single": "allgather",
    "all_gather_single_autograd": "allgather",
    "reduce_scatter_tensor": "reducescatter",
    "reduce_scatter_tensor_autograd": "reducescatter",
    "reduce_scatter_single": "reducescatter",
    "reduce_scatter_single_autograd": "reducescatter",
    "all_to_all_single": "alltoall",
    "all_to_all_single_autograd": "alltoall",
    "broadcast": "broadcast",
}
_awaited = {}  # output's storage -> (seq, comm) of a functional collective not yet waited for


def _storage_key(t):
    """What a collective's output and every view of it share (an AsyncCollectiveTensor re-wraps the
    views taken of it, and the wait may come through one of those)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:
        ptr = 0
    return ptr or id(t)


def _close_awaited(key):
    record = _awaited.pop(key, None)
    if record is not None:
        _end(*record)


def _wrap_functional(fn, op, module):
    group_i = _param_index(fn, "group", None)
    tag_i = _param_index(fn, "tag", None)

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        if getattr(_local, "depth", 0) or _failed or _c10d is None:
            return fn(*args, **kwargs)
        try:
            name = module._resolve_group_name(_arg(args, kwargs, "group", group_i), _arg(args, kwargs, "tag", tag_i, ""))
            group = _c10d._resolve_process_group(name)
            comm, seq = _comm_seq(None if group is _c10d.GroupMember.WORLD else group)
            if _grad_enabled():
                _clock.begin()
            seq = _begin(op, _nbytes(args[0] if args else None), comm, seq)
        except Exception as err:
            report(f"recording {fn.__name__}", err)
            return fn(*args, **kwargs)
        _local.depth = 1
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            _end(seq, comm)
            raise
        finally:
            _local.depth = 0
        output = getattr(result, "elem", None)  # an AsyncCollectiveTensor's output
        if output is None:
            _end(seq, comm)
            return result
        _posted(seq, comm)
        key = _storage_key(output)
        _awaited[key] = (seq, comm)
        weakref.finalize(output, _close_awaited, key).atexit = False
        return result

    traced._lifeline_traced = True
    return traced


def _wrap_wait(fn):
    @functools.wraps(fn)
    def traced(tensor, *args, **kwargs):
        try:
            return fn(tensor, *args, **kwargs)
        finally:
            if _awaited:
                _close_awaited(_storage_key(tensor))

    traced._lifeline_traced = True
    return traced


def install_functional(module):
    """Wraps the functional collectives DTensor calls, and the wait that ends them."""
    for name, op in _FUNCTIONAL.items():
        fn = getattr(module, name, None)
        if fn is not None and not getattr(fn, "_lifeline_traced", False):
            setattr(module, name, _wrap_functional(fn, op, module))
    fn = getattr(module, "wait_tensor", None)
    if fn is not None and not getattr(fn, "_lifeline_traced", False):
        module.wait_tensor = _wrap_wait(fn)


# ---- start-up ---------------------------------------------------------------------------------
#
# The ranks start together and rank 0's init_process_group opens the store the others join. A rank
# that asks first is refused, and torch's client tries again only a second later: most of a
# second of every launch and relaunch (tools/bench-restart: init_process_group 0.89 s in 2 runs of
# 3, 0.01 s in the third). So under the agent a rank other than 0 that initialises from the
# environment first waits until the store takes a connection, trying every 10 ms, then lets torch
# join at once. After _STORE_WAIT_S torch's own retries and timeout take over.

_STORE_POLL_S = 0.01
_STORE_WAIT_S = 60.0


def _store_to_wait_for(args, kwargs, init_i, rank_i, store_i):
    """(host, port) of the store rank 0 will open, when this rank should wait for it; else None."""
    if _arg(args, kwargs, "init_method", init_i) not in (None, "env://") or _arg(args, kwargs, "store", store_i) is not None:
        return None
    rank = _arg(args, kwargs, "rank", rank_i)
    if rank is None or rank == -1:
        rank = os.environ.get("RANK")
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if rank is None or int(rank) == 0 or not host or not port:
        return None
    return host, int(port)


def _wait_for_store(host, port):
    import socket
    import time
    deadline = time.monotonic() + _STORE_WAIT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(_STORE_POLL_S)


def _wait_for_store_first(fn):
    init_i = _param_index(fn, "init_method", 1)
    rank_i = _param_index(fn, "rank", None)
    store_i = _param_index(fn, "store", None)

    @functools.wraps(fn)
    def init_process_group(*args, **kwargs):
        if not _failed:
            try:
                store = _store_to_wait_for(args, kwargs, init_i, rank_i, store_i)
                if store is not None:
                    _wait_for_store(*store)
            except Exception as err:
                report("waiting for the store of init_process_group", err)
        return fn(*args, **kwargs)

    init_process_group._lifeline_traced = True
    return init_process_group


def _install_user_scopes():
    # The script's own lifeline.trace scopes take over from the automatic ones.
    step_enter = _trace.step.__enter__
    coll_enter, coll_exit = _trace.collective.__enter__, _trace.collective.__exit__
    if getattr(step_enter, "_lifeline_traced", False):
        return

    def step_enter_(self):
        _clock.user_marks_steps()
        return step_enter(self)

    def coll_enter_(self):
        _local.depth = getattr(_local, "depth", 0) + 1
        return coll_enter(self)

    def coll_exit_(self, *exc):
        _local.depth = max(getattr(_local, "depth", 1) - 1, 0)
        return coll_exit(self, *exc)

    step_enter_._lifeline_traced = True
    _trace.step.__enter__ = step_enter_
    _trace.collective.__enter__ = coll_enter_
    _trace.collective.__exit__ = coll_exit_


# ---- optimizer steps --------------------------------------------------------------------------

def _wrap_step(cls):
    step = cls.step
    if getattr(step, "_lifeline_traced", False):
        return

    @functools.wraps(step)
    def traced_step(self, *args, **kwargs):
        if getattr(_local, "in_step", False) or not _clock.enabled:
            return step(self, *args, **kwargs)  # an optimizer stepping another inside its step
        _clock.before_step(self)
        _local.in_step = True
        try:
            return step(self, *args, **kwargs)
        finally:
            _local.in_step = False
            _clock.after_step(self)

    traced_step._lifeline_traced = True
    cls.step = traced_step


def install_optimizer(module):
    """Step boundaries from optimizer.step(): torch's global step hooks where they exist (2.x),
    else each Optimizer subclass's step wrapped when its first instance is made (1.13)."""
    pre = getattr(module, "register_optimizer_step_pre_hook", None)
    post = getattr(module, "register_optimizer_step_post_hook", None)
    if pre is not None and post is not None:
        pre(lambda opt, args, kwargs: _clock.before_step(opt))
        post(lambda opt, args, kwargs: _clock.after_step(opt))
        return
    Optimizer = module.Optimizer
    init = Optimizer.__init__
    if getattr(init, "_lifeline_traced", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not _failed:
            try:
                _wrap_step(type(self))
            except Exception as err:
                report(f"wrapping {type(self).__name__}.step", err)

    __init__._lifeline_traced = True
    Optimizer.__init__ = __init__


# ---- DistributedDataParallel ------------------------------------------------------------------

_ONCE = "register_comm_hook or register_builtin_comm_hook can only be called once."


class _CommHookState:
    """Our hook's state: the DDP's process group, and the hook the script registered later."""

    def __init__(self, process_group):
        self.process_group = process_group
        self.user = None  # (hook, state) once the script registered its own

    def __reduce__(self):  # DDP may be pickled; the hook state is rebuilt, not saved
        return (_CommHookState, (None,))


def _comm_hook(state, bucket):
    # Runs in backward, so a step is under way. Without a hook of the script's, the bucket is
    # averaged as DDP's builtin reduction does it (times 1/size, then summed: the same numbers)
    # and recorded with one callback, which also ends the record.
    _clock.begin()
    if state.user is not None:
        hook, user_state = state.user
        return hook(user_state, bucket)
    group = state.process_group if state.process_group is not None else _c10d.GroupMember.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / group.size())
    comm, seq = _comm_seq(group)
    seq = _begin("allreduce", tensor.numel() * tensor.element_size(), comm, seq)
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        future = _all_reduce(tensor, group=group, async_op=True).get_future()
    except BaseException:
        _end(seq, comm)
        raise
    finally:
        _local.depth -= 1
    _posted(seq, comm)

    def done(f, _token=_Pending()):
        _end(seq, comm)
        return f.value()[0]

    return future.then(done)


# The reducer's process group. DDP's builtin reduction scales each gradient by 1/size while
# copying it into its bucket; any comm hook loses that fusion and scales the bucket in a second
# pass (about 1 ms per step for resnet18's 45 MB on this machine's cores, 1-3% of a small step).
# So by default DDP keeps its builtin reduction and its reducer is handed a process group that
# records each call it makes and passes it on to DDP's own group: results are DDP's own, bit for
# bit, and tracing costs one Python call per bucket.

def _ddp_trace_mode():
    mode = os.environ.get("LIFELINE_DDP_TRACE", "").strip().lower()
    if mode in ("group", "hook"):
        return mode
    if mode:
        sys.stderr.write(f"lifeline: LIFELINE_DDP_TRACE={mode!r} is not 'group' or 'hook'; using the default\n")
    # Measured (tools/bench-python-tracing, resnet18, 2 gloo ranks): the hook's second pass costs
    # +2.2% of a step on torch 1.13 and +4.1% on 2.13, the group nothing measurable on either.
    return "group"


def _traced_group_class(base):
    class TracedGroup(base):
        """Records the calls DDP's reducer makes on `group` and passes them on."""

        def __init__(self, group):
            super().__init__(group.rank(), group.size())
            self._group = group
            # Not the inner group's name: torch 1.13's DDP logger takes a group named "gloo" for
            # its own gloo class and reads its fields.
            self._name = "lifeline:" + group.name()

        def getBackendName(self):
            return self._name

        def _record(self, op, call, payload, *args):
            if getattr(_local, "depth", 0) or _failed:
                return call(*args)
            try:
                comm, seq = _comm_seq(self._group)
                _clock.begin()  # the reducer calls from backward or forward: a step is under way
                seq = _begin(op, _nbytes(payload), comm, seq)
            except Exception as err:
                report(f"recording DDP's {op}", err)
                return call(*args)
            _local.depth = 1
            try:
                work = call(*args)
            except BaseException:
                _end(seq, comm)
                raise
            finally:
                _local.depth = 0
            return _track(work, seq, comm, proxy=False)

        def allreduce(self, tensors, *opts):
            return self._record("allreduce", self._group.allreduce, tensors, tensors, *opts)

        def allreduce_coalesced(self, tensors, *opts):
            return self._record("allreduce", self._group.allreduce_coalesced, tensors, tensors, *opts)

        def broadcast(self, tensors, *opts):
            return self._record("broadcast", self._group.broadcast, tensors, tensors, *opts)

        def allgather(self, outputs, inputs, *opts):
            return self._record("allgather", self._group.allgather, inputs, outputs, inputs, *opts)

        def barrier(self, *opts):
            return self._record("barrier", self._group.barrier, None, *opts)

    return TracedGroup


_fell_back = False


def _fallback_to_hook(err):
    """Said once on stderr: DDP's gradients are traced through the comm hook instead."""
    global _fell_back
    if not _fell_back:
        _fell_back = True
        try:
            sys.stderr.write(f"lifeline: DDP traced through a comm hook (a traced process group could not "
                             f"be made: {type(err).__name__}: {err})\n")
        except Exception:
            pass


def _traced_reducer_class(dist):
    Reducer = dist.Reducer
    TracedGroup = _traced_group_class(dist.ProcessGroup)
    group_at = 3  # Reducer(params, bucket_indices, bucket_size_limits, process_group, ...)

    class TracedReducer(Reducer):
        def __init__(self, *args, **kwargs):
            group = None
            if not _failed and len(args) > group_at:
                try:
                    group = TracedGroup(args[group_at])
                    args = args[:group_at] + (group,) + args[group_at + 1:]
                except Exception as err:  # DDP then traces through the comm hook
                    group = None
                    _fallback_to_hook(err)
            super().__init__(*args, **kwargs)
            # The C++ reducer holds the group; its Python half must live as long for the calls
            # to reach the methods above.
            self._lifeline_group = group

    TracedReducer.__name__ = TracedReducer.__qualname__ = Reducer.__name__
    TracedReducer._lifeline_traced = True
    return TracedReducer


def _name_comm_hook(ddp, name):
    # DDP's usage logging records the hook's name; not every version has the setter.
    setter = getattr(getattr(ddp, "logger", None), "_set_comm_hook_name", None)
    if setter is not None:
        setter(name)


def install_ddp(module):
    """DDP's reducer traced through a recording process group (group mode), else through a comm
    hook registered at construction, which a later register_comm_hook (or
    register_builtin_comm_hook) by the script replaces, once, as the original would allow; a
    training forward begins the step."""
    DDP = module.DistributedDataParallel
    init = DDP.__init__
    if getattr(init, "_lifeline_traced", False):
        return
    register, register_builtin, forward = DDP.register_comm_hook, DDP._register_builtin_comm_hook, DDP.forward
    import torch.distributed as dist

    if _ddp_trace_mode() == "group" and not getattr(dist.Reducer, "_lifeline_traced", False):
        dist.Reducer = _traced_reducer_class(dist)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        reducer = getattr(self, "reducer", None)
        if _failed or reducer is None or getattr(reducer, "_lifeline_group", None) is not None:
            return
        try:
            state = _CommHookState(self.process_group)
            dist._register_comm_hook(self.reducer, state, _comm_hook)
            self.__dict__["_lifeline_comm_hook"] = state
        except Exception as err:
            report("registering the DDP comm hook", err)

    @functools.wraps(register)
    def register_comm_hook(self, state, hook):
        ours = self.__dict__.get("_lifeline_comm_hook")
        if ours is None:
            return register(self, state, hook)
        if ours.user is not None:
            raise RuntimeError(_ONCE)
        check = getattr(self, "_check_comm_hook", None)  # DDP's own validation, where it has one
        if check is not None:
            check(hook)
        _name_comm_hook(self, getattr(hook, "__qualname__", repr(hook)))
        ours.user = (hook, state)

    @functools.wraps(register_builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):
        ours = self.__dict__.get("_lifeline_comm_hook")
        if ours is None:
            return register_builtin(self, comm_hook_type)
        if ours.user is not None:
            raise RuntimeError(_ONCE)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        kinds = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                 dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        if comm_hook_type not in kinds:
            raise ValueError(f"lifeline tracing: unknown builtin comm hook {comm_hook_type}")
        _name_comm_hook(self, str(comm_hook_type))
        ours.user = (kinds[comm_hook_type], self.process_group)

    @functools.wraps(forward)
    def traced_forward(self, *args, **kwargs):
        if _grad_enabled():
            _clock.begin()
        return forward(self, *args, **kwargs)

    __init__._lifeline_traced = True
    DDP.__init__ = __init__
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook
    DDP.forward = traced_forward


# ---- training signals -------------------------------------------------------------------------

def _report_norms():
    return os.environ.get("LIFELINE_REPORT_GRAD_NORM", "1").strip().lower() not in ("0", "false", "no", "off")


def install_clip_grad(module):
    """torch.nn.utils.clip_grad_norm_ reports the norm it returns as the step's grad_norm (FSDP2's
    and DTensor's norms come through it too). Patched as the module is imported, before
    torch.nn.utils takes the name from it; clip_grad_norm (deprecated) calls it. A CUDA norm is read
    a step later, without waiting for the device (lifeline.trace.report)."""
    clip = module.clip_grad_norm_
    if getattr(clip, "_lifeline_traced", False) or not _report_norms():
        return

    @functools.wraps(clip)
    def clip_grad_norm_(*args, **kwargs):
        norm = clip(*args, **kwargs)
        if not _failed:
            try:
                _trace.report(grad_norm=norm, step=signal_step(begin=True))
            except Exception as err:
                report("reporting the gradient norm of clip_grad_norm_", err)
        return norm

    clip_grad_norm_._lifeline_traced = True
    module.clip_grad_norm_ = clip_grad_norm_
    utils = sys.modules.get("torch.nn.utils")  # when the hook came after torch.nn.utils took the name
    if utils is not None and getattr(utils, "clip_grad_norm_", None) is clip:
        utils.clip_grad_norm_ = clip_grad_norm_


# ---- entry ------------------------------------------------------------------------------------

_INSTALLERS = {
    "torch.distributed": install_distributed,
    "torch.distributed._functional_collectives": install_functional,
    "torch.optim.optimizer": install_optimizer,
    "torch.nn.parallel.distributed": install_ddp,
    "torch.nn.utils.clip_grad": install_clip_grad,
}
MODULES = tuple(_INSTALLERS)


def install(name, module):
    """Patches `module` (one of MODULES), just imported. Never raises."""
    global _torch
    # A spare interpreter (LIFELINE_PRESTART=1) imports torch before the agent hands it a rank:
    # tracing is decided when it has one, and its modules are patched now, as they are imported.
    if _failed or not (_lifeline.trace_active() or os.environ.get("LIFELINE_PRESTART") == "1"):
        return
    try:
        if _torch is None:
            _torch = sys.modules.get("torch")
            import atexit
            atexit.register(_wait_for_callbacks)
        _INSTALLERS[name](module)
    except Exception as err:
        report(f"patching {name}", err)

"""lifeline-agent's startup hook for Python ranks (on their PYTHONPATH, put there by the agent).

Under the agent (LIFELINE_AGENT set) it arranges for lifeline._autotrace to patch torch.distributed,
torch.optim, DistributedDataParallel and clip_grad_norm_ right after each is imported, so an unchanged training
script reports its steps and collectives. Nothing is imported until the script imports torch, so a
Python command that never does pays nothing. Outside the agent it does nothing. Either way it then
runs the next `sitecustomize` on sys.path, so the user's own still runs. An error in the hook is
said once on stderr and never stops the script.
"""

import os
import sys


def _say(what, err):
    try:
        sys.stderr.write(f"lifeline: Python tracing is off ({what}: {type(err).__name__}: {err}); "
                         "the script runs untraced\n")
    except Exception:
        pass


class _AfterImport:
    """A meta path finder that lets the usual finders find the modules lifeline patches, and
    patches each right after it has executed."""

    def __init__(self, package_root):
        self._root = package_root
        self._busy = False
        self._autotrace = None
        self._broken = False
        self._names = {"torch.distributed", "torch.distributed._functional_collectives", "torch.optim.optimizer",
                       "torch.nn.parallel.distributed", "torch.nn.utils.clip_grad"}

    def find_spec(self, name, path, target=None):
        if name not in self._names or self._busy or self._broken:
            return None
        self._busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            loader.__dict__.pop("exec_module", None)  # the loader is this module's alone
            run(module)
            self._patch(name, module)

        try:
            loader.exec_module = exec_module
        except Exception:
            pass  # a loader that takes no attributes: the module is left untraced
        return spec

    def _patch(self, name, module):
        try:
            if self._autotrace is None:
                self._autotrace = _import_autotrace(self._root)
            self._autotrace.install(name, module)
        except Exception as err:
            self._broken = True
            _say(f"patching {name}", err)


def _import_autotrace(root):
    import importlib
    try:
        return importlib.import_module("lifeline._autotrace")
    except ImportError:
        if "lifeline" in sys.modules:
            raise
    # The agent's own package, after anything the script's path holds.
    if root not in sys.path:
        sys.path.append(root)
    return importlib.import_module("lifeline._autotrace")


_stack_file = None  # kept open for faulthandler


def _stacks_on_dump_signal():
    """On the agent's dump signal (before it kills a hung rank), Python's faulthandler writes every
    thread's stack to stack.RANK.PID.txt in the agent's directory; the library's ring dump runs
    first and then calls it."""
    global _stack_file
    import faulthandler
    import signal
    sig = int(os.environ.get("LIFELINE_DUMP_SIGNAL") or signal.SIGUSR2)
    if sig <= 0 or signal.getsignal(sig) not in (signal.SIG_DFL, None):
        return  # the script's own
    path = os.path.join(os.environ["LIFELINE_AGENT"], f"stack.{os.environ.get('RANK', 'x')}.{os.getpid()}.txt")
    _stack_file = open(path, "w")
    faulthandler.register(sig, file=_stack_file, all_threads=True, chain=False)

    def _remove_if_unused(f=_stack_file, path=path, pid=os.getpid()):
        try:  # a process that was never asked leaves no empty file behind (a forked worker none)
            if os.getpid() == pid and f.tell() == 0 and os.fstat(f.fileno()).st_size == 0:
                os.unlink(path)
        except OSError:
            pass
    import atexit
    atexit.register(_remove_if_unused)


def _install(here):
    if not os.environ.get("LIFELINE_AGENT"):
        return
    if os.environ.get("LIFELINE_PRESTART") != "1":  # a spare learns its rank later: activate()
        try:
            _stacks_on_dump_signal()
        except Exception as err:
            _say("registering the stack dump", err)
    tracing = os.environ.get("LIFELINE_PYTHON_TRACING", "1").strip().lower()
    if tracing in ("0", "false", "no", "off"):
        return
    try:
        sys.meta_path.insert(0, _AfterImport(os.path.dirname(here)))
    except Exception as err:
        _say("installing the import hook", err)


def _chain(here):
    """Runs the next sitecustomize on sys.path as Python's site module would have."""
    import importlib.machinery
    import importlib.util
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    except Exception:
        spec = None
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        if sys.flags.verbose:
            sys.excepthook(*sys.exc_info())
        else:
            sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                             f"{type(err).__name__}: {err}\n")


def activate():
    """Called by a spare interpreter (_lifeline_prestart.py) once the agent handed it a rank's
    environment: what _install left for the rank to do. The import hook is in place already, so the
    modules the spare imported ahead were patched as they were imported, as in any rank."""
    if not os.environ.get("LIFELINE_AGENT"):
        return
    try:
        _stacks_on_dump_signal()
    except Exception as err:
        _say("registering the stack dump", err)


def _main():
    here = os.path.dirname(os.path.abspath(__file__))
    # Reachable by the spare's bootstrap after _chain hands the name sitecustomize to the next one.
    sys.modules["_lifeline_startup_hook"] = sys.modules.get(__name__)
    try:
        _install(here)
    except Exception as err:
        _say("startup hook", err)
    _chain(here)


_main()

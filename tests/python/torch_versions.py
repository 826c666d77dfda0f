"""What the torch under test has: the torch 2.x tests skip themselves, saying why, under a torch
without public DTensor and FSDP2 (Debian 12's 1.13, whose FSDP package does not even import on
Python 3.11).

Decided when first asked, not when imported: a test file whose own process never uses torch (it
starts jobs under the agent) imports torch only for the tests that need FSDP2, when they run
(`needs_fsdp2`); `NO_FSDP2` is the reason (None: there is FSDP2), for files that import torch
themselves anyway."""
import functools

_UNDECIDED = object()
_reason = _UNDECIDED


def no_fsdp2():
    """None when this torch has public DTensor and FSDP2, else why not."""
    global _reason
    if _reason is _UNDECIDED:
        import torch
        try:
            from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
            from torch.distributed.fsdp import fully_shard  # noqa: F401
            from torch.distributed.tensor import DTensor  # noqa: F401
            _reason = None
        except Exception as e:  # ImportError, or 1.13's ValueError from a dataclass on Python 3.11
            _reason = f"torch {torch.__version__} has no public DTensor and FSDP2 ({type(e).__name__}: {e})"
    return _reason


def needs_fsdp2(test):
    """A unittest method, or a TestCase class, that skips itself saying why under a torch without
    DTensor and FSDP2, deciding when it runs."""
    if isinstance(test, type):
        set_up = test.setUp

        def setUp(self):
            reason = no_fsdp2()
            if reason:
                self.skipTest(reason)
            set_up(self)

        test.setUp = setUp
        return test

    @functools.wraps(test)
    def run(self, *args, **kwargs):
        reason = no_fsdp2()
        if reason:
            self.skipTest(reason)
        return test(self, *args, **kwargs)

    return run


def __getattr__(name):
    if name == "NO_FSDP2":
        return no_fsdp2()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

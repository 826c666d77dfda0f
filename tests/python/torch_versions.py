"""What the torch under test has: the torch 2.x tests skip themselves, saying why, under a torch
without public DTensor and FSDP2 (Debian 12's 1.13, whose FSDP package does not even import on
Python 3.11)."""
import torch

try:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    from torch.distributed.tensor import DTensor  # noqa: F401
    NO_FSDP2 = None
except Exception as e:  # ImportError, or 1.13's ValueError from a dataclass on Python 3.11
    NO_FSDP2 = f"torch {torch.__version__} has no public DTensor and FSDP2 ({type(e).__name__}: {e})"

"""torchtitan's trainer (`python -m torchtitan.train`, its arguments unchanged) on CPU over gloo,
for tests/python/test_torchtitan.py.

What stops torchtitan 0.3.0 with torch 2.13.0 (PyPI's CPU wheel) on a machine without an
accelerator, and what this wrapper does about each before torchtitan is imported; nothing of the
trainer's checkpointing is touched:

1. Its device is chosen at import: torchtitan/tools/utils.py, get_device_info(),
   `device_type = _get_available_device_type() or "cuda"`, so the trainer stops at
   torchtitan/trainer.py, Trainer.__init__, `device_module.set_device(self.device)` (torch.cuda on
   a CPU-only torch), and the process group would be NCCL (torchtitan/distributed/utils.py,
   init_distributed). Here it is "cpu", with torch.cpu standing in for torch.cuda (the memory
   statistics torchtitan's metrics read reported as unknown), so the process group is gloo.
2. torchtitan/trainer.py imports torchtitan/distributed/minimal_async_ep/kernels.py (expert
   parallelism), whose line 10 is `import triton`, which torchtitan does not declare and torch's
   CPU wheel does not bring: without triton that module is replaced by one whose kernels raise
   (the dense debug model never calls them).
3. torchtitan/distributed/utils.py, set_pg_timeouts (after the first step), calls
   torch.distributed.set_timeout, public after torch 2.13, which has it as _set_pg_timeout.
4. torchtitan sets FSDP's gradient divide factor to 1 (torchtitan/distributed/fsdp.py,
   disable_fsdp_gradient_division), so FSDP2 reduce-scatters with ReduceOp.PREMUL_SUM, which gloo
   does not have: FSDP's sum reduction is forced instead (the same arithmetic).
5. Attention: see tests/python/titan_cpu_attention.py, a torchtitan override on the command line.
   And the default SPMD backend "spmd_types" fails in fully_shard with torch 2.13 ("When
   dp_mesh_dims is provided, all parameters must be DTensors on the full SPMD mesh"): the test
   runs `--parallelism.spmd_backend partial_dtensor`, a torchtitan option.
6. Pipeline parallelism: torchtitan/trainer.py, pp_forward_backward_step, calls
   `pp_schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)`, a signature of torch releases
   after 2.13 (see below); such calls go to the schedule's _step_microbatches.

torch.compile is turned off (TORCHDYNAMO_DISABLE): torchtitan compiles create_block_mask, which
costs seconds per launch on CPU and gives the same masks.

For the test it also prints, after each optimizer step, `TITAN rank R step K loss L params P`
(L the step's global loss and P a digest of the rank's share of the model's state dict, both exact), and with
TITAN_KILL_AT=K, SIGKILLs rank TITAN_KILL_RANK (default 1) in the forward of step K on the first
launch (LIFELINE_RESTART 0), with TITAN_KILL_AFTER_SAVE=1 once the previous checkpoint is durable.
"""
import hashlib
import importlib.util
import inspect
import os
import signal
import sys
import types

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402


def _cpu_device_module():
    """torch.cpu with what torchtitan asks of torch.cuda (device properties, memory statistics)."""
    m = types.SimpleNamespace()
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(m, name, getattr(torch.cpu, name))
    m.set_device = lambda device: None
    m.current_device = lambda: 0
    m.device_count = lambda: 1
    m.get_device_name = lambda device=None: "cpu"
    m.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=os.sysconf("SC_PAGE_SIZE") *
                                                                        os.sysconf("SC_PHYS_PAGES"), name="cpu")
    m.memory_stats = lambda device=None: {}
    m.reset_peak_memory_stats = lambda device=None: None
    m.empty_cache = lambda: None
    m.synchronize = lambda device=None: None
    return m


def _kernels_without_triton():
    """torchtitan's expert-parallel kernels as a module whose kernels raise: the real one imports
    triton, which the dense debug model never calls and torch's CPU wheel does not bring."""
    m = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")

    def needs_triton(*_args, **_kwargs):
        raise RuntimeError("torchtitan's MinimalAsyncEP kernels need triton, which is not installed")
    def kernel(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return needs_triton
    m.__getattr__ = kernel
    return m


if importlib.util.find_spec("triton") is None:
    sys.modules["torchtitan.distributed.minimal_async_ep.kernels"] = _kernels_without_triton()

# torchtitan 0.3 calls torch.distributed.set_timeout (torchtitan/distributed/utils.py, set_pg_timeouts,
# after the first step), public in torch releases after 2.13, whose name for it is _set_pg_timeout.
if not hasattr(torch.distributed, "set_timeout"):
    from torch.distributed.distributed_c10d import _set_pg_timeout
    torch.distributed.set_timeout = _set_pg_timeout


# torchtitan sets FSDP's gradient divide factor to 1 (it scales gradients by the global token count
# itself), which FSDP2 turns into a reduce-scatter with ReduceOp.PREMUL_SUM(1.0), and gloo has no
# PREMUL_SUM ("Cannot use ReduceOp.PREMUL_SUM with Gloo"). FSDP's sum reduction with a division by
# 1 after it is the same arithmetic.
from torch.distributed.fsdp import FSDPModule  # noqa: E402

_set_gradient_divide_factor = FSDPModule.set_gradient_divide_factor


def _set_gradient_divide_factor_with_sum(self, factor):
    _set_gradient_divide_factor(self, factor)
    self.set_force_sum_reduction_for_comms(True)


FSDPModule.set_gradient_divide_factor = _set_gradient_divide_factor_with_sum


# Pipeline parallelism: torchtitan 0.3 (trainer.py, pp_forward_backward_step) hands its schedule
# the microbatches it has split itself, `pp_schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)`,
# a signature of torch releases after 2.13, whose PipelineScheduleSingle/Multi.step take the whole
# batch and split it (torch/distributed/pipelining/schedules.py): the model got `arg_mbs` as a
# keyword argument of one microbatch ("Expecting 2 arg_mbs but got 1"). Such calls go to the
# schedule's _step_microbatches, which takes split microbatches in 2.13, after what step() does first.
def _step_taking_microbatches(step):
    def stepping(self, *args, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None, return_outputs=True,
                 loss_kwargs=None, **kwargs):
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return step(self, *args, losses=losses, return_outputs=return_outputs, loss_kwargs=loss_kwargs, **kwargs)
        stages = self._stages if hasattr(self, "_stages") else [self._stage]
        for stage in stages:
            stage.has_backward = self._has_backward
            stage.clear_runtime_states()
        self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs)
        for stage in stages:
            if stage.is_last and return_outputs:
                return self._merge_outputs(stage.output_chunks)
        return None
    return stepping


from torch.distributed.pipelining import schedules as _schedules  # noqa: E402

for _schedule in (_schedules.PipelineScheduleSingle, _schedules.PipelineScheduleMulti):
    if "arg_mbs" not in inspect.signature(_schedule.step).parameters:
        _schedule.step = _step_taking_microbatches(_schedule.step)

import torchtitan.tools.utils as _titan_utils  # noqa: E402  (before any module that copies its names)

_titan_utils.device_type, _titan_utils.device_module = "cpu", _cpu_device_module()

from torchtitan import train  # noqa: E402
from torchtitan.components.metrics import MetricsProcessor  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

_losses = {}


def _digest(model_parts):
    """A digest of the rank's share of the model's state dict (the names torchtitan checkpoints)."""
    h = hashlib.sha256()
    for part in model_parts:
        for name, p in sorted(part.state_dict().items()):
            local = p.to_local() if hasattr(p, "to_local") else p
            h.update(name.encode())
            h.update(local.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


_log = MetricsProcessor.log


def _log_loss(self, step, global_avg_loss, *args, **kwargs):
    _losses[step] = float(global_avg_loss)
    return _log(self, step, global_avg_loss, *args, **kwargs)


_train_step = Trainer.train_step


def _traced_train_step(self, *args, **kwargs):
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    kill_at = int(os.environ.get("TITAN_KILL_AT", "0"))
    if kill_at == self.step and rank == int(os.environ.get("TITAN_KILL_RANK", "1")) \
            and os.environ.get("LIFELINE_RESTART", "0") == "0":
        if os.environ.get("TITAN_KILL_AFTER_SAVE") == "1":
            self.checkpointer.maybe_wait_for_saving()
        step = self.step

        def kill(_module, _inputs):
            print(f"TITAN rank {rank} killed at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        # Killed in the step's forward, at the final norm: the layers before it needed every
        # rank's all-gathers of this step, so every other rank has finished (and printed) the
        # step before, and none can finish this one.
        self.model_parts[-1].norm.register_forward_pre_hook(kill)
    result = _train_step(self, *args, **kwargs)
    loss = _losses.get(self.step)
    print(f"TITAN rank {rank} step {self.step} loss {loss.hex() if loss is not None else None} "
          f"params {_digest(self.model_parts)}", flush=True)
    return result


MetricsProcessor.log = _log_loss
Trainer.train_step = _traced_train_step

if __name__ == "__main__":
    sys.argv[0] = "torchtitan.train"
    train.main()

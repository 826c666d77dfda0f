"""Lifeline as torchtitan's checkpointer (torchtitan 0.3, torch 2.13).

Selected by torchtitan's own config, with no change to torchtitan or to its config functions:
its override mechanism (`--override.imports`) swaps the `checkpoint` node of the trainer's config
for LifelineCheckpointManager.Config, keeping every `--checkpoint.*` setting:

    torchrun --nproc-per-node 8 -m torchtitan.train --module llama3 --config llama3_8b \\
        --checkpoint.enable --checkpoint.interval 500 --checkpoint.async_mode async \\
        --override.imports lifeline.torchtitan.checkpoint_with_lifeline

Lifeline's own options (those of lifeline.Checkpointer: memory_tier, codec, ...) ride on the
override as JSON: `--override.imports 'lifeline.torchtitan.checkpoint_with_lifeline={"codec": "zstd"}'`.
A config function of one's own may instead set `checkpoint=LifelineCheckpointManager.Config(...)`.
Under lifeline-agent, give the agent the same directory: `--checkpoint-dir DUMP/checkpoint`.

What the manager does, against torchtitan's CheckpointManager:

- The checkpoint folder (`dump_folder`/`checkpoint.folder`) is one Lifeline checkpoint directory;
  each save is one of its steps, numbered as torchtitan numbers training steps. The state is the
  one torchtitan's DCP manager saves (the model's state flattened, optimizer, lr scheduler,
  dataloader and train state), saved with dcp.save / dcp.async_save through
  lifeline.dcp.StorageWriter and loaded with dcp.load through lifeline.dcp.StorageReader, so
  DTensors reshard on load to any mesh. `lifeline ls/verify/inspect/convert` work on the folder.
- `checkpoint.async_mode` "async" (or "async_with_pinned_mem": DCP's process mode, which cannot
  hold Lifeline's snapshot, is not used) saves with dcp.async_save on a gloo group of its own:
  save() returns once the state is registered; Lifeline copies it while the next step's forward
  and backward run, and torchtitan's maybe_wait_for_staging (called before optimizer.step) waits
  for the copy. "disabled" returns when the step is durable and committed.
- Resume (`load_step` -1): the step lifeline-agent fixed for the launch (LIFELINE_RESUME_STEP),
  else the newest step every rank sees complete on disk, read from disk (with memory_tier, saves
  are also kept in the memory tier; loads here do not read it). Step 0 restores the model only, as
  torchtitan's. The step loaded is told to lifeline-agent, as lifeline.Checkpointer.load tells it.
- keep_latest_k is Lifeline's keep_last (0 keeps all). The last step is saved synchronously,
  model only in export_dtype when last_save_model_only, as torchtitan's manager does.
- initial_load_path (when the folder holds no checkpoint): a Lifeline directory or a DCP
  checkpoint directory (torchtitan's own format), model only when initial_load_model_only;
  initial_load_in_hf reads Hugging Face safetensors through the model's state dict adapter, as
  torchtitan does.
- The folder may be an object-store prefix, s3://bucket/prefix (docs/object-storage.md).
- Refused, saying so: another remote (fsspec) folder, and last_save_in_hf (Lifeline writes safetensors
  with `lifeline convert DIR --to safetensors` instead).

Tested (tests/python/test_torchtitan.py) with torchtitan 0.3.0 and torch 2.13.0 on CPU over gloo,
2 FSDP ranks killed and resumed under lifeline-agent, where torchtitan needs a few changes to run at
all on CPU, none in its checkpointing (tests/python/titan_train.py lists them).

Thread-safety: as torchtitan's managers, the manager is driven by the training loop's thread; the
uploads of async saves run on DCP's thread and are waited for by maybe_wait_for_saving.
"""

from __future__ import annotations

import dataclasses as _dataclasses
import os as _os
import sys as _sys
import time as _time
from typing import Any, Literal

import torch as _torch
import torch.distributed as _dist
import torch.distributed.checkpoint as _dcp

try:
    from torchtitan.components.checkpointer.base import (
        BaseCheckpointManager,
        DATALOADER,
        LR_SCHEDULER,
        MODEL,
        ModelWrapper,
        OPTIMIZER,
    )
    from torchtitan.config import TORCH_DTYPE_MAP as _DTYPES
    from torchtitan.config import derive as _derive
    from torchtitan.config import override as _override
    from torchtitan.tools import filesystem as _filesystem
    from torchtitan.tools.logging import logger as _logger
except ImportError as _e:
    raise ImportError(f"lifeline.torchtitan needs torchtitan 0.3's checkpoint manager interface "
                      f"(torchtitan.components.checkpointer, torchtitan.config.override): {_e}") from None

from . import Error
from . import dcp as _lifeline_dcp

__all__ = ["LifelineCheckpointManager", "checkpoint_with_lifeline"]

# The options of the manager's that also apply to its loads (which read the directory on disk).
_READER_OPTIONS = ("direct_io", "load_memory_budget")


class LifelineCheckpointManager(BaseCheckpointManager):
    """torchtitan's checkpoint manager, saving and loading Lifeline checkpoints (see the module)."""

    @_dataclasses.dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):
        async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
        """"disabled": save() returns when the step is committed; "async" (or
        "async_with_pinned_mem"): when Lifeline has registered the state, copied meanwhile."""

        lifeline_options: dict[str, Any] = _dataclasses.field(default_factory=dict)
        """Options of lifeline.Checkpointer (memory_tier, codec, staging_budget_bytes, ...)."""

        def __post_init__(self) -> None:
            BaseCheckpointManager.Config.__post_init__(self)
            self.async_mode = self.async_mode.lower()
            if self.async_mode not in ("disabled", "async", "async_with_pinned_mem"):
                raise ValueError(f"checkpoint.async_mode {self.async_mode!r}: "
                                 f"'disabled', 'async' or 'async_with_pinned_mem'")
            if _filesystem.is_remote(self.folder) and not str(self.folder).startswith("s3://"):
                raise ValueError(f"lifeline.torchtitan: checkpoint.folder {self.folder!r} is remote; Lifeline "
                                 f"writes a local (or mounted) directory or an s3://bucket/prefix")
            if self.last_save_in_hf:
                raise ValueError("lifeline.torchtitan: checkpoint.last_save_in_hf is not supported: convert a "
                                 "step with `lifeline convert DIR --to safetensors` instead")
            if "keep_last" in self.lifeline_options:
                raise ValueError("lifeline.torchtitan: set checkpoint.keep_latest_k, not keep_last")

    def __init__(self, config: Config, *, dataloader, model_parts, optimizers, lr_schedulers,
                 states: dict[str, Any], sd_adapter, base_folder: str = "") -> None:
        self.enable = config.enable
        if not self.enable:
            return
        self.save_future = None
        self.staging_future = None
        self.folder = _filesystem.join(base_folder, config.folder)
        self.config = config
        self.states = states
        self.states.update({MODEL: ModelWrapper(model_parts), OPTIMIZER: optimizers, DATALOADER: dataloader,
                            LR_SCHEDULER: lr_schedulers})
        self.sd_adapter = sd_adapter
        self.export_dtype = _DTYPES[config.export_dtype]
        self.asynchronous = config.async_mode != "disabled"
        options = dict(config.lifeline_options)
        if config.keep_latest_k > 0:
            options["keep_last"] = config.keep_latest_k
        self._reader_options = {k: v for k, v in options.items() if k in _READER_OPTIONS}
        self._writer = _lifeline_dcp.StorageWriter(self.folder, staging="lazy", **options)
        # Made now, on every rank together: with no lifeline-agent the ranks agree on a launch id.
        self._checkpointer = self._writer.checkpointer
        # Async uploads run DCP's collectives on a thread of their own: not on the training's group.
        self._group = _dist.new_group(backend="gloo") if self.asynchronous and _is_distributed() else None
        _logger.info(f"Lifeline checkpoints in {self.folder} ({'async' if self.asynchronous else 'sync'} saves)")

    def __del__(self) -> None:
        self.close()

    # ---- saving ----

    @_torch.no_grad()
    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        c = self.config
        if c.load_only or not (last_step or curr_step % c.interval == 0
                               or (curr_step == 1 and c.enable_first_step_checkpoint)):
            return False
        self.maybe_wait_for_saving()
        if last_step:
            if c.last_save_model_only:
                states = {k: v.to(self.export_dtype) if isinstance(v, _torch.Tensor) and v.is_floating_point() else v
                          for k, v in self.states[MODEL].state_dict().items()}
            else:
                states = self._flattened_states(self.states)
            self._writer.step = curr_step
            _dcp.save(states, storage_writer=self._writer)
            return True
        states = self._flattened_states(self.states)
        self._writer.step = curr_step
        if not self.asynchronous:
            _dcp.save(states, storage_writer=self._writer)
            return True
        response = _dcp.async_save(states, storage_writer=self._writer, process_group=self._group)
        # torch before 2.9, or staging="copy": a plain Future, the state already copied.
        self.staging_future = getattr(response, "staging_completion", None)
        self.save_future = getattr(response, "upload_completion", response)
        return True

    def _maybe_wait_for_staging(self) -> None:
        if self.staging_future is not None:
            self.staging_future.result()
            self.staging_future = None

    def _wait_for_saving(self) -> None:
        future, self.save_future = self.save_future, None
        future.result()

    def _close(self) -> None:
        if getattr(self, "_writer", None) is None:
            return
        try:
            if self.save_future is not None:
                self._wait_for_saving()
        finally:
            writer, self._writer = self._writer, None
            writer.close()

    # ---- loading ----

    @_torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        self._checkpointer._load_began = _time.monotonic()  # the agent's account of a restart times the load
        if step == -1:
            step = self._resume_step()
        elif step not in self._complete_steps():
            raise FileNotFoundError(f"--checkpoint.load_step={step}: no complete step {step} in {self.folder}")
        if step is None:
            self._say_resumed(None)
            return self._initial_load()
        states = self._states_to_load(model_only=step == 0)
        _dcp.load(states, storage_reader=_lifeline_dcp.StorageReader(self.folder, step=step, **self._reader_options))
        self.states[MODEL].load_state_dict(states)
        _logger.info(f"Loaded step {step} of Lifeline checkpoint {self.folder}")
        self._say_resumed(step)
        return True

    def _resume_step(self):
        """The step this launch resumes from: lifeline-agent's pin for the directory, else the newest
        step complete on disk for every rank; None to start afresh."""
        pinned = self._checkpointer._impl.resume_step
        if pinned == "none":
            return None
        if pinned:
            return int(pinned)
        steps = self._complete_steps()
        if _is_distributed():
            views = [None] * _dist.get_world_size()
            _dist.all_gather_object(views, steps)
            steps = set.intersection(*views)
        return max(steps, default=None)

    def _complete_steps(self):
        return {c["step"] for c in self._checkpointer.list() if c["complete"]}

    def _initial_load(self) -> bool:
        c = self.config
        if c.initial_load_in_hf:
            path = c.initial_load_path or (self.sd_adapter.hf_assets_path if self.sd_adapter else None)
            if self.sd_adapter is None or not path or not _os.path.isdir(path):
                raise ValueError(f"checkpoint.initial_load_in_hf: no Hugging Face checkpoint directory ({path!r}) "
                                 f"or no state dict adapter for the model")
            hf_state = self.sd_adapter.to_hf(self.states[MODEL].state_dict())
            reader = self.sd_adapter.get_hf_storage_reader(path, c.initial_load_in_hf_quantized)
            _dcp.load(hf_state, storage_reader=reader)
            self.states[MODEL].load_state_dict(self.sd_adapter.from_hf(hf_state))
            return True
        if not c.initial_load_path:
            _logger.info(f"No checkpoint in {self.folder}: a fresh start")
            return False
        path = c.initial_load_path
        if not str(path).startswith("s3://") and not _os.path.isdir(path):
            raise ValueError(f"checkpoint.initial_load_path is not a directory: {path}")
        states = self._states_to_load(model_only=c.initial_load_model_only)
        if _is_lifeline_directory(path):
            _dcp.load(states, storage_reader=_lifeline_dcp.StorageReader(path, **self._reader_options))
        else:
            _dcp.load(states, checkpoint_id=path)
        self.states[MODEL].load_state_dict(states)
        _logger.info(f"Loaded the initial checkpoint {path}")
        return True

    def _states_to_load(self, model_only: bool) -> dict[str, Any]:
        if model_only:
            return self.states[MODEL].state_dict()
        for key in self.config.exclude_from_loading:
            if key not in self.states:
                raise ValueError(f"checkpoint.exclude_from_loading: {key!r} is not in the state")
        return self._flattened_states({k: v for k, v in self.states.items()
                                       if k not in self.config.exclude_from_loading})

    @staticmethod
    def _flattened_states(states):
        """The state as torchtitan's DCP manager saves it: the model's entries at the top level."""
        flat = {k: v for k, v in states.items() if k != MODEL}
        if MODEL in states:
            flat.update(states[MODEL].state_dict())
        return flat

    def _say_resumed(self, step):
        # What lifeline.Checkpointer.load tells lifeline-agent and its step clock after a load.
        self._checkpointer._announce(step, None if step is None else "disk")
        autotrace = _sys.modules.get("lifeline._autotrace")  # loaded only under lifeline-agent
        if autotrace is not None and step is not None:
            autotrace.resumed_at(step)


@_override(target=BaseCheckpointManager.Config,
           description="Lifeline checkpoints (lifeline.torchtitan.LifelineCheckpointManager)")
def checkpoint_with_lifeline(config, **lifeline_options):
    """torchtitan override (`--override.imports lifeline.torchtitan.checkpoint_with_lifeline`): the
    trainer's checkpoint config as LifelineCheckpointManager.Config, its settings kept;
    `lifeline_options` (the entry's JSON) are lifeline.Checkpointer options."""
    if isinstance(config, LifelineCheckpointManager.Config):
        lifeline_options = {**config.lifeline_options, **lifeline_options}
    return _derive(config, LifelineCheckpointManager.Config, lifeline_options=lifeline_options)


def _is_distributed():
    return _dist.is_available() and _dist.is_initialized() and _dist.get_world_size() > 1


def _is_lifeline_directory(path):
    from . import describe_source
    try:
        return describe_source(path).get("format") == "lifeline"
    except Error:
        return False

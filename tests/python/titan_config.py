"""A torchtitan config function for tests/python/test_torchtitan.py (`--module titan_config
--config llama3_debugmodel_lifeline`): torchtitan's llama3 debug model with Lifeline chosen in the
config itself, as a user's own config function would choose it, rather than by --override.imports.
"""
from torchtitan.models.llama3.config_registry import llama3_debugmodel

from lifeline.torchtitan import LifelineCheckpointManager


def llama3_debugmodel_lifeline():
    config = llama3_debugmodel()
    config.checkpoint = LifelineCheckpointManager.Config(
        enable=True, interval=2, last_save_model_only=False, keep_latest_k=0, lifeline_options={"codec": "zstd"})
    return config

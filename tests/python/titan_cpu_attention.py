"""A torchtitan override (`--override.imports titan_cpu_attention.eager_cpu_attention`) that lets
its language models train on CPU, for tests/python/test_torchtitan.py.

torchtitan 0.3's language models attend with FlexAttention or varlen attention only
(torchtitan/models/common/config_utils.py, get_attention_config: "sdpa is no longer supported for
language models"), and neither trains on CPU with torch 2.13: flex_attention raises
"FlexAttention does not support backward on CPU" (torch/nn/attention/flex_attention.py,
_validate_device), and varlen attention calls aten::_flash_attention_forward, which has no CPU
kernel. This override keeps torchtitan's FlexAttention and its block-causal document masks, and
computes the same attention eagerly: the BlockMask's mask_mod made dense, then
scaled_dot_product_attention.
"""
from dataclasses import dataclass

import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_mask
from torchtitan.config import derive, override
from torchtitan.models.common.attention import FlexAttention


class EagerCpuAttention(FlexAttention):
    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        pass

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, score_mod=None, scale=None, enable_gqa=False,
                out_transform=None, **kwargs):
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError("EagerCpuAttention: no score_mod or out_transform (context parallelism)")
        q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
        mask = create_mask(attention_masks.mask_mod, q.shape[0], 1, q.shape[2], k.shape[2], device=q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)


@override(target=FlexAttention.Config, description="FlexAttention computed eagerly (CPU)")
def eager_cpu_attention(config):
    return derive(config, EagerCpuAttention.Config)

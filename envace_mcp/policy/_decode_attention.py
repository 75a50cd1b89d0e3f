"""Attention for one new token per row on CPU: grouped-query heads packed onto their key/value head.

transformers' `sdpa` attention, decoding one token with no mask (one row, nothing padded), passes
`enable_gqa=True` to PyTorch; on CPU that kernel takes ~1 ms per layer in bfloat16 at 1,700 cached
tokens, where packing the query heads of each key/value head into one block of queries (what
transformers itself does when a mask is present) takes 0.18 ms — a third of a single-row decode
step for the embedded model. This module registers an attention function that packs in every
one-token CPU case and hands every other call (prefill, training, GPUs) to transformers' own `sdpa`.
The kernel and its float32 accumulation are PyTorch's, as before: only the layout changes.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

NAME = "envace_cpu_decode"


def decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; query (B, H, Q, D), key/value (B, KV, L, D) -> (B, Q, H, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if (q_len != 1 or query.device.type != "cpu" or dropout or heads % kv_heads
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
            or getattr(module, "sinks", None) is not None
            or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # (B, KV, H/KV, D): one block per KV head
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, 1, heads, dim), None                    # heads in repeat_kv's order


@functools.cache
def _register() -> bool:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:  # pragma: no cover - transformers without pluggable attention
        return False
    AttentionInterface.register(NAME, decode_attention)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return True


def use_for_decoding(model: Any) -> bool:
    """Switch a CPU model that runs transformers' `sdpa` attention to `decode_attention`; True if switched.

    Models on other devices or with another attention implementation are left alone."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(base, "set_attn_implementation"):
        return False
    if any(p.device.type != "cpu" for p in base.parameters()) or not _register():
        return False
    try:
        base.set_attn_implementation(NAME)
    except (ValueError, ImportError):  # pragma: no cover - a model class that refuses custom attention
        return False
    return config._attn_implementation == NAME

"""Attention for one new token per row on CPU: grouped-query heads packed onto their key/value head.

transformers' `sdpa` attention, decoding one token with no mask (one row, nothing padded), passes
`enable_gqa=True` to PyTorch; on CPU that kernel takes ~1 ms per layer in bfloat16 at 1,700 cached
tokens, where packing the query heads of each key/value head into one block of queries (what
transformers itself does when a mask is present) takes 0.18 ms — a third of a single-row decode
step for the embedded model. This module registers an attention function that packs in every
one-token CPU case and hands every other call (prefill, training, GPUs) to transformers' own `sdpa`.
The kernel and its float32 accumulation are PyTorch's, as before: only the layout changes.

A decode batch whose rows start with the same prompt prefix (GRPO rollouts: each role's system prompt
and tool schemas, ~1,400 tokens) keeps that prefix's keys/values once (`SharedPrefixes`, one per group
of rows) instead of once per row, and passes them to the model as the keyword `envace_prefix`: a
group's queries attend to its prefix in one block (read once per step instead of once per row), each
row to its own columns in another, and the two partial softmaxes are merged by their log-sum-exps —
the same attention, computed in two parts.

Training passes (`envace_mcp.train.rows`) pack several rows into one sequence: optionally a prompt
prefix they share, then each row's own tokens. They pass the layout as the keyword `envace_packed`
(`PackedRows`) and the attention is computed per part — the prefix causally, each part against the
prefix, the earlier tokens it shares with another part, and its own earlier tokens — instead of over the whole sequence with an N×N block mask, which
makes PyTorch's CPU kernels visit every masked-out block (and the mask itself is N² bytes).
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

    packed: PackedRows | None = kwargs.pop(PACKED_KW, None)
    if packed is not None:
        return packed.attend(module, query, key, value, dropout, scaling, **kwargs), None
    prefix: SharedPrefixes | None = kwargs.pop(PREFIX_KW, None)
    alone: RowColumns | None = kwargs.pop(ROWS_KW, None)
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if (q_len != 1 or query.device.type != "cpu" or dropout or heads % kv_heads
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
            or getattr(module, "sinks", None) is not None
            or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1))):
        if prefix:  # not a case the split handles: prefixes go in front of their rows
            key, value, attention_mask = prefix.prepend(module.layer_idx, key, value, attention_mask)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # (B, KV, H/KV, D): one block per KV head
    if alone is not None and alone.every:  # every row attends alone: no batched call to overwrite
        return alone.attend(grouped, key, value, scaling, grouped.new_zeros(grouped.shape)).reshape(
            batch, 1, heads, dim), None
    if prefix and _FLASH is not None:
        out = prefix.attend(module.layer_idx, grouped, key, value, attention_mask, scaling)
        if alone is not None:
            out = alone.attend(grouped, key, value, scaling, out.reshape(grouped.shape)).reshape(out.shape)
        return out, None
    if prefix:  # pragma: no cover - a PyTorch without the CPU flash kernel
        key, value, attention_mask = prefix.prepend(module.layer_idx, key, value, attention_mask)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    if alone is not None:
        out = alone.attend(grouped, key, value, scaling, out)
    return out.reshape(batch, 1, heads, dim), None                    # heads in repeat_kv's order


PREFIX_KW = "envace_prefix"
"""Keyword a decode step passes its `SharedPrefixes` under (transformers hands model keywords down to
the attention function)."""

PACKED_KW = "envace_packed"
"""Keyword a packed training forward passes its `PackedRows` under."""

ROWS_KW = "envace_alone"
"""Keyword a decode step passes its `RowColumns` under (the rows that attend alone)."""

_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
"""PyTorch's CPU flash-attention kernel, which also returns the log-sum-exp a split softmax needs."""


class RowColumns:
    """Rows of a decode step that attend alone (batch-invariant rows, see `invariant`): each over its own
    columns of the step's keys/values only — a slice where they are contiguous, else their indices — in
    a call of its own, so its sums run in the same order whatever rows, padding or gaps surround it.
    `every`: no other row needs the batched call (rows past the listed ones are filler, left 0)."""

    def __init__(self, rows: list[int], columns: list[slice | torch.Tensor], every: bool) -> None:
        self.rows, self.columns, self.every = rows, columns, every

    def attend(self, grouped: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None,
               out: torch.Tensor) -> torch.Tensor:
        """grouped (B, KV, G, D) queries, key/value (B, KV, L, D); writes the listed rows of out (B, KV, G, D)."""
        for row, columns in zip(self.rows, self.columns):
            if isinstance(columns, slice):
                k, v = key[row : row + 1, :, columns], value[row : row + 1, :, columns]  # (1, KV, n, D) views
            else:
                k, v = key[row : row + 1].index_select(2, columns), value[row : row + 1].index_select(2, columns)
            out[row : row + 1] = F.scaled_dot_product_attention(grouped[row : row + 1], k, v, scale=scale)
        return out


class SharedPrefixes:
    """Keys/values of prompt prefixes that groups of a decode batch's rows start with, each held once.

    `groups`: (rows, layers) pairs: `rows` the batch slots (a long tensor) whose prompts start with the
    prefix, `layers[i]` layer i's (keys, values), each (1, kv heads, prefix length, head dim) at
    positions 0..length-1; a row's own columns (its cache) hold what follows. Rows in no group hold
    their whole prompt."""

    def __init__(self, groups: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]]) -> None:
        self.groups = groups

    def __bool__(self) -> bool:
        return bool(self.groups)

    def attend(self, layer: int, grouped: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor | None, scale: float | None) -> torch.Tensor:
        """One decode step's attention over prefix + own columns. grouped (B, KV, G, D) queries, key/value
        (B, KV, L, D) own columns, mask (B, 1, 1, L) bool or additive or None -> (B, 1, KV*G, D)."""
        batch, kv_heads, group, dim = grouped.shape
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=grouped.dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        own, own_lse = _FLASH(grouped, key, value, attn_mask=mask, scale=scale)[:2]  # (B, KV, G, D), (B, KV, G)
        shared = torch.zeros_like(own)
        shared_lse = torch.full_like(own_lse, float("-inf"))  # rows in no group: weight 0 below
        for rows, layers in self.groups:
            pk, pv = layers[layer]
            n = rows.numel()
            # the group's queries together against its one prefix: (1, KV, n*G, D) -- read once
            together = grouped.index_select(0, rows).transpose(0, 1).reshape(1, kv_heads, n * group, dim)
            out, lse = _FLASH(together, pk, pv, scale=scale)[:2]
            shared.index_copy_(0, rows, out.view(kv_heads, n, group, dim).transpose(0, 1))
            shared_lse.index_copy_(0, rows, lse.view(kv_heads, n, group).transpose(0, 1))
        # softmax over both parts = each part's softmax weighted by its share of the total exp-sum
        weight = torch.sigmoid(shared_lse - own_lse).unsqueeze(-1)  # float32
        out = shared.float() * weight + own.float() * (1 - weight)
        return out.to(grouped.dtype).reshape(batch, 1, kv_heads * group, dim)

    def prepend(self, layer: int, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys/values and a (B, 1, Q, P+L) mask with every row's prefix put before its own columns
        (right-aligned; shorter prefixes are masked padding)."""
        batch, kv_heads, own, dim = key.shape
        width = max(layers[layer][0].shape[2] for _, layers in self.groups)
        keys = key.new_zeros((batch, kv_heads, width + own, dim))
        values = value.new_zeros((batch, kv_heads, width + own, dim))
        keys[:, :, width:], values[:, :, width:] = key, value
        seen = torch.zeros((batch, 1, 1, width), dtype=torch.bool, device=key.device)
        for rows, layers in self.groups:
            pk, pv = layers[layer]
            n = pk.shape[2]
            keys[rows, :, width - n : width] = pk.expand(rows.numel(), -1, -1, -1)
            values[rows, :, width - n : width] = pv.expand(rows.numel(), -1, -1, -1)
            seen[rows, :, :, width - n :] = True
        if mask is None:
            mask = torch.ones((batch, 1, 1, own), dtype=torch.bool, device=key.device)
        if mask.dtype != torch.bool:
            mask = mask == 0
        mask = mask.expand(batch, 1, mask.shape[2], own)
        return keys, values, torch.cat([seen.expand(batch, 1, mask.shape[2], width), mask], dim=-1)


class PackedRows:
    """Layout of rows packed into one sequence (batch of one): positions [0, prefix) hold a prompt
    prefix every row shares (possibly none), and each (start, end) in `spans` one part's own tokens,
    which attend to the prefix, to the earlier ranges in its entry of `contexts` (a prefix tree: the
    tokens of the part it branches from, up to the branch point), and causally to themselves only."""

    def __init__(self, prefix: int, spans: list[tuple[int, int]],
                 contexts: list[list[tuple[int, int]]] | None = None) -> None:
        self.prefix, self.spans = prefix, spans
        self.contexts = contexts or [[] for _ in spans]

    def attend(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout: float,
               scaling: float | None, **kwargs: Any) -> torch.Tensor:
        """query (1, H, N, D), key/value (1, KV, N, D) -> (1, N, H, D), through transformers' `sdpa`
        for each part (it handles grouped-query heads), always plain causal — no mask, so PyTorch's
        flash kernel runs: a part that sees earlier tokens (the prefix, its context) is attended with
        their queries put in front of its own (C + L queries over C + L keys, causal), and only its own
        L outputs are kept. Masked attention would take PyTorch's math kernel on CPU: a prefix-tree pass
        of 8,192 tokens ran at half the tokens/s of one row at a time that way."""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        kwargs.pop("is_causal", None)
        p = self.prefix

        def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True,
                                          **kwargs)[0]

        outs = [causal(query[:, :, :p], key[:, :, :p], value[:, :, :p])] if p else []
        covered = p
        for (start, end), context in zip(self.spans, self.contexts):
            if start != covered:  # pragma: no cover - collate lays rows out back to back
                raise ValueError(f"packed rows must be contiguous: a span starts at {start}, expected {covered}")
            ranges = ([(0, p)] if p else []) + list(context) + [(start, end)]
            seen = sum(b - a for a, b in ranges[:-1])  # C tokens before this part's own L
            if len(ranges) == 1:
                outs.append(causal(query[:, :, start:end], key[:, :, start:end], value[:, :, start:end]))
            elif seen <= end - start:
                q, k, v = (torch.cat([t[:, :, a:b] for a, b in ranges], dim=2) for t in (query, key, value))
                outs.append(causal(q, k, v)[:, -(end - start):])  # (1, L, H, D): this part's own queries
            else:  # a short branch off a long context: its L queries only, against C + L keys
                k, v = (torch.cat([t[:, :, a:b] for a, b in ranges], dim=2) for t in (key, value))
                outs.append(self._branch(module, query[:, :, start:end], k, v, seen, dropout, scaling, **kwargs))
            covered = end
        if covered != query.shape[2]:
            raise ValueError(f"packed layout covers {covered} positions, the sequence has {query.shape[2]}")
        return torch.cat(outs, dim=1)

    BRANCH_QUERIES = 1024
    """Query block of `_branch` (its scores are heads x block x keys floats)."""

    @classmethod
    def _branch(cls, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, seen: int,
                dropout: float, scaling: float | None, **kwargs: Any) -> torch.Tensor:
        """query (1, H, L, D) of tokens that follow `seen` context tokens; key/value (1, KV, C + L, D) ->
        (1, L, H, D). Causal aligned bottom-right (query i sees keys up to C + i), as a boolean mask in
        blocks of queries: L x (C + L) scores where putting the context's queries in front would cost
        (C + L)^2 / 2 — a 50-token inline rehearsal branching off a 3,000-token trajectory ran 11x
        faster forward + backward this way. (A mask takes PyTorch's math kernel; per score it costs
        about what the flash kernel does at these sizes.)"""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        length = query.shape[2]
        outs = []
        for a in range(0, length, cls.BRANCH_QUERIES):
            b = min(a + cls.BRANCH_QUERIES, length)
            mask = torch.ones((b - a, seen + b), dtype=torch.bool, device=query.device).tril_(seen + a)
            outs.append(sdpa_attention_forward(module, query[:, :, a:b], key[:, :, :seen + b], value[:, :, :seen + b],
                                               mask[None, None], dropout=dropout, scaling=scaling, is_causal=False,
                                               **kwargs)[0])
        return torch.cat(outs, dim=1)


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


def base_model(model: Any) -> Any:
    """The transformers model inside DistributedDataParallel and/or a peft wrapper (or `model` itself)."""
    model = getattr(model, "module", model)  # DistributedDataParallel
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def use_for_decoding(model: Any) -> bool:
    """Switch a CPU model that runs transformers' `sdpa` attention to `decode_attention`; True if it runs
    `decode_attention` now (switched here or before: a trainer switches its model in
    `prepare_for_training`, then hands it to the rollout policy, which asks again).

    Models on other devices or with another attention implementation are left alone."""
    base = base_model(model)
    config = getattr(base, "config", None)
    on_cpu = all(p.device.type == "cpu" for p in base.parameters())
    if getattr(config, "_attn_implementation", None) == NAME:
        return on_cpu
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(base, "set_attn_implementation"):
        return False
    if not on_cpu or not _register():
        return False
    try:
        base.set_attn_implementation(NAME)
    except (ValueError, ImportError):  # pragma: no cover - a model class that refuses custom attention
        return False
    return config._attn_implementation == NAME

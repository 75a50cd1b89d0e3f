"""Traces → training rows: one segment per generated turn (act or rehearsal), with its tokens, the
logprobs recorded when it was sampled, its run's reward and its group; and batches of them."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch

from envace_mcp.engine.attention import NAME as ATTENTION_NAME
from envace_mcp.engine.attention import PACKED_KW, PackedRows, base_model, use_for_decoding
from envace_mcp.traces.schema import Trace

ROLE_INDEX = {"act": 0, "rehearse": 1, "critique": 2}


@dataclass
class Segment:
    run_id: str
    task_id: str | None
    group_id: str | None
    role: str
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float] | None
    reward: float | None
    temperature: float = 1.0
    fidelity: float | None = None  # rehearse segments: match score against the real result, when the call ran


def segments(traces: Iterable[Trace], *, reward: str = "task", roles: tuple[str, ...] = ("act", "rehearse"),
             require_reward: bool = True) -> list[Segment]:
    """Every generation step with tokens, in trace order. Runs without the named reward are skipped
    when `require_reward` (a reward of `None` means "cannot score", never 0)."""
    out: list[Segment] = []
    for trace in traces:
        found = trace.reward(reward)
        value = found.value if found is not None else None
        if require_reward and value is None:
            continue
        fidelity = {s.call_id: s.comparison.score for s in trace.steps
                    if s.role == "tool" and s.comparison is not None and not s.simulated}
        for step in trace.steps:
            if step.role in roles and step.prompt_ids is not None and step.completion_ids:
                out.append(Segment(run_id=trace.run_id, task_id=trace.task_id, group_id=trace.group_id or trace.task_id,
                                   role=step.role, prompt_ids=list(step.prompt_ids),
                                   completion_ids=list(step.completion_ids),
                                   old_logprobs=list(step.logprobs) if step.logprobs is not None else None,
                                   reward=value, temperature=(step.sampling or {}).get("temperature") or 1.0,
                                   fidelity=fidelity.get(step.call_id) if step.role == "rehearse" else None))
    return out


@dataclass
class Batch:
    """A micro-batch packed into ONE sequence without padding: the prompt prefix shared by every row
    (possibly empty), then each row's remaining prompt + completion. Each row sees the prefix and its
    own earlier tokens only, and positions restart after the prefix for each row, so every row
    computes exactly what it would alone; the prefix runs once for all of them."""

    input_ids: torch.Tensor  # [1, N] prefix, then each row's part, back to back
    position_ids: torch.Tensor  # [1, N] 0…P-1 for the prefix, P… again for each row
    positions: torch.Tensor  # [B, T] where in the packed sequence each completion token is predicted (0 = padding)
    completion_mask: torch.Tensor  # [B, T] 1 for real completion tokens (left-aligned, T = longest completion)
    targets: torch.Tensor  # [B, T] the completion tokens
    old_logprobs: torch.Tensor  # [B, T] recorded sampling logprobs (0 where padded or not recorded)
    temperature: float
    prefix_len: int = 0  # P
    spans: list[tuple[int, int]] | None = None  # each row's [start, end) after the prefix; None = one row, plain causal

    def to(self, device: torch.device | str) -> "Batch":
        return replace(self, **{name: getattr(self, name).to(device) for name in
                                ("input_ids", "position_ids", "positions", "completion_mask", "targets", "old_logprobs")})

    @property
    def attention_mask(self) -> torch.Tensor | None:  # [1, 1, N, N] bool (True = may attend); None = plain causal
        """The layout as a block mask, for attention implementations that take no `PackedRows`
        (N² bytes: 100 MB at 10k tokens — built only when asked for)."""
        if self.spans is None:
            return None
        n, cut = self.input_ids.shape[1], self.prefix_len
        allowed = torch.zeros((n, n), dtype=torch.bool, device=self.input_ids.device)
        allowed[:cut, :cut] = True
        for start, end in self.spans:
            allowed[start:end, :cut] = True
            allowed[start:end, start:end] = True
        return allowed.tril_()[None, None]


MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are not worth sharing."""


def shared_prefix_length(rows: list[Segment]) -> int:
    """Tokens every row's prompt starts with, leaving at least one prompt token per row after it (so
    each row's first completion token is predicted inside its own part of the sequence)."""
    if len(rows) < 2:
        return 0
    first = rows[0].prompt_ids
    limit = min(len(r.prompt_ids) for r in rows) - 1
    n = 0
    while n < limit and all(r.prompt_ids[n] == first[n] for r in rows):
        n += 1
    return n if n >= MIN_SHARED_PREFIX else 0


def prefix_order(rows: list[Segment]) -> list[int]:
    """Row indices sorted by prompt tokens, so consecutive rows share the longest prefixes
    (same system prompt and tool list, then the same task and conversation)."""
    return sorted(range(len(rows)), key=lambda i: rows[i].prompt_ids)


def collate(rows: list[Segment], pad_id: int = 0, *, share_prefix: bool = False) -> Batch:
    """Pack `rows` into one sequence; only completion tokens are read by the loss (prompt, tool output
    and padding never are). `share_prefix`: the prompt tokens common to all rows appear once.
    (`pad_id` is kept for callers; packing needs no padding tokens.)"""
    cut = shared_prefix_length(rows) if share_prefix else 0
    ids: list[int] = list(rows[0].prompt_ids[:cut])
    position: list[int] = list(range(cut))
    spans, predict = [], []
    for row in rows:
        part = (row.prompt_ids + row.completion_ids)[cut:]
        start = len(ids)
        ids += part
        position += range(cut, cut + len(part))
        spans.append((start, len(ids)))
        first = start + len(row.prompt_ids) - cut - 1  # the position whose logits predict completion token 0
        predict.append(list(range(first, first + len(row.completion_ids))))
    width = max(len(r.completion_ids) for r in rows)
    positions = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    completion = torch.zeros((len(rows), width))  # [B, T]
    targets = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, T]
    old = torch.zeros((len(rows), width))  # [B, T]
    for i, row in enumerate(rows):
        k = len(row.completion_ids)
        positions[i, :k] = torch.tensor(predict[i])
        completion[i, :k] = 1
        targets[i, :k] = torch.tensor(row.completion_ids)
        if row.old_logprobs is not None:
            old[i, :k] = torch.tensor(row.old_logprobs)
    temperatures = {r.temperature for r in rows}
    return Batch(input_ids=torch.tensor([ids]), position_ids=torch.tensor([position]), positions=positions,
                 completion_mask=completion, targets=targets, old_logprobs=old,
                 temperature=temperatures.pop() if len(temperatures) == 1 else 1.0, prefix_len=cut,
                 spans=spans if len(rows) > 1 or cut else None)


def forward_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:  # [B, T, V]
    """Logits at the positions that predict completion tokens only: the LM head over a 50k
    vocabulary at every prompt position would cost more memory than the model itself."""
    extra: dict[str, Any] = {}
    if batch.spans is None:
        mask = None
    elif _takes_packed_rows(model):  # each part attended on its own, no N×N mask
        mask = torch.ones_like(batch.input_ids, dtype=torch.bool)  # no padding (and no "packed" guess from positions)
        extra[PACKED_KW] = PackedRows(batch.prefix_len, batch.spans)
    else:
        mask = batch.attention_mask
    logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=mask,
                   logits_to_keep=batch.positions.reshape(-1), **extra).logits  # [1, B*T, V]
    return logits.view(*batch.positions.shape, -1)


def _takes_packed_rows(model: Any) -> bool:
    return getattr(getattr(base_model(model), "config", None), "_attn_implementation", None) == ATTENTION_NAME


def prepare_for_training(model: Any, gradient_checkpointing: bool) -> None:
    """Gradient checkpointing keeps one decoder layer's activations at a time (recomputed in backward):
    ~2 MB per token for SmolLM2's 30 layers otherwise, and tool-schema prompts are ~2k tokens.
    CPU models on `sdpa` attention switch to ours, which attends packed rows part by part."""
    base = base_model(model)
    use_for_decoding(base)
    renamed = hasattr(base, "activation_checkpointing_enable")  # transformers >= 5.2x renamed the API
    if gradient_checkpointing and getattr(base, "supports_gradient_checkpointing", False):
        if renamed:
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        (base.activation_checkpointing_disable if renamed else base.gradient_checkpointing_disable)()


def batch_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:  # [B, T]
    """The model's logprobs of every next token (the completion positions are what the loss reads)."""
    from envace_mcp.train.grpo import token_logprobs

    return token_logprobs(forward_logits(model, batch), batch.targets, batch.temperature)  # [B, T]


@functools.cache
def _glibc(function: str) -> Any:
    try:
        return getattr(ctypes.CDLL("libc.so.6"), function)
    except (OSError, AttributeError):  # not glibc
        return None


def release_freed_memory() -> None:
    """Hand memory freed by the last forward/backward back to the OS. glibc keeps freed heap blocks
    for reuse, and packed micro-batches of varying lengths leave them in sizes the next pass cannot
    use: RSS then grows well past what is live (a packed SFT batch: 6.4 GB RSS for 2.5 GB live).
    No-op off glibc."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


def cap_heap_blocks(megabytes: float | None) -> bool:
    """Serve every allocation of `megabytes` or more with its own mmap, returned to the OS when freed
    (glibc's M_MMAP_THRESHOLD; process-wide from now on). glibc's default threshold rises to 32 MB as
    large blocks are freed, and after that activations come from the heap, whose freed blocks are kept:
    inside one packed pass RSS then grows far past what is live — a 3,152-token GRPO micro-batch of long
    bank runs: +2.84 GB after the forward with 0.32 GB saved for backward, +0.78 GB with a 1 MB
    threshold (`malloc_trim` after the pass cannot help the pass's own peak). The price is fresh pages
    for each large tensor (page faults): a packed SFT batch ran 89 s instead of 67 s. None: leave glibc's
    default. Returns whether it was set (False off glibc)."""
    mallopt = _glibc("mallopt") if megabytes is not None else None
    return mallopt is not None and bool(mallopt(-3, int(megabytes * 2**20)))  # M_MMAP_THRESHOLD


def after_backward(rows: int, share_prefix: bool) -> None:
    """Called after each training pass's backward: a pass that packed several rows into one sequence
    hands its freed heap back (`release_freed_memory`); one-row passes have steady sizes and skip it."""
    if share_prefix and rows > 1:
        release_freed_memory()

"""Traces → training rows: one segment per generated turn (act or rehearsal), with its tokens, the
logprobs recorded when it was sampled, its run's reward and its group; and batches of them."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch

from envace_mcp.engine.attention import NAME as ATTENTION_NAME
from envace_mcp.engine.attention import PACKED_KW, PackedRows, base_model, use_for_decoding
from envace_mcp.traces.schema import Trace
from envace_mcp.train.grpo import token_logprobs

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
    call_f1: float | None = None  # the run's tool-call F1 against its task's reference calls, where recorded


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
        f1 = trace.reward("call_f1")
        fidelity = {s.call_id: s.comparison.score for s in trace.steps
                    if s.role == "tool" and s.comparison is not None and not s.simulated}
        for step in trace.steps:
            if step.role in roles and step.prompt_ids is not None and step.completion_ids:
                out.append(Segment(run_id=trace.run_id, task_id=trace.task_id, group_id=trace.group_id or trace.task_id,
                                   role=step.role, prompt_ids=list(step.prompt_ids),
                                   completion_ids=list(step.completion_ids),
                                   old_logprobs=list(step.logprobs) if step.logprobs is not None else None,
                                   reward=value, temperature=(step.sampling or {}).get("temperature") or 1.0,
                                   fidelity=fidelity.get(step.call_id) if step.role == "rehearse" else None,
                                   call_f1=f1.value if f1 is not None else None))
    return out


@dataclass
class Batch:
    """A micro-batch packed into ONE sequence without padding, as a prefix tree of its rows' token
    sequences (prompt + completion): the prompt prefix shared by every row (possibly empty), then
    *parts*. A part holds one row's tokens after the point where they leave an earlier part (or the
    shared prefix), and attends to that earlier part's tokens up to there (its `contexts`), then
    causally to itself. A row whose whole sequence is a prefix of a part's (an act turn whose prompt
    and completion the next turn's prompt repeats; an inline rehearsal the trajectory continues) has
    no tokens of its own: its completion is read inside that part. Positions continue each part's
    sequence, so every row computes exactly what it would alone; what rows share runs once — one
    forward/backward per trajectory where its turns extend each other."""

    input_ids: torch.Tensor  # [1, N] prefix, then each part, back to back
    position_ids: torch.Tensor  # [1, N] 0…P-1 for the prefix, each part's own positions in its sequence
    positions: torch.Tensor  # [B, T] where in the packed sequence each completion token is predicted (0 = padding)
    completion_mask: torch.Tensor  # [B, T] 1 for real completion tokens (left-aligned, T = longest completion)
    targets: torch.Tensor  # [B, T] the completion tokens
    old_logprobs: torch.Tensor  # [B, T] recorded sampling logprobs (0 where padded or not recorded)
    temperature: float
    prefix_len: int = 0  # P
    spans: list[tuple[int, int]] | None = None  # each part's [start, end) after the prefix; None = one row, plain causal
    contexts: list[list[tuple[int, int]]] | None = None
    """Per part, the [start, end) ranges of earlier parts it sees whole (beyond the prefix), in order."""

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
        for (start, end), context in zip(self.spans, self.contexts or [[] for _ in self.spans]):
            allowed[start:end, :cut] = True
            for a, b in context:
                allowed[start:end, a:b] = True
            allowed[start:end, start:end] = True
        return allowed.tril_()[None, None]


MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are not worth sharing."""


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the longest common prefix of `a` and `b` (known to agree before `start`): a binary
    search on slice equality, which runs in C."""
    lo, hi = start, min(len(a), len(b))
    if a[lo:hi] == b[lo:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def shared_prefix_length(rows: list[Segment]) -> int:
    """Tokens every row's prompt starts with, leaving at least one prompt token per row after it (so
    each row's first completion token is predicted inside its own part of the sequence)."""
    if len(rows) < 2:
        return 0
    first = rows[0].prompt_ids
    limit = min(len(r.prompt_ids) for r in rows) - 1
    n = limit
    for r in rows[1:]:
        n = common_prefix(first[:n], r.prompt_ids[:n])
    return n if n >= MIN_SHARED_PREFIX else 0


def prefix_order(rows: list[Segment]) -> list[int]:
    """Row indices sorted by prompt tokens, so consecutive rows share the longest prefixes
    (same system prompt and tool list, then the same task and conversation)."""
    return sorted(range(len(rows)), key=lambda i: rows[i].prompt_ids)


@dataclass
class _Part:
    tokens: list[int]  # the whole sequence this part completes (the row that made it)
    ranges: list[tuple[int, int]]  # packed ranges holding tokens[0:len(tokens)], in order

    def index(self, v: int) -> int:
        """Where virtual position `v` of this part's sequence sits in the packed sequence."""
        for a, b in self.ranges:
            if v < b - a:
                return a + v
            v -= b - a
        raise IndexError(v)

    def head(self, n: int) -> list[tuple[int, int]]:
        """The packed ranges holding this part's first `n` tokens."""
        out = []
        for a, b in self.ranges:
            if n <= 0:
                break
            out.append((a, min(b, a + n)))
            n -= b - a
        return out


def _tree(rows: list[Segment], cut: int) -> tuple[list[int], list[int], list[_Part], list[_Part]]:
    """Lay `rows` out as a prefix tree after a shared prefix of `cut` tokens: packed ids, their
    positions, the parts in packed order, and the part each row's completion is read in."""
    ids: list[int] = list(rows[0].prompt_ids[:cut])
    position: list[int] = list(range(cut))
    parts: list[_Part] = []
    home: list[_Part | None] = [None] * len(rows)
    sequences = [r.prompt_ids + r.completion_ids for r in rows]
    for i in sorted(range(len(rows)), key=lambda i: -len(sequences[i])):  # containers before what they contain
        seq = sequences[i]
        best, shared = None, cut
        for part in parts:
            n = common_prefix(part.tokens, seq, cut)
            if n > shared:
                best, shared = part, n
        if best is not None and shared == len(seq):  # wholly inside an earlier part
            home[i] = best
            continue
        if best is None or shared - cut < MIN_SHARED_PREFIX:
            best, shared = None, cut
        context = best.head(shared) if best is not None else ([(0, cut)] if cut else [])
        start = len(ids)
        ids += seq[shared:]
        position += range(shared, len(seq))
        home[i] = _Part(seq, context + [(start, len(ids))])
        parts.append(home[i])
    return ids, position, parts, home  # type: ignore[return-value]


def collate(rows: list[Segment], pad_id: int = 0, *, share_prefix: bool = False) -> Batch:
    """Pack `rows` into one sequence; only completion tokens are read by the loss (prompt, tool output
    and padding never are). `share_prefix`: tokens rows have in common appear once — the prompt
    prefix common to all of them, and each row's tokens up to where it leaves another (a prefix tree,
    see `Batch`); without it every row is its own part. (`pad_id` is kept for callers; packing needs
    no padding tokens.)"""
    cut = shared_prefix_length(rows) if share_prefix else 0
    if share_prefix:
        ids, position, parts, home = _tree(rows, cut)
    else:
        ids, position, parts, home = [], [], [], []
        for row in rows:
            seq = row.prompt_ids + row.completion_ids
            home.append(_Part(seq, [(len(ids), len(ids) + len(seq))]))
            parts.append(home[-1])
            ids += seq
            position += range(len(seq))
    spans = [part.ranges[-1] for part in parts]
    contexts = [[r for r in part.ranges[:-1] if r != (0, cut)] for part in parts]
    width = max(len(r.completion_ids) for r in rows)
    positions = torch.zeros((len(rows), width), dtype=torch.long)  # [B, T]
    completion = torch.zeros((len(rows), width))  # [B, T]
    targets = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, T]
    old = torch.zeros((len(rows), width))  # [B, T]
    for i, row in enumerate(rows):
        k = len(row.completion_ids)
        first = len(row.prompt_ids) - 1  # the position whose logits predict completion token 0
        positions[i, :k] = torch.tensor([home[i].index(v) for v in range(first, first + k)])
        completion[i, :k] = 1
        targets[i, :k] = torch.tensor(row.completion_ids)
        if row.old_logprobs is not None:
            old[i, :k] = torch.tensor(row.old_logprobs)
    temperatures = {r.temperature for r in rows}
    packed = len(parts) > 1 or cut > 0
    return Batch(input_ids=torch.tensor([ids]), position_ids=torch.tensor([position]), positions=positions,
                 completion_mask=completion, targets=targets, old_logprobs=old,
                 temperature=temperatures.pop() if len(temperatures) == 1 else 1.0, prefix_len=cut,
                 spans=spans if packed else None, contexts=contexts if packed else None)


def run_stretches(rows: list[Segment], order: Iterable[int]) -> list[list[int]]:
    """Indices in `order` grouped into stretches of consecutive rows of one run (in prompt order a run's
    rows are consecutive: they share its task and conversation; should they not be, each stretch is a group)."""
    groups: list[list[int]] = []
    for i in order:
        if groups and rows[groups[-1][-1]].run_id == rows[i].run_id:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def micro_batches(rows: list[Segment], max_rows: int, max_tokens: int | None = None) -> list[list[int]]:
    """Rows (in the order given: prompt order keeps a run's turns together) cut into passes of at most
    `max_rows` rows (0 = no limit) and, with `max_tokens`, at most that many packed tokens — counted as
    `collate(share_prefix=True)` lays them out, so a trajectory whose turns extend each other costs its
    longest sequence, not the sum. Passes close between runs where they can (a run cut between two
    passes pays for its longest sequence in both); a run that fits no pass is cut row by row, and a
    row longer than `max_tokens` gets a pass of its own."""
    out: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    previous: list[int] = []

    def cost(indices: list[int], after: list[int]) -> tuple[int, list[int]]:
        total = 0
        for i in indices:
            seq = rows[i].prompt_ids + rows[i].completion_ids
            total += len(seq) - (common_prefix(after, seq) if after else 0)
            after = seq
        return total, after

    def fits(n: int, extra: int) -> bool:
        return not ((max_rows and len(current) + n > max_rows) or (max_tokens and tokens + extra > max_tokens))

    for group in run_stretches(rows, range(len(rows))):
        extra, last = cost(group, previous if current else [])
        if current and not fits(len(group), extra):
            out.append(current)
            current, tokens = [], 0
            extra, last = cost(group, [])
        if fits(len(group), extra):  # the whole run in this pass
            current += group
            tokens += extra
            previous = last
            continue
        for i in group:  # a run no pass holds: row by row
            new, seq = cost([i], previous if current else [])
            if current and not fits(1, new):
                out.append(current)
                current, tokens = [], 0
                new, seq = cost([i], [])
            current.append(i)
            tokens += new
            previous = seq
    if current:
        out.append(current)
    return out


def forward_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:  # [K, V]
    """Logits at the K positions that predict real completion tokens, in `completion_mask` order
    (row by row): the LM head over a 50k vocabulary at every prompt position would cost more memory
    than the model itself, and over the [B, T] grid's padding as much again for every short row
    packed beside a long one."""
    extra: dict[str, Any] = {}
    if batch.spans is None:
        mask = None
    elif _takes_packed_rows(model):  # each part attended on its own, no N×N mask
        mask = torch.ones_like(batch.input_ids, dtype=torch.bool)  # no padding (and no "packed" guess from positions)
        extra[PACKED_KW] = PackedRows(batch.prefix_len, batch.spans, batch.contexts)
    else:
        mask = batch.attention_mask
    keep = batch.positions[batch.completion_mask.bool()]  # [K]
    logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=mask,
                   logits_to_keep=keep, **extra).logits  # [1, K, V]
    return logits[0]


def _takes_packed_rows(model: Any) -> bool:
    return getattr(getattr(base_model(model), "config", None), "_attn_implementation", None) == ATTENTION_NAME


def prepare_for_training(model: Any, gradient_checkpointing: bool) -> None:
    """Gradient checkpointing keeps one decoder layer's activations at a time (recomputed in backward):
    ~2 MB per token for SmolLM2's 30 layers otherwise, and tool-schema prompts are ~2k tokens. What the
    backward pass recomputes leaves out the attention kernels (`checkpoint_kwargs`).
    CPU models on `sdpa` attention switch to ours, which attends packed rows part by part."""
    base = base_model(model)
    use_for_decoding(base)
    renamed = hasattr(base, "activation_checkpointing_enable")  # transformers >= 5.2x renamed the API
    if gradient_checkpointing and getattr(base, "supports_gradient_checkpointing", False):
        if renamed:
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs())
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs())
    else:
        (base.activation_checkpointing_disable if renamed else base.gradient_checkpointing_disable)()


KEPT_OPS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
"""Attention kernels (PyTorch's CPU flash; CUDA flash, memory-efficient, cuDNN) whose outputs checkpointing
keeps rather than recomputes."""


def checkpoint_kwargs() -> dict[str, Any]:
    """`torch.utils.checkpoint` keywords for the decoder layers: non-reentrant, keeping each attention
    kernel's outputs (for SmolLM2, 1.2 KB a token per layer: 0.35 GB over a 10k-token pass) so the
    backward pass recomputes the layer around it but not the attention itself. On CPU the flash kernel
    was 25 % of an SFT step, half of it the recomputation; the same gradients, bit for bit (the kept
    outputs are what a recomputation would give). PyTorch without selective checkpointing: plain."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    try:
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    except ImportError:  # pragma: no cover - torch < 2.4
        return kwargs
    kept = {getattr(torch.ops.aten, name).default for name in KEPT_OPS if hasattr(torch.ops.aten, name)}

    def policy(ctx: Any, op: Any, *args: Any, **kw: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if op in kept else CheckpointPolicy.PREFER_RECOMPUTE

    kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)
    return kwargs


def batch_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:  # [B, T]
    """The model's logprobs of every next token (the completion positions are what the loss reads)."""
    real = batch.completion_mask.bool()  # [B, T]
    flat = token_logprobs(forward_logits(model, batch)[None], batch.targets[real][None], batch.temperature)[0]  # [K]
    return torch.zeros(real.shape, dtype=flat.dtype, device=flat.device).masked_scatter(real, flat)  # [B, T]

"""Traces → training rows: one segment per generated turn (act or rehearsal), with its tokens, the
logprobs recorded when it was sampled, its run's reward and its group; and batches of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

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
        for step in trace.steps:
            if step.role in roles and step.prompt_ids is not None and step.completion_ids:
                out.append(Segment(run_id=trace.run_id, task_id=trace.task_id, group_id=trace.group_id or trace.task_id,
                                   role=step.role, prompt_ids=list(step.prompt_ids),
                                   completion_ids=list(step.completion_ids),
                                   old_logprobs=list(step.logprobs) if step.logprobs is not None else None,
                                   reward=value, temperature=(step.sampling or {}).get("temperature") or 1.0))
    return out


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] prompt + completion, right-padded
    attention_mask: torch.Tensor  # [B, L]
    completion_mask: torch.Tensor  # [B, L-1] 1 where position t predicts a completion token at t+1
    targets: torch.Tensor  # [B, L-1] input_ids shifted left
    old_logprobs: torch.Tensor  # [B, L-1] recorded logprobs aligned with completion_mask (0 elsewhere)
    temperature: float


def collate(rows: list[Segment], pad_id: int) -> Batch:
    """Right-padded batch where only completion tokens are marked for loss (prompt, tool output and
    padding are masked)."""
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros((len(rows), width), dtype=torch.long)  # [B, L]
    completion = torch.zeros((len(rows), width - 1))  # [B, L-1]
    old = torch.zeros((len(rows), width - 1))  # [B, L-1]
    for i, row in enumerate(rows):
        ids = row.prompt_ids + row.completion_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        start, end = len(row.prompt_ids) - 1, len(ids) - 1  # predictions of completion tokens
        completion[i, start:end] = 1
        if row.old_logprobs is not None:
            old[i, start:end] = torch.tensor(row.old_logprobs)
    temperatures = {r.temperature for r in rows}
    return Batch(input_ids=input_ids, attention_mask=attention, completion_mask=completion,
                 targets=input_ids[:, 1:], old_logprobs=old, temperature=temperatures.pop() if len(temperatures) == 1 else 1.0)


def batch_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:  # [B, L-1]
    """The model's logprobs of every next token (the completion positions are what the loss reads)."""
    from envace_mcp.train.grpo import token_logprobs

    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]  # [B, L-1, V]
    return token_logprobs(logits, batch.targets, batch.temperature)  # [B, L-1]

"""Scoring a completion teacher-forced: its tokens' logprobs after a prompt, the prompt's cached
keys/values reused (`Engine.score(reuse_prefix=True)`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from envace_mcp.engine.prefix_cache import PrefixCache, cache_of


@dataclass
class ScoreRequest:
    """A `score(reuse_prefix=True)` waiting for the engine's lock: served by whoever holds it next."""

    prompt_ids: list[int]
    completion_ids: list[int]
    temperature: float
    done: threading.Event = field(default_factory=threading.Event)
    result: list[float] | None = None
    error: BaseException | None = None


def logprobs_of(logits: torch.Tensor, completion_ids: list[int], temperature: float) -> list[float]:
    """Each completion token's logprob under `logits` [completion, vocabulary] at `temperature` (0: as 1)."""
    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(-1, torch.tensor(completion_ids, device=logits.device)[:, None]).squeeze(-1).tolist()


def logits_after_cached(model: Any, cache_kw: str, prefix_cache: PrefixCache, prompt_ids: list[int],
                        completion_ids: list[int]) -> tuple[torch.Tensor, int]:
    """Logits [completion, vocabulary] predicting each completion token, and how many prompt tokens'
    keys/values came from `prefix_cache` (all but the prompt's last where it holds the prompt)."""
    device = next(model.parameters()).device
    ids = prompt_ids + completion_ids
    reused, kv, _ = prefix_cache.lookup(ids)
    reused = min(reused, len(prompt_ids) - 1)  # the prompt's last token gives the first logits
    cache = cache_of(model.config, kv, reused)
    del kv
    rest = torch.tensor([ids[reused:]], dtype=torch.long, device=device)
    positions = torch.arange(reused, len(ids), device=device)[None, :]
    out = model(input_ids=rest, position_ids=positions, use_cache=True, logits_to_keep=len(completion_ids) + 1,
                **{cache_kw: cache})
    return out.logits[0, :-1].float(), reused

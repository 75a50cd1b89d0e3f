"""What the engine takes and gives back: token ids in, token ids and their sampling logprobs out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """Sampling settings, recorded with every generation."""

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(default=1.0, ge=0.0)
    """1.0 as in EnvACE's rollouts; 0 means greedy (logprobs are then those of the raw logits)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    """0 disables top-k."""
    max_new_tokens: int = Field(default=256, ge=1)
    seed: int | None = None
    """Per-request seed; `None` draws one from the policy's own seeded RNG (still reproducible)."""
    stop: tuple[str, ...] = ()
    """Extra stop strings (the completion keeps the stop string, so tokens stay exact)."""


@dataclass(frozen=True)
class Job:
    """One generation request: a prompt's token ids, how to sample, and the seed of its own generator
    (a row samples the same tokens whichever rows share its batch)."""

    prompt_ids: list[int]
    sampling: SamplingParams
    seed: int
    restrict: Callable[[list[int], Any], None] | None = field(default=None, compare=False)
    """Called before each token with the tokens so far and the next token's logits, which it may mask in
    place (constrained decoding: `policy.constrained.CallConstraint`); the recorded logprob is then the
    constrained distribution's."""


@dataclass(frozen=True)
class Completion:
    """One finished generation: the tokens sampled after `prompt_ids`, each with its logprob under the
    (temperature-scaled) distribution it was drawn from, and their text (the end-of-turn token left out)."""

    text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]

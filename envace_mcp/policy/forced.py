"""A policy that says what a script says, through a real model's tokenizer and weights.

Each role's text comes from a function of the request (a reference solution, a teacher); the
generation carries the exact prompt and completion token ids and the model's own logprobs of that
completion (teacher forcing). This is how reference solutions become SFT traces, and how tests get
traces with real tokens without depending on what a random model samples.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from envace_mcp.errors import UserError
from envace_mcp.policy.base import PromptPolicy
from envace_mcp.policy.prompts import ChatMessage
from envace_mcp.policy.types import (
    ActRequest,
    CritiqueRequest,
    Generation,
    RawCompletion,
    RehearseRequest,
    Role,
    SamplingParams,
)

_TEXT: contextvars.ContextVar[str] = contextvars.ContextVar("envace_forced_text")


class ForcedPolicy(PromptPolicy):
    """Roles answered by functions of the request, tokenised and scored by `base` (a TransformersPolicy)."""

    def __init__(self, base: Any, *, act: Callable[[ActRequest], str] | None = None,
                 rehearse: Callable[[RehearseRequest], str] | None = None,
                 critique: Callable[[CritiqueRequest], str] | None = None, name: str | None = None,
                 score: bool = True) -> None:
        super().__init__(sampling=base.sampling, role_sampling=base.role_sampling)
        self.base = base
        self.functions = {"act": act, "rehearse": rehearse, "critique": critique}
        self.name = name or f"{base.name} (forced)"
        self.score = score
        """False: token ids only, no forward pass (SFT needs no logprobs; offline GRPO does)."""

    def _text(self, role: Role, request: Any) -> None:
        fn = self.functions[role]
        if fn is None:
            raise UserError(f"ForcedPolicy has no function for the {role} role")
        _TEXT.set(fn(request))

    async def _complete(self, role: Role, chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        sampling: SamplingParams) -> RawCompletion:
        return self.base.force(self.base.render(chat, tools), _TEXT.get(), sampling.temperature or 1.0, score=self.score)

    async def act(self, request: ActRequest, sampling: SamplingParams | None = None) -> Generation[Any]:
        self._text("act", request)
        return await super().act(request, sampling)

    async def rehearse(self, request: RehearseRequest, sampling: SamplingParams | None = None) -> Generation[Any]:
        self._text("rehearse", request)
        return await super().rehearse(request, sampling)

    async def critique(self, request: CritiqueRequest, sampling: SamplingParams | None = None) -> Generation[Any]:
        self._text("critique", request)
        return await super().critique(request, sampling)

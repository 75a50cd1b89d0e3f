"""A policy whose roles are Python functions of the request: reference solutions (`--policy reference`,
SFT data) and tests. What a function says is parsed exactly as a model's text would be."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envace_mcp.errors import UserError
from envace_mcp.policy.parsing import parse_act, parse_critique, parse_prediction
from envace_mcp.policy.types import (
    ActOutput,
    ActRequest,
    Critique,
    CritiqueRequest,
    Generation,
    Prediction,
    RehearseRequest,
    Role,
    SamplingParams,
)

Scripted = str | ActOutput | Prediction | Critique


class TextPolicy:
    """Answers each role with text (parsed by the same parsers as a real backend's output) or a parsed
    value, computed by a subclass; `.calls` records (role, request) pairs."""

    name = "test-double"

    def __init__(self) -> None:
        self.calls: list[tuple[Role, Any]] = []
        self.sampling = SamplingParams()

    def _emit(self, role: Role, request: Any, value: Any, sampling: SamplingParams | None) -> Generation[Any]:
        self.calls.append((role, request))
        if isinstance(value, str):
            text = value
            if role == "act":
                parsed: Any = parse_act(value)
            elif role == "rehearse":
                parsed = parse_prediction(value, request.call, request.tool)
            else:
                parsed = parse_critique(value)
        else:
            text, parsed = getattr(value, "content", "") or getattr(value, "text", "") or "", value
        return Generation(role=role, text=text, parsed=parsed, sampling=sampling or self.sampling, model=self.name)


class FunctionPolicy(TextPolicy):
    """Computes each turn with a function of the request (returning text or a parsed object)."""

    def __init__(self, act: Callable[[ActRequest], Scripted] | None = None,
                 rehearse: Callable[[RehearseRequest], Scripted] | None = None,
                 critique: Callable[[CritiqueRequest], Scripted] | None = None) -> None:
        super().__init__()
        self.functions = {"act": act, "rehearse": rehearse, "critique": critique}

    def _call(self, role: Role, request: Any) -> Scripted:
        fn = self.functions[role]
        if fn is None:
            raise UserError(f"FunctionPolicy has no function for the {role} role")
        return fn(request)

    async def act(self, request: ActRequest, sampling: SamplingParams | None = None) -> Generation[ActOutput]:
        return self._emit("act", request, self._call("act", request), sampling)

    async def rehearse(self, request: RehearseRequest, sampling: SamplingParams | None = None) -> Generation[Prediction]:
        return self._emit("rehearse", request, self._call("rehearse", request), sampling)

    async def critique(self, request: CritiqueRequest, sampling: SamplingParams | None = None) -> Generation[Critique]:
        return self._emit("critique", request, self._call("critique", request), sampling)

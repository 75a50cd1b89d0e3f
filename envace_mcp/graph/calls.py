"""The rehearse → gate core, on typed calls: what the graph's nodes and the drop-ins all run.

`rehearse` predicts the outcome of a turn's calls, `gate` decides each (`graph.gate.decide`), `stricter`
re-checks a decision read back from state, and `traced` gives a call's backend the run's `traceparent`.
The proposal itself lives in `graph.proposal`, what a person is asked in `graph.approval`, the replies
in `graph.replies`; the names the act phase and the nodes use from them are re-exported here.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from langchain_core.messages import AnyMessage
from langgraph.config import get_config

from envace_mcp.graph.approval import (
    ApprovalRequest,
    InputAnswer,
    InputRequest,
    approval_request,
    arguments_sent,
    describe,
    input_request,
    outcome_text,
    read_approval,
    read_input,
)
from envace_mcp.graph.evidence import Evidence
from envace_mcp.graph.gate import Decision, GateConfig, Mode, decide, should_rehearse
from envace_mcp.graph.proposal import (
    Proposal,
    RehearsalRecord,
    call_ids,
    examples_from,
    proposals,
    raw_act_message,
    repeated_id,
    spec_digest,
    tool_calls,
    unique_ids,
)
from envace_mcp.graph.replies import (
    observed,
    refusal,
    rejected,
    reply,
    result_of,
    simulated_reply,
    unanswered,
)
from envace_mcp.policy.base import Policy
from envace_mcp.policy.types import ActRequest, Example, Generation, Prediction, RehearseRequest, SamplingParams
from envace_mcp.toolbox import ToolSpec
from envace_mcp.traces.context import RUN_ID, traceparent

__all__ = [  # re-exported for the act phase, the nodes and the drop-ins (`calls.X`)
    "ApprovalRequest", "InputAnswer", "InputRequest", "approval_request", "arguments_sent", "describe",
    "input_request", "outcome_text", "read_approval", "read_input",
    "Proposal", "RehearsalRecord", "call_ids", "examples_from", "proposals", "raw_act_message", "repeated_id",
    "spec_digest", "tool_calls", "unique_ids",
    "observed", "refusal", "rejected", "reply", "result_of", "simulated_reply", "unanswered",
    "rehearse", "gate", "stricter", "call_meta", "traced", "run_id",
]


async def rehearse(
    items: list[Proposal],
    *,
    policy: Policy,
    catalog: list[ToolSpec],
    history: list[AnyMessage],
    act_message: str,
    mode: Mode,
    config: GateConfig,
    examples: list[Example] | None = None,
    sampling: SamplingParams | None = None,
    budget: int | None = None,
    context: ActRequest | None = None,
) -> tuple[list[Proposal], list[Generation[Prediction] | None]]:
    """Predict the outcome of every call the gate's rule rehearses, concurrently (a batching backend
    generates them together), at most `budget` of them. Returns the proposals with their predictions
    and each one's generation (`None`: not rehearsed), for trace recorders. `context`: the act request
    of the turn that proposed the calls (what an inline rehearsal continues)."""
    picked = [i for i, p in enumerate(items) if should_rehearse(p.spec, mode, config)]
    if budget is not None:
        picked = picked[: max(budget, 0)]
    requests = [RehearseRequest(call=items[i].call, tool=items[i].spec, allowed=catalog, history=history,
                                act_message=act_message, examples=list(examples or []), context=context)
                for i in picked]
    generations = await asyncio.gather(*(policy.rehearse(r, sampling) for r in requests))
    out: list[Generation[Prediction] | None] = [None] * len(items)
    done = list(items)
    for i, generation in zip(picked, generations):
        out[i] = generation
        prediction = generation.parsed
        if generation.logprobs and prediction is not None and prediction.confidence is None:
            prediction = prediction.model_copy(update={"confidence": math.exp(generation.logprobs[0])})
        done[i] = replace(items[i], prediction=prediction)
    return done, out


def gate(items: list[Proposal], *, mode: Mode, config: GateConfig, real_calls: int = 0,
         max_real_calls: int | None = None, messages: list[AnyMessage] | None = None,
         specs: Mapping[str, ToolSpec] | None = None) -> list[Proposal]:
    """The gate's decision for each call; calls it would run count against the real-call budget
    (`max_real_calls`, None: none) in order. `messages` (the conversation so far) and `specs` feed the
    evidence rules (`gate.Evidence`)."""
    evidence = None
    if messages is not None and config.reads_evidence:
        evidence = Evidence.of(messages, {name: s.annotations.read_only for name, s in (specs or {}).items()})
    out = []
    for p in items:
        decision = decide(p.call, p.spec, p.prediction, mode=mode, config=config, real_calls=real_calls,
                          max_real_calls=max_real_calls, evidence=evidence)
        real_calls += decision.action in ("execute", "ask")
        out.append(replace(p, decision=decision, gated_spec=spec_digest(p.spec)))
    return out


_NOT_RUN = ("reject", "simulate", "feedback", "block", "budget")


def stricter(recorded: Decision | None, checked: Decision) -> Decision:
    """The stricter of two decisions on one call: any that does not run it, then `ask`, then `execute`.
    The act node checks a call again before running it, since a decision read from graph state may have
    been written by whoever can update that state (a served graph's API caller)."""
    if recorded is None:
        return checked
    for decision in (recorded, checked):
        if decision.action in _NOT_RUN:
            return decision
    return recorded if recorded.action == "ask" or checked.action != "ask" else checked


# ------------------------------------------------------------------ trace context

def call_meta(call_id: str, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`meta` with the W3C `traceparent` of call `call_id` in this run (`traces.context`) added, unless the
    caller's meta has one: the server's spans join the run's trace, under the call's span."""
    meta = dict(meta or {})
    if "traceparent" not in meta:
        meta["traceparent"] = traceparent(run_id(), f"call:{call_id}")
    return meta


def traced(backend: Any, call_id: str) -> Any:
    """A toolbox, or an MCP tool's scope, as a view whose calls carry call `call_id`'s `traceparent` (the
    view's own meta wins, a traceparent of its own included); a backend of your own as it is."""
    if not hasattr(backend, "scoped"):
        return backend
    return backend.scoped(call_meta(call_id, getattr(backend, "meta", None)))


def run_id() -> str:
    """The id of the run this code runs in: a recorded run's trace id (`RUN_ID` in the config's metadata),
    else the thread's id; a run with neither has no id to join on, and each call gets a trace of its own."""
    try:
        config = get_config()
    except RuntimeError:  # outside a graph run
        config = {}
    found = (config.get("metadata") or {}).get(RUN_ID) or (config.get("configurable") or {}).get("thread_id")
    return str(found) if found else uuid.uuid4().hex



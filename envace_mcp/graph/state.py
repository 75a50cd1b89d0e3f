"""Graph state (data) and context (services).

State is plain data a checkpointer can store: the conversation, the rehearsal memory (one record per
proposed call, upserted by call id as rehearse → gate → act fill it in), counters and the outcome.
Services — the policy, the toolbox, the gate configuration — travel in the LangGraph `Runtime`
context and never enter state.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages
from pydantic import PlainValidator, WithJsonSchema
from typing_extensions import NotRequired, TypedDict

from envace_mcp.graph.calls import ApprovalRequest, RehearsalRecord
from envace_mcp.graph.gate import GateConfig, Mode, RunLimits, gate_for
from envace_mcp.policy.base import Policy
from envace_mcp.policy.types import Role, SamplingParams, context_sampling
from envace_mcp.toolbox import ToolBackend, ToolSpec


Approver = Callable[[ApprovalRequest], Any]
"""`EnvaceContext.approve`: sync or async; returns True / False or a decision (`{"type": "approve"}`,
`{"type": "reject", "message": ...}`, `{"type": "edit", "edited_action": {"name": ..., "args": ...}}`)."""

# Services are Python objects, given in code: the context's JSON schema (LangGraph servers publish it)
# shows them as such, and validation passes them through untouched.
_SERVICE = WithJsonSchema({"description": "a Python object, given in code (not set from JSON)"})
PolicyService = Annotated[Optional[Policy], PlainValidator(lambda v: v), _SERVICE]
ToolBackendService = Annotated[Optional[ToolBackend], PlainValidator(lambda v: v), _SERVICE]
ApproverService = Annotated[Optional[Approver], PlainValidator(lambda v: v), _SERVICE]
ToolSpecs = Annotated[Optional[list[ToolSpec]], PlainValidator(lambda v: v), _SERVICE]


def upsert_records(left: list[RehearsalRecord] | None, right: list[RehearsalRecord] | None) -> list[RehearsalRecord]:
    """Append reducer for rehearsal memory: new call ids are appended, known ones updated in place."""
    merged = [dict(r) for r in (left or [])]
    index = {r.get("call_id"): i for i, r in enumerate(merged)}
    for record in right or []:
        key = record.get("call_id")
        if key in index:
            merged[index[key]] = {**merged[index[key]], **record}
        else:
            index[key] = len(merged)
            merged.append(dict(record))
    return merged  # type: ignore[return-value]


class EnvaceState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    task: NotRequired[str]
    """The user's request; defaults to the first human message."""
    notes: NotRequired[str]
    """Memory brought in from outside the run (test-time rehearsal's condensed attempts)."""
    rehearsals: NotRequired[Annotated[list[RehearsalRecord], upsert_records]]
    steps: NotRequired[Annotated[int, operator.add]]
    real_calls: NotRequired[Annotated[int, operator.add]]
    rehearsal_count: NotRequired[Annotated[int, operator.add]]
    final_answer: NotRequired[str | None]
    status: NotRequired[Literal["running", "finished", "max_steps", "stalled"]]
    """`max_steps`: the turns ran out; `stalled`: the same call was stopped (by the gate, or its approval refused)
    `nodes._stalls.REPEATED_STOPS` times since the user's last message. Both end the run without an answer,
    `stop_reason` says how."""
    stop_reason: NotRequired[str | None]
    """Why the run ended without an answer, for a person to read ("stopped: the agent proposed
    delete_todo {"id": "t9"} 3 times and the gate stopped it each time: ..."); None once it answered."""


@dataclass
class EnvaceContext:
    """Services for one graph run (LangGraph `Runtime.context`).

    `toolbox` is a `Toolbox` or `ToolboxScope` (an episode scope for the bundled servers) or any
    `ToolBackend`; it may be `None` in simulated mode, where `tools` (catalog entries) describe what
    the agent can call. A served graph whose context arrives as JSON names its services instead
    (`envace_mcp.graph.served.ServedContext`) and loads them in `prepare()`.
    """

    policy: PolicyService = None
    toolbox: ToolBackendService = None
    tools: ToolSpecs = None
    gate: GateConfig = None  # type: ignore[assignment]
    """How calls are rehearsed and gated; None (the default): `policy_gate(policy)`, GateConfig's defaults
    under what the policy's adapter recommends."""
    limits: RunLimits = field(default_factory=RunLimits)
    """How far the run may go (turns, rehearsals, real calls)."""
    mode: Mode = "real"
    instructions: str | None = None
    """Domain policy shown to the act role (e.g. the servers' instructions)."""
    sampling: dict[Role, SamplingParams] = None  # type: ignore[assignment]
    """Per-role sampling; None (the default): as every run starts (`policy.types.run_sampling`: greedy,
    the rehearse role with its own token budget), unless the policy was given sampling of its own
    (`context_sampling`). `{}`: the policy's own defaults (training rollouts)."""
    memory_items: int = 8
    """Most recent rehearsal records rendered into the act prompt."""
    approve: ApproverService = None
    """Who answers the gate's `ask` decisions inside the run (a terminal prompt, a rule). `None`: the
    act node calls LangGraph's `interrupt()` and the caller resumes with `Command(resume=...)` (needs a
    checkpointer)."""

    def __post_init__(self) -> None:
        self.gate = gate_for(self.policy, self.gate)
        if self.sampling is None:
            self.sampling = context_sampling(self.policy)

    async def prepare(self) -> EnvaceContext:
        """Called by every node before it uses a service; the served graph's context loads them here."""
        return self

    def catalog(self) -> list[ToolSpec]:
        if self.tools is not None:
            return list(self.tools)
        if self.toolbox is not None:
            return list(self.toolbox.catalog)
        return []

    def spec(self, name: str) -> ToolSpec | None:
        return next((s for s in self.catalog() if s.name == name), None)

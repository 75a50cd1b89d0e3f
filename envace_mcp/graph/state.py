"""Graph state (data) and context (services).

State is plain data a checkpointer can store: the conversation, the rehearsal memory (one record per
proposed call, upserted by call id as rehearse → gate → act fill it in), counters and the outcome.
Services — the policy, the toolbox, the gate configuration — travel in the LangGraph `Runtime`
context and never enter state.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages
from typing_extensions import NotRequired, TypedDict

from envace_mcp.graph.gate import GateConfig, Mode
from envace_mcp.policy.types import Role, SamplingParams


class RehearsalRecord(TypedDict, total=False):
    """Everything known about one proposed call."""

    call_id: str
    step: int
    tool: str
    arguments: Any
    prediction: dict[str, Any] | None
    """`Prediction.model_dump()`; `None` when the call was not rehearsed."""
    decision: str
    reason: str
    real: dict[str, Any] | None
    """`ToolResult.model_dump()` when the call ran on a real server."""
    match: float | None
    """Prediction-vs-reality score in [0, 1] when both exist (`policy.fidelity.compare`)."""
    mismatches: list[str]
    approved: bool | None


class ApprovalRequest(TypedDict):
    """What a human (or `EnvaceContext.approve`) is shown for a call the gate wants approved."""

    call: dict[str, Any]
    """`{"name": ..., "arguments": ...}`"""
    rehearsal: dict[str, Any] | None
    """The rehearsed outcome (`Prediction.model_dump()`), `None` when not rehearsed."""
    reason: str | None
    question: str


Approver = Callable[[ApprovalRequest], "bool | Awaitable[bool]"]
"""`EnvaceContext.approve`: sync or async, True to run the call."""


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
    status: NotRequired[Literal["running", "finished", "max_steps"]]


@dataclass
class EnvaceContext:
    """Services for one graph run (LangGraph `Runtime.context`).

    `toolbox` is a `Toolbox` or `ToolboxScope` (an episode scope for the bundled servers); it may be
    `None` in simulated mode, where `tools` (catalog entries) describe what the agent can call.

    For servers such as `langgraph dev`, where the context arrives as JSON, `model` (+ `adapter`) and
    `servers` name the services instead; they are loaded on first use, once per process, in a worker
    thread (`aensure()`: loading a model or starting servers on the event loop would stall every other
    run, and LangGraph's server refuses blocking calls there).
    """

    policy: Any = None
    toolbox: Any = None
    model: str | None = None
    """Hugging Face id or folder for the policy when `policy` is not given (`None`: embedded model)."""
    adapter: str | None = None
    """LoRA adapter for `model`: `None` = the shipped one with the embedded model (as `envace demo`),
    none with other models; `"none"` = no adapter."""
    servers: str | None = None
    """Path of an `mcpServers` JSON file for the toolbox when `toolbox` is not given."""
    tools: list[Any] | None = None
    gate: GateConfig = field(default_factory=GateConfig)
    mode: Mode = "real"
    instructions: str | None = None
    """Domain policy shown to the act role (e.g. the servers' instructions)."""
    sampling: dict[Role, SamplingParams] = field(default_factory=dict)
    memory_items: int = 8
    """Most recent rehearsal records rendered into the act prompt."""
    approve: Any = None
    """`Approver`: who answers the gate's `ask` decisions inside the run (a terminal prompt, a rule).
    `None`: the act node calls LangGraph's `interrupt()` and the caller resumes with
    `Command(resume=...)` (needs a checkpointer). Typed `Any` like the other services: the context's
    JSON schema (LangGraph servers publish it) has no type for a callable."""

    def _needs_toolbox(self) -> bool:
        return self.toolbox is None and bool(self.servers) and self.mode != "simulated"

    def ensure(self) -> EnvaceContext:
        """Fill in `policy` and `toolbox` from `model` / `servers` (process-wide, on first use; blocking)."""
        if self.policy is None:
            self.policy = _shared_policy(self.model, self.adapter)
        if self._needs_toolbox():
            self.toolbox = _shared_toolbox(self.servers)  # type: ignore[arg-type]
        return self

    async def aensure(self) -> EnvaceContext:
        """`ensure()` for the graph's nodes: what is still to load is loaded in a worker thread."""
        if self.policy is None or self._needs_toolbox():
            import anyio

            await anyio.to_thread.run_sync(self.ensure)
        return self

    def catalog(self) -> list[Any]:
        if self.tools is not None:
            return list(self.tools)
        if self.toolbox is not None:
            return list(self.toolbox.catalog)
        return []

    def spec(self, name: str) -> Any:
        return next((s for s in self.catalog() if s.name == name), None)


_SHARED: dict[tuple[str | None, ...], Any] = {}
_LOADING = threading.Lock()  # two first runs at once load one copy


def _shared_policy(model: str | None, adapter: str | None = None) -> Any:
    from envace_mcp.policy.embedded import default_adapter

    adapter = default_adapter(model, adapter)
    key = ("policy", model, adapter)
    with _LOADING:
        if key not in _SHARED:
            from envace_mcp.policy import load_policy

            _SHARED[key] = load_policy(model, adapter=adapter)
    return _SHARED[key]


def _shared_toolbox(servers: str) -> Any:
    """A toolbox on its own event-loop thread, open for the life of the process (calls from any
    loop are carried to it), closed at exit."""
    key = ("toolbox", servers)
    with _LOADING:
        if key not in _SHARED:
            import atexit
            from contextlib import ExitStack

            from envace_mcp.toolbox import blocking_toolbox

            stack = ExitStack()
            _SHARED[key] = stack.enter_context(blocking_toolbox(servers))
            _STACKS.append(stack)
            if len(_STACKS) == 1:
                atexit.register(close_shared)
    return _SHARED[key]


_STACKS: list[Any] = []


def close_shared() -> None:
    """Close the process-wide services opened by `EnvaceContext.ensure()` (servers stop)."""
    while _STACKS:
        _STACKS.pop().close()
    _SHARED.clear()

"""The rehearse → gate core as LangChain's tool-call hooks want it: one call at a time, wrapped
around the handler that runs the real tool (`wrap_tool_call` / `awrap_tool_call`). Shared by
`RehearsingToolNode` (a `ToolNode`) and `RehearsalMiddleware` (`create_agent`)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.types import Command, interrupt

from envace_mcp._sync import run_sync
from envace_mcp.graph import calls
from envace_mcp.graph.calls import Approval, Proposal, RehearsalRecord
from envace_mcp.graph.gate import GateConfig, Mode
from envace_mcp.graph.nodes._common import emit
from envace_mcp.policy.base import Policy
from envace_mcp.policy.types import ToolCall
from envace_mcp.toolbox import ToolSpec
from envace_mcp.toolbox.langchain import spec_from_tool


class ToolCallRehearsal:
    """Rehearse, gate and then run (or not) one tool call; records go to the state key `record_key`
    (through a `Command`) and ride on every reply's `additional_kwargs["envace_rehearsal"]`."""

    def __init__(self, policy: Policy, *, gate: GateConfig | None = None, mode: Mode = "real",
                 tools: list[Any] | None = None, approve: Callable[[calls.ApprovalRequest], Any] | None = None,
                 record_key: str | None = None, messages_key: str = "messages") -> None:
        self.policy = policy
        self.gate = gate or GateConfig()
        self.mode: Mode = mode
        self.specs: dict[str, ToolSpec] = {}
        for tool in tools or []:
            spec = tool if isinstance(tool, ToolSpec) else spec_from_tool(tool)
            self.specs[spec.name] = spec
        self.approve = approve
        self.record_key = record_key
        self.messages_key = messages_key

    # ------------------------------------------------------------------ what the state knows

    def _messages(self, state: Any) -> list[AnyMessage]:
        if isinstance(state, Mapping):
            return list(state.get(self.messages_key, []))
        return list(getattr(state, self.messages_key, None) or [])

    def _records(self, state: Any) -> list[RehearsalRecord]:
        if not self.record_key:
            return []
        value = state.get(self.record_key) if isinstance(state, Mapping) else getattr(state, self.record_key, None)
        return list(value or [])

    def _spec(self, request: Any) -> ToolSpec | None:
        name = request.tool_call["name"]
        if name not in self.specs and request.tool is not None:
            self.specs[name] = spec_from_tool(request.tool)
        return self.specs.get(name)

    # ------------------------------------------------------------------ rehearse → gate

    async def rehearse_turn(self, state: Any, runtime: Any = None) -> list[RehearsalRecord]:
        """Rehearse the calls of the last AI message before any of them runs (`after_model`), so an
        approval request can show the rehearsed outcome; calls already answered are skipped."""
        messages = self._messages(state)
        ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        if ai is None or not ai.tool_calls:
            return []
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        known = {r["call_id"] for r in self._records(state) if r.get("prediction") is not None}
        pending = [p for p in calls.proposals(ai, self.specs) if p.call.id not in answered | known]
        index = messages.index(ai)
        done, generations = await calls.rehearse(
            pending, policy=self.policy, catalog=list(self.specs.values()), history=messages[:index],
            act_message=calls.raw_act_message(ai), mode=self.mode, config=self.gate,
            examples=calls.examples_from(self._records(state)), budget=self._rehearsals_left(state))
        for p, generation in zip(done, generations):
            if generation is not None:
                emit(runtime, "rehearse", generation, call_id=p.call.id)
        return [p.record() for p, g in zip(done, generations) if g is not None]

    def _rehearsals_left(self, state: Any) -> int | None:
        if self.gate.max_rehearsals is None:
            return None
        return self.gate.max_rehearsals - sum(r.get("prediction") is not None for r in self._records(state))

    async def _decided(self, request: Any) -> Proposal:
        """The call with its prediction (rehearsed in `rehearse_turn`, or now) and the gate's decision."""
        raw = request.tool_call
        call = ToolCall(id=raw["id"], name=raw["name"], arguments=raw["args"])
        spec = self._spec(request)
        records = self._records(request.state)
        earlier = next((r for r in records if r.get("call_id") == call.id), None)
        p = Proposal(call, spec)
        if earlier is not None and earlier.get("prediction") and earlier.get("arguments") == call.arguments:
            p = Proposal.from_record(call, spec, {"prediction": earlier["prediction"]})
        else:  # not rehearsed yet, or a reviewer edited the arguments since
            messages = self._messages(request.state)
            ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
            history = messages[: messages.index(ai)] if ai is not None else messages
            (p,), (generation,) = await calls.rehearse(
                [p], policy=self.policy, catalog=list(self.specs.values()), history=history,
                act_message=calls.raw_act_message(ai) if ai is not None else "", mode=self.mode, config=self.gate,
                examples=calls.examples_from(records), budget=self._rehearsals_left(request.state))
            if generation is not None:
                emit(request.runtime, "rehearse", generation, call_id=call.id)
        real_calls = sum(r.get("real") is not None for r in records)
        return calls.gate([p], mode=self.mode, config=self.gate, real_calls=real_calls,
                          messages=self._messages(request.state), specs=self.specs)[0]

    # ------------------------------------------------------------------ the hooks

    async def awrap(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> ToolMessage | Command:
        p = await self._decided(request)
        action = p.decision.action if p.decision else "execute"
        approval = None
        if action == "ask":
            request_shown = calls.approval_request(p)
            answer = interrupt(request_shown) if self.approve is None else self.approve(request_shown)
            approval = calls.read_approval(await answer if inspect.isawaitable(answer) else answer, p.call)
            if not approval.approved:
                return self._done(p, calls.rejected(p.call, approval), approval)
            action = "execute"
        if action == "execute":
            return self._done(p, await handler(self._edited(request, approval)), approval)
        return self._done(p, self._unrun(p, action))

    def wrap(self, request: Any, handler: Callable[[Any], Any]) -> ToolMessage | Command:
        p = run_sync(self._decided(request))  # the policy is async; a sync agent still gets its rehearsal
        action = p.decision.action if p.decision else "execute"
        approval = None
        if action == "ask":
            request_shown = calls.approval_request(p)
            answer = interrupt(request_shown) if self.approve is None else self.approve(request_shown)
            approval = calls.read_approval(run_sync(answer) if inspect.isawaitable(answer) else answer, p.call)
            if not approval.approved:
                return self._done(p, calls.rejected(p.call, approval), approval)
            action = "execute"
        if action == "execute":
            return self._done(p, handler(self._edited(request, approval)), approval)
        return self._done(p, self._unrun(p, action))

    @staticmethod
    def _edited(request: Any, approval: Approval | None) -> Any:
        if approval is None or approval.edited is None:
            return request
        edited = {**request.tool_call, "name": approval.edited.name, "args": approval.edited.arguments}
        return request.override(tool_call=edited)

    @staticmethod
    def _unrun(p: Proposal, action: str) -> ToolMessage:
        return calls.simulated_reply(p.call, p.prediction) if action == "simulate" else calls.refusal(p)

    def _done(self, p: Proposal, reply: Any, approval: Approval | None = None) -> ToolMessage | Command:
        record = p.record()
        if approval is not None:
            record["approved"] = approval.approved
            if not approval.approved:
                record["decision"] = "rejected_by_human"
            elif approval.edited is not None:
                record["edited"] = {"name": approval.edited.name, "args": approval.edited.arguments}
        ran = p.decision is None or p.decision.action in ("execute", "ask")
        result = calls.result_of(p.call, reply) if ran and record.get("decision") != "rejected_by_human" else None
        if result is not None:
            observed = calls.observed(p if approval is None or approval.edited is None else Proposal(p.call, p.spec), result)
            record.update(observed)  # type: ignore[typeddict-item]
        if isinstance(reply, ToolMessage):
            reply.additional_kwargs["envace_rehearsal"] = dict(record)
        if not self.record_key or not isinstance(reply, ToolMessage):
            return reply
        return Command(update={self.messages_key: [reply], self.record_key: [record]})

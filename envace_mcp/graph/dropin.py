"""The rehearse → gate core as LangChain's tool-call hooks want it: one call at a time, wrapped
around the handler that runs the real tool (`wrap_tool_call` / `awrap_tool_call`). Shared by
`RehearsingToolNode` (a `ToolNode`) and `RehearsalMiddleware` (`create_agent`). A call the gate stops
for the third time since the user's last message (`nodes._stalls`) is told it will not run: the reply
says so, and `RehearsalMiddleware` ends the agent's loop there. Traced to LangSmith, each call shows
`rehearse`, `gate` and `act` as named steps of the node running it (`traces.langsmith.named_step`).

An MCP tool (`toolbox.langchain.MCPTool`) runs with the run's `traceparent` in its call's `_meta`, and a
server that asks for input while it runs is asked about (`acting.Respond`) and answered through the
tool's own scope: the answers go to the server the call went to, not through the handler again.
Without `approve`, the middleware asks with `interrupt()`; on resume the call's first round is sent
again (the handler cannot be kept across the pause), which a server that asks before acting answers
with the same questions. A tool node, which cannot pause, answers nothing without `approve`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from envace_mcp._sync import run_sync
from envace_mcp.graph import calls
from envace_mcp.graph.acting import Acted, Respond, act_async, act_sync, send_answers
from envace_mcp.graph.approval import ApprovalRequest, InputRequest
from envace_mcp.graph.calls import Proposal, RehearsalRecord
from envace_mcp.graph.gate import Decision, GateConfig, Mode, RunLimits, gate_for
from envace_mcp.graph.nodes._common import emit
from envace_mcp.graph.nodes._stalls import mark_repeats
from envace_mcp.graph.turn_order import CURRENT, Turn
from envace_mcp.policy.base import Policy
from envace_mcp.policy.types import ToolCall, context_sampling
from envace_mcp.toolbox import ToolSpec
from envace_mcp.toolbox.langchain import spec_from_tool
from envace_mcp.traces.langsmith import named_step


class ToolCallRehearsal:
    """Rehearse, gate and then run (or not) one tool call; records go to the state key `record_key`
    (through a `Command`) and ride on every reply's `additional_kwargs["envace_rehearsal"]`."""

    def __init__(self, policy: Policy, *, gate: GateConfig | None = None, limits: RunLimits | None = None,
                 mode: Mode = "real", tools: list[Any] | None = None,
                 approve: Callable[[ApprovalRequest | InputRequest], Any] | None = None,
                 record_key: str | None = None, messages_key: str = "messages", pauses: bool = True,
                 trust_annotations: bool = True) -> None:
        self.policy = policy
        self.trust_annotations = trust_annotations
        """False: the hints of tools made by LangChain's MCP libraries (or any LangChain tool) are not
        believed, so every call to them counts as destructive (`spec_from_tool`). Our toolbox's tools
        keep the trust their server's config gives (`trust_annotations` there)."""
        self.gate = gate_for(policy, gate)
        self.limits = limits or RunLimits()
        self.sampling = context_sampling(policy).get("rehearse")
        """The rehearse role's sampling, as every run starts (`policy.types.context_sampling`)."""
        self.mode: Mode = mode
        self.specs: dict[str, ToolSpec] = {}
        self.tools: dict[str, Any] = {}
        self.declared: set[str] = set()
        """Names the caller described with a `ToolSpec` of their own: their word over the tool's."""
        for tool in tools or []:
            spec = tool if isinstance(tool, ToolSpec) else spec_from_tool(tool, trust_annotations=trust_annotations)
            self.specs[spec.name] = spec
            if isinstance(tool, ToolSpec):
                self.declared.add(spec.name)
            else:
                self.tools[spec.name] = tool
        self.approve = approve
        self.record_key = record_key
        self.messages_key = messages_key
        self.pauses = pauses
        """Whether a question with no `approve` to answer it may pause the run (`interrupt()`)."""

    # ------------------------------------------------------------------ what the state knows

    def _messages(self, state: Any) -> list[AnyMessage]:
        if isinstance(state, list):  # a graph whose state is the message list itself
            return list(state)
        if isinstance(state, Mapping):
            return list(state.get(self.messages_key, []))
        return list(getattr(state, self.messages_key, None) or [])

    def _records(self, state: Any) -> list[RehearsalRecord]:
        if not self.record_key:
            return []
        value = state.get(self.record_key) if isinstance(state, Mapping) else getattr(state, self.record_key, None)
        return list(value or [])

    def _spec(self, request: ToolCallRequest) -> ToolSpec | None:
        return self._spec_named(request.tool_call["name"], request)

    def _spec_named(self, name: str, request: ToolCallRequest) -> ToolSpec | None:
        """The catalog entry a call to `name` is gated by: the one of the tool that will run it (an MCP
        tool refuses the call if its server's listing has changed since, so gate and route agree), a
        `ToolSpec` the caller declared, or, for a tool only known from `tools`, that snapshot."""
        tool = request.tool if request.tool is not None and name == request.tool_call["name"] else self.tools.get(name)
        if name in self.declared or tool is None:
            return self.specs.get(name)
        spec = spec_from_tool(tool, trust_annotations=self.trust_annotations)
        self.specs[name] = spec
        return spec

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
        with named_step("rehearse", calls=[p.call for p in pending]) as step:
            done, generations = await calls.rehearse(
                pending, policy=self.policy, catalog=list(self.specs.values()), history=messages[:index],
                act_message=calls.raw_act_message(ai), mode=self.mode, config=self.gate,
                examples=calls.examples_from(self._records(state)), budget=self._rehearsals_left(state),
                sampling=self.sampling)
            step.done(predictions=[p.prediction for p in done])
        for p, generation in zip(done, generations):
            if generation is not None:
                emit(runtime, "rehearse", generation, call_id=p.call.id)
        return [p.record() for p, g in zip(done, generations) if g is not None]

    def _rehearsals_left(self, state: Any) -> int | None:
        if self.limits.max_rehearsals is None:
            return None
        return self.limits.max_rehearsals - sum(r.get("prediction") is not None for r in self._records(state))

    async def _decided(self, request: ToolCallRequest) -> Proposal:
        """The call with its prediction (rehearsed in `rehearse_turn`, or now) and the gate's decision."""
        raw = request.tool_call
        call = ToolCall(id=raw.get("id") or "", name=raw["name"], arguments=raw["args"])
        spec = self._spec(request)
        records = self._records(request.state)
        if calls.repeated_id(call, self._messages(request.state)):  # its record, approval and reply would mix
            return replace(Proposal(call, spec), decision=Decision(
                "reject", f"the tool-call id {call.id!r} is shared with another proposed call in this run, so "
                          "neither can be approved or recorded on its own; not run (give every call its own id)"))
        earlier = next((r for r in records if r.get("call_id") == call.id), None)
        p = Proposal(call, spec)
        if earlier is not None and earlier.get("prediction") and earlier.get("arguments") == call.arguments:
            p = Proposal.from_record(call, spec, {"prediction": earlier["prediction"]})
        else:  # not rehearsed yet, or a reviewer edited the arguments since
            messages = self._messages(request.state)
            ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
            history = messages[: messages.index(ai)] if ai is not None else messages
            with named_step("rehearse", call=call) as step:
                (p,), (generation,) = await calls.rehearse(
                    [p], policy=self.policy, catalog=list(self.specs.values()), history=history,
                    act_message=calls.raw_act_message(ai) if ai is not None else "", mode=self.mode, config=self.gate,
                    examples=calls.examples_from(records), budget=self._rehearsals_left(request.state),
                    sampling=self.sampling)
                step.done(prediction=p.prediction)
            if generation is not None:
                emit(request.runtime, "rehearse", generation, call_id=call.id)
        messages = self._messages(request.state)
        with named_step("gate", call=call, prediction=p.prediction) as step:
            decided = calls.gate([p], mode=self.mode, config=self.gate, real_calls=self._real_calls(request.state),
                                 max_real_calls=self.limits.max_real_calls, messages=messages, specs=self.specs)
            p = mark_repeats(messages, decided)[0]  # its call's third stop tells the agent it will never run
            step.done(decision=p.decision)
        return p

    def _real_calls(self, state: Any) -> int:
        """Calls of this run that reached a real tool, for `max_real_calls`: from the records in state, or,
        with no `record_key`, from the records every reply carries (`envace_rehearsal`). Calls of one turn
        run side by side and are each gated against the count before the turn."""
        if self.record_key:
            return sum(r.get("real") is not None for r in self._records(state))
        return sum(1 for m in self._messages(state) if isinstance(m, ToolMessage)
                   and (m.additional_kwargs.get("envace_rehearsal") or {}).get("real") is not None)

    # ------------------------------------------------------------------ the hooks

    async def awrap(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]],
                    ) -> ToolMessage | Command:
        turn, where = _in_turn(request)
        try:
            p = _placed(await self._decided(request), where)
            if where is not None and _asks(p):
                await turn.wait(where[0])  # type: ignore[union-attr]
            with named_step("act", call=p.call, decision=p.decision) as step:
                acted = await act_async(p, ask=self._asker(turn, where),
                                        run=lambda call, spec: handler(self._running(request, call)),
                                        regate=lambda call: self._regate(request, call),
                                        sent=lambda call: _sent(request, call),
                                        respond=lambda step: self._respond(request, step))
                step.done(ran=acted.ran, record=acted.record)
        finally:
            _pass(turn, where)
        return self._done(acted)

    def wrap(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Any]) -> ToolMessage | Command:
        turn, where = _in_turn(request)
        try:
            p = _placed(run_sync(self._decided(request)), where)  # the policy is async; a sync agent still rehearses
            if where is not None and _asks(p):
                turn.wait_sync(where[0])  # type: ignore[union-attr]
            with named_step("act", call=p.call, decision=p.decision) as step:
                acted = act_sync(p, ask=self._asker(turn, where),
                                 run=lambda call, spec: handler(self._running(request, call)),
                                 regate=lambda call: self._regate(request, call), sent=lambda call: _sent(request, call),
                                 respond=lambda step: self._respond(request, step))
                step.done(ran=acted.ran, record=acted.record)
        finally:
            _pass(turn, where)
        return self._done(acted)

    def _asker(self, turn: Turn | None, where: tuple[int, int] | None,
               ) -> Callable[[ApprovalRequest | InputRequest], Any]:
        """`_ask`, letting the turn's next call ask once this call's approval is answered (its tool may
        still be running: the next question need not wait for it)."""
        def ask(request: ApprovalRequest | InputRequest) -> Any:
            answer = self._ask(request)
            if request["type"] == "tool_approval":
                _pass(turn, where)
            return answer
        return ask

    def _ask(self, request: ApprovalRequest | InputRequest) -> Any:
        if self.approve is not None:
            return self.approve(request)
        if request["type"] == "tool_input" and not self.pauses:
            return {"type": "reject", "message": "nobody to ask: this tool node has no approve=, and cannot pause"}
        return interrupt(request)

    async def _respond(self, request: ToolCallRequest, step: Respond) -> Any:
        """Send the answers to the server the call went to (an MCP tool's scope, with the call's trace)."""
        scope = getattr(self._tool(request, step.call.name), "scope", None)
        return await send_answers(scope, step, self.limits.max_input_rounds)

    def _tool(self, request: ToolCallRequest, name: str) -> Any:
        return request.tool if name == request.tool_call["name"] else self.tools.get(name)

    def _regate(self, request: ToolCallRequest, edited: ToolCall) -> Proposal:
        """A reviewer's edit, validated and gated as the EnvACE graph's act node does it."""
        spec = self._spec_named(edited.name, request)
        return calls.gate([Proposal(edited, spec)], mode=self.mode, config=self.gate)[0]

    def _running(self, request: ToolCallRequest, call: ToolCall) -> ToolCallRequest:
        """The handler's request for `call`: the proposed one, or a reviewer's edit (to its own tool); an MCP
        tool's call carries the run's `traceparent`."""
        tool = self._tool(request, call.name)
        scope = getattr(tool, "scope", None)
        if hasattr(scope, "scoped"):
            tool = tool.model_copy(update={"scope": calls.traced(scope, call.id)})
        elif call.name == request.tool_call["name"] and call.arguments == request.tool_call["args"]:
            return request
        return request.override(tool_call={**request.tool_call, "name": call.name, "args": call.arguments}, tool=tool)

    def _done(self, acted: Acted) -> ToolMessage | Command:
        reply = acted.reply
        if isinstance(reply, ToolMessage):
            reply.additional_kwargs["envace_rehearsal"] = dict(acted.record)
        if not self.record_key or not isinstance(reply, ToolMessage):
            return reply
        return Command(update={self.messages_key: [reply], self.record_key: [acted.record]})


def _in_turn(request: ToolCallRequest) -> tuple[Turn | None, tuple[int, int] | None]:
    """The turn a tool node runs this call in (`turn_order`), and the call's (index, count) in it; None, None
    outside a tool node (the middleware, whose calls LangGraph runs as tasks of their own)."""
    turn = CURRENT.get()
    where = turn.position(request.tool_call.get("id") or "") if turn is not None else None
    return (turn, where) if where is not None else (None, None)


def _placed(p: Proposal, where: tuple[int, int] | None) -> Proposal:
    """`p` saying which call of its turn it is, where the turn has more than one (`approval_request`)."""
    return replace(p, position=where) if where is not None and where[1] > 1 else p


def _asks(p: Proposal) -> bool:
    return p.decision is not None and p.decision.action == "ask" and not p.tool_changed


def _pass(turn: Turn | None, where: tuple[int, int] | None) -> None:
    if turn is not None and where is not None:
        turn.passed(where[0])


def _sent(request: ToolCallRequest, call: ToolCall) -> Any:
    """The arguments the tool will send for `call`: an MCP tool's scope adds its bound ones."""
    return calls.arguments_sent(getattr(request.tool, "scope", None), call)

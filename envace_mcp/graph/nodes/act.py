"""act: one task per proposed call — execute it on the real server, answer it with its rehearsal
(simulated), ask a human, or explain why it was not run (`graph.acting`, the act phase every form
runs). Every path ends in a ToolMessage.

Without an approver the node pauses with `interrupt()`, and on resume LangGraph runs it again from the
start. So every round sent to a server (the call, and each answer to its questions) runs as a LangGraph
task (`_round`), whose result the checkpoint keeps: on resume it is read back, not sent again. Each call
carries the run's W3C `traceparent` in `_meta` (`calls.traced`)."""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

from langgraph.func import task
from langgraph.runtime import Runtime
from langgraph.types import interrupt
from typing_extensions import TypedDict

from envace_mcp.errors import UserError
from envace_mcp.graph import calls
from envace_mcp.graph.acting import Respond, Run, act_async, ask_answers, send_answers
from envace_mcp.graph.calls import Proposal, RehearsalRecord
from envace_mcp.graph.state import EnvaceContext
from envace_mcp.policy.types import ToolCall
from envace_mcp.toolbox import ToolBackend, ToolResult, ToolSpec
from envace_mcp.toolbox.asking import Asker


class ActInput(TypedDict):
    call: dict[str, Any]
    record: RehearsalRecord


async def act(payload: ActInput, runtime: Runtime[EnvaceContext]) -> dict[str, Any]:
    ctx = await runtime.context.prepare()
    raw = payload["call"]
    call = ToolCall(id=raw["id"], name=raw["name"], arguments=raw["args"])
    recorded = Proposal.from_record(call, ctx.spec(call.name), payload["record"])
    # checked again here: the record comes from graph state, which an API caller can write (a Command
    # sent straight to `act`, an update_state), so it can tighten what runs, never loosen it
    checked = calls.gate([replace(recorded, decision=None)], mode=ctx.mode, config=ctx.gate)[0]
    p = replace(recorded, decision=calls.stricter(recorded.decision, checked.decision))

    def regate(edited: ToolCall) -> Proposal:
        return calls.gate([Proposal(edited, ctx.spec(edited.name))], mode=ctx.mode, config=ctx.gate)[0]

    async def send(step: Any) -> ToolResult:
        if isinstance(step, Respond):
            return await send_answers(ctx.toolbox, step, ctx.limits.max_input_rounds)
        if ctx.approve is None:  # a 2025 server's mid-call question cannot pause the run: refused
            return await call_tool(ctx.toolbox, step.call, step.spec)
        target = p if step.call == p.call else Proposal(step.call, step.spec)

        async def answer(questions: list[Any]) -> Any:  # the approver answers it inside the run
            shown = calls.arguments_sent(ctx.toolbox, target.call)
            return (await ask_answers(lambda request: ask(ctx, request), target, questions, shown=shown)).responses

        return await call_tool(ctx.toolbox, step.call, step.spec, ask=answer)

    async def sent_once(step: Any) -> ToolResult:  # read back on a resume instead of sent again
        if ctx.approve is not None:  # nothing pauses this run: nothing runs twice
            return await send(step)
        return ToolResult.model_validate(await _round(send, step))

    acted = await act_async(p, ask=lambda request: ask(ctx, request),
                            run=lambda target, spec: sent_once(Run(target, spec)), respond=sent_once, regate=regate,
                            sent=lambda target: calls.arguments_sent(ctx.toolbox, target))
    return {"messages": [acted.reply], "rehearsals": [acted.record], **({"real_calls": 1} if acted.ran else {})}


@task(name="envace_round")
async def _round(send: Any, step: Any) -> dict[str, Any]:
    """One round sent to a server, as a task: its result (JSON, for the checkpoint) outlives an interrupt."""
    return (await send(step)).model_dump(mode="json")


async def ask(ctx: EnvaceContext, request: Any) -> Any:
    """The context's approver answers inside the run; without one, LangGraph's `interrupt()` pauses it."""
    if ctx.approve is None:
        return interrupt(request)
    answer = ctx.approve(request)
    return await answer if inspect.isawaitable(answer) else answer


async def call_tool(backend: ToolBackend, call: ToolCall, spec: ToolSpec | None, ask: Asker | None = None) -> ToolResult:
    """Run `call` on the backend, routed only to the catalog entry the gate judged (`expect`), with the
    run's `traceparent` in `_meta`, and `ask` answering a 2025-era server's mid-call questions."""
    if not isinstance(backend, ToolBackend):
        raise UserError(f"the context's toolbox is a {type(backend).__name__}, not a ToolBackend: subclass "
                        "envace_mcp.toolbox.ToolBackend (its `call` takes timeout, expect, ask and meta)")
    return await calls.traced(backend, call.id).call(call.name, call.arguments, expect=spec, ask=ask)

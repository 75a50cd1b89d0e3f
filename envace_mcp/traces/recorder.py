"""Recording graph runs from LangGraph's stream: `updates` (messages, gate decisions, real results)
and `custom` (generations with their tokens and logprobs, which never enter graph state).

    state, trace = await record_run(graph, {"messages": [("user", task)]}, context=ctx, store=store,
                                    task_id=task.id, suite="bank", group_id="g1")

Works for the EnvACE graph and for any graph using the drop-ins (their records ride on each
ToolMessage); a run that raises or is interrupted still produces a trace, marked as such. Each
run has its own recorder, so dozens of concurrent runs never mix steps.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from envace_mcp.traces.context import RUN_ID
from envace_mcp.traces.schema import Comparison, Reward, RunStatus, Step, Trace
from envace_mcp.toolbox import ToolResult


class TraceRecorder:
    """Turns stream chunks of one run into a `Trace`."""

    def __init__(self, *, run_id: str | None = None, context: Any = None, **fields: Any) -> None:
        defaults: dict[str, Any] = {}
        if context is not None:
            defaults["mode"] = getattr(context, "mode", "real")
            for name in ("gate", "limits"):  # settings models (pydantic): recorded as their JSON
                settings = getattr(context, name, None)
                if hasattr(settings, "model_dump"):
                    defaults[name] = settings.model_dump(mode="json")
            tools = getattr(context, "tools", None) or getattr(getattr(context, "toolbox", None), "catalog", None)
            if tools:  # the catalog the run saw: a world model can be fitted from the run alone
                defaults["tools"] = [spec.to_dict() for spec in tools if hasattr(spec, "to_dict")] or None
            sampling = getattr(context, "sampling", None) or {}
            defaults["sampling"] = {role: s.model_dump(mode="json") for role, s in sampling.items()}
            policy = getattr(context, "policy", None)
            if policy is not None:
                defaults["model"] = getattr(policy, "name", None)

                def prompts(name: str) -> Any:  # the policy's, or the backend's under a wrapper (ForcedPolicy)
                    return getattr(policy, name, None) or getattr(getattr(policy, "base", None), name, None)

                if prompts("tool_format"):  # how the act prompts rendered tools: what an adapter trained on this run learns
                    defaults["metadata"] = {"tool_format": prompts("tool_format")}
                if prompts("rehearse_format"):
                    defaults["rehearse_format"] = prompts("rehearse_format")
            instructions = getattr(context, "instructions", None)
            if isinstance(instructions, str) and instructions.strip():  # part of the act system prompt (TRL rows)
                defaults.setdefault("metadata", {})["instructions"] = instructions
        if "metadata" in fields:
            fields = {**fields, "metadata": {**defaults.get("metadata", {}), **fields["metadata"]}}
        defaults.update(fields)
        self.trace = Trace(run_id=run_id or uuid.uuid4().hex, started_at=time.time(), **defaults)
        self._calls: dict[str, dict[str, Any]] = {}
        self._gated: set[tuple[str, str]] = set()
        self._unclaimed_act = False
        self._interrupted = False
        self.state: dict[str, Any] = {}

    def _add(self, **fields: Any) -> Step:
        step = Step(index=len(self.trace.steps), time=time.time(), **fields)
        self.trace.steps.append(step)
        return step

    def observe(self, kind: str, chunk: Any) -> None:
        """Feed one `(stream_mode, chunk)` pair from `astream(..., stream_mode=[...])`."""
        if kind == "custom" and isinstance(chunk, dict) and chunk.get("envace") == "generation":
            self._generation(chunk)
        elif kind == "updates" and isinstance(chunk, dict):
            for node, update in chunk.items():
                if node == "__interrupt__":
                    self._interrupted = True
                elif isinstance(update, dict):
                    self._update(node, update)
        elif kind == "values" and isinstance(chunk, dict):
            self.state = chunk

    def _generation(self, event: dict[str, Any]) -> None:
        gen = event["generation"]
        parsed = gen.parsed.model_dump(mode="json") if hasattr(gen.parsed, "model_dump") else gen.parsed
        self._add(role=gen.role, node=event.get("node"), call_id=event.get("call_id"), prompt_text=gen.prompt_text,
                  prompt_ids=gen.prompt_ids, completion_ids=gen.completion_ids, logprobs=gen.logprobs, text=gen.text,
                  parsed=parsed, sampling=gen.sampling.model_dump(mode="json"), finish_reason=gen.finish_reason,
                  format=getattr(gen, "prompt_format", None), close=getattr(gen, "turn_close", None))
        if gen.role == "act":
            self._unclaimed_act = True

    def _update(self, node: str, update: dict[str, Any]) -> None:
        records = {r.get("call_id"): r for r in update.get("rehearsals", []) or []}
        for call_id, record in records.items():
            self._calls.setdefault(call_id, {}).update(record)
        for message in update.get("messages", []) or []:
            if isinstance(message, AIMessage):
                for call in message.tool_calls:
                    self._calls.setdefault(call["id"], {}).update({"tool": call["name"], "arguments": call["args"]})
                if self._unclaimed_act:
                    self._unclaimed_act = False
                else:  # a foreign model (drop-ins): the turn without tokens
                    self._add(role="act", node=node, text=str(message.content),
                              parsed={"tool_calls": [{"id": c["id"], "name": c["name"], "arguments": c["args"]}
                                                     for c in message.tool_calls], "content": str(message.content)})
            elif isinstance(message, ToolMessage):
                record = message.additional_kwargs.get("envace_rehearsal")
                if record:
                    self._calls.setdefault(message.tool_call_id, {}).update(record)
                    self._gate_step(node, message.tool_call_id)
                self._tool_step(node, message)
        for call_id, record in records.items():
            if record.get("decision"):
                self._gate_step(node, call_id)

    def _gate_step(self, node: str, call_id: str) -> None:
        known = self._calls.get(call_id, {})
        decision = known.get("decision")
        if not decision or (call_id, decision) in self._gated:
            return
        self._gated.add((call_id, decision))
        self._add(role="gate", node=node, call_id=call_id, tool=known.get("tool"), arguments=known.get("arguments"),
                  decision=decision, reason=known.get("reason"), confidence=(known.get("prediction") or {}).get("confidence"))

    def _tool_step(self, node: str, message: ToolMessage) -> None:
        known = self._calls.get(message.tool_call_id, {})
        artifact = message.artifact
        simulated = known.get("decision") == "simulate"
        if isinstance(artifact, ToolResult):
            result = artifact.model_dump(mode="json")
        elif known.get("real") is not None:
            result = known["real"]
        else:
            result = {"content": [{"type": "text", "text": str(message.content)}], "is_error": message.status == "error",
                      "structured_content": None, "error_kind": None}
        comparison = None
        if known.get("match") is not None:
            comparison = Comparison(score=known["match"], status_match=known.get("status_match"),
                                    mismatches=known.get("mismatches") or [])
        self._add(role="tool", node=node, call_id=message.tool_call_id, tool=message.name or known.get("tool"),
                  arguments=known.get("arguments"), result=result, simulated=simulated,
                  decision=known.get("decision"), reason=known.get("reason"), comparison=comparison,
                  approved=known.get("approved"), edited=known.get("edited"), asked=known.get("asked"))

    def finish(self, state: dict[str, Any] | None = None, *, status: RunStatus | None = None,
               error: str | None = None) -> Trace:
        state = state if state is not None else self.state
        answer = state.get("final_answer")
        if answer is None and not state.get("status"):
            last = next((m for m in reversed(state.get("messages", [])) if isinstance(m, AIMessage)), None)
            answer = str(last.content) if last is not None and not last.tool_calls else None
        self.trace.final_answer = answer
        self.trace.status = status or ("interrupted" if self._interrupted else "finished")
        self.trace.error = error
        if state.get("stop_reason"):  # why a run ended without an answer (its turns spent, one call stopped again and again)
            self.trace.metadata = {**self.trace.metadata, "stop_reason": state["stop_reason"]}
        self.trace.ended_at = time.time()
        if self.trace.task is None:
            self.trace.task = state.get("task") or next(
                (str(m.content) for m in state.get("messages", []) if getattr(m, "type", "") == "human"), None)
        return self.trace


RewardFunction = Callable[[Trace, dict[str, Any]], Any]
"""`fn(trace, final_state) -> (value, details)` (sync or async), named by its `__name__` (or a `name`
attribute); `None` or a `None` value: the run cannot be scored (recorded as such, never as 0)."""


async def score(trace: Trace, state: dict[str, Any], rewards: Sequence[RewardFunction]) -> Trace:
    """Attach each reward function's verdict on a finished run to its trace."""
    for fn in rewards:
        name = getattr(fn, "name", None) or getattr(fn, "__name__", "reward")
        verdict = fn(trace, state)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        value, details = verdict if verdict is not None else (None, {"unscorable": True})
        trace.rewards.append(Reward(name=name, value=None if value is None else float(value), details=dict(details or {})))
    return trace


async def record_run(graph: Any, graph_input: Any, *, context: Any = None, config: dict[str, Any] | None = None,
                     store: Any = None, recorder: TraceRecorder | None = None,
                     on_update: Callable[[str, Any], None] | None = None, rewards: Sequence[RewardFunction] = (),
                     **fields: Any) -> tuple[dict[str, Any], Trace]:
    """Run a compiled graph — the EnvACE graph or any agent (`create_agent`, a hand-built graph with the
    drop-ins) — recording it; the trace is appended to `store` even if the run fails. `rewards` score a
    finished run before it is stored. `on_update(node, update)` sees each node's update as it arrives
    (a live transcript)."""
    recorder = recorder or TraceRecorder(context=context, **fields)
    # the run's id reaches its nodes, so each call's `traceparent` names this trace (`graph.calls.call_meta`)
    config = {**(config or {}), "metadata": {**(config or {}).get("metadata", {}), RUN_ID: recorder.trace.run_id}}
    try:
        async for kind, chunk in graph.astream(graph_input, config, context=context,
                                               stream_mode=["updates", "custom", "values"]):
            recorder.observe(kind, chunk)
            if kind == "updates" and on_update is not None:
                for node, update in chunk.items():
                    if node != "__interrupt__":
                        on_update(node, update)
    except BaseException as exc:
        interrupted = isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError))
        trace = recorder.finish(status="interrupted" if interrupted else "failed", error=f"{type(exc).__name__}: {exc}")
        if store is not None:
            store.append(trace)
        raise
    trace = await score(recorder.finish(), recorder.state, rewards)
    if store is not None:
        store.append(trace)
    return recorder.state, trace


async def record_group(graph: Any, graph_input: Callable[[], Any] | Any, *, k: int, group_id: str,
                       rewards: Sequence[RewardFunction] = (), **kwargs: Any) -> list[Trace]:
    """K concurrent recorded runs of one task (one GRPO group, `group_id`); a batching policy generates
    their turns together. `graph_input` may be a function making each run's input (fresh messages)."""
    def make() -> Any:
        return graph_input() if callable(graph_input) else copy.deepcopy(graph_input)

    runs = await asyncio.gather(*(record_run(graph, make(), group_id=group_id, rewards=rewards, **kwargs)
                                  for _ in range(k)))
    return [trace for _, trace in runs]

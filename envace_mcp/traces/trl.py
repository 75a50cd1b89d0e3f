"""TRL rows: recorded runs as TRL's conversational dataset with tools, one row a run (JSONL), for
`SFTTrainer` on the conversations and GRPO-style trainers on the recorded tokens.

    {"run_id", "task_id", "group_id", "mode", "rewards": {name: value}, "stopped_calls": n,
     "messages": [...], "tools": [...], "generations": [...]}

`messages` is the run in OpenAI / TRL chat form, rendered by the act role's own renderer
(`policy.prompts.render_act`): the act system prompt where the run's act prompts show it, the task, each
act turn as an assistant message (`tool_calls`: `{"type": "function", "id", "function": {"name",
"arguments"}}`), each answered call as a `tool` message (`tool_call_id`, `name`, the reply as a prompt
showed it), the graph's reminder after a turn whose call could not be read, and the final answer. A call
the gate stopped (or a person refused) never reached a server: it and the refusal are left out, and
counted in `stopped_calls`; a turn left with neither text nor calls is left out whole. `tools` is the
run's catalog as the act prompts gave it to the chat template (`tools=`). So `messages` is what happened
in the environment; what the model saw is in `generations`: one entry per act turn that recorded its
tokens, `{"message", "prompt_ids", "completion_ids", "logprobs", "temperature", "finish_reason"}`, where
`message` is the index in `messages` of the assistant turn it wrote (None: a turn left out). Its prompt is
exactly `messages[:message]` through the template until the first stopped call or the first act prompt
with rehearsal memory (a last user-side message each turn, never part of the conversation); from there
the ids are the truth. Rehearsals and critiques are not in the rows: `envace train` reads them from the
trace store.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from envace_mcp.policy.chat_text import FORMAT_REMINDER
from envace_mcp.policy.prompts import GRAPH_NOTE, render_act
from envace_mcp.policy.tool_text import native
from envace_mcp.policy.types import ActOutput, ActRequest
from envace_mcp.toolbox import ToolResult, ToolSpec
from envace_mcp.traces._jsonl import write_runs
from envace_mcp.traces.schema import STOPPED, Step, Trace

_MARK = "\u2063"
"""Stands in for the instructions when finding where `render_act` puts them in its system prompt."""


def to_trl(trace: Trace) -> dict[str, Any]:
    """One run as a TRL row (see the module); a `ValueError` when a recorded step cannot be read as one."""
    conversation, written, stopped = _conversation(trace)
    instructions = trace.metadata.get("instructions")
    instructions = instructions if isinstance(instructions, str) and instructions.strip() else None
    try:
        specs = [ToolSpec.from_dict(t) for t in trace.tools or []]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"its tool catalog: {exc}") from None
    chat, tools = render_act(ActRequest(task=trace.task or "", messages=conversation, tools=specs,
                                        instructions=instructions))
    head = 1 if _system_shown(trace, chat[0]["content"], instructions) else 0
    messages = chat[1 - head:]
    offset = len(messages) - len(conversation)
    for entry, message in zip(messages[offset:], conversation):
        if isinstance(message, ToolMessage):
            entry["tool_call_id"] = message.tool_call_id
    generations = []
    for step in trace.steps_of("act"):
        if step.prompt_ids is None or step.completion_ids is None:
            continue
        at = written.get(step.index)
        generations.append({"message": None if at is None else at + offset, "prompt_ids": step.prompt_ids,
                            "completion_ids": step.completion_ids, "logprobs": step.logprobs,
                            "temperature": (step.sampling or {}).get("temperature"),
                            "finish_reason": step.finish_reason})
    return {"run_id": trace.run_id, "task_id": trace.task_id, "group_id": trace.group_id, "mode": trace.mode,
            "rewards": {r.name: r.value for r in trace.rewards}, "stopped_calls": stopped, "messages": messages,
            "tools": native(tools) or [], "generations": generations}


def write_trl(traces: Iterable[Trace], path: str | Path, *, skipped: list[str] | None = None) -> int:
    """Write runs as TRL rows, one a line (`to_trl`); returns how many. The file appears whole or not at
    all; a run that cannot be written is left out, and why is appended to `skipped`."""
    return write_runs(traces, path, to_trl, skipped=skipped)


def _conversation(trace: Trace) -> tuple[list[BaseMessage], dict[int, int], int]:
    """The run's conversation after the task as the graph kept it, less the stopped calls: the messages,
    where each act step's message is among them (by step index), and how many calls were stopped."""
    stopped = [s.call_id for s in trace.steps_of("tool") if s.decision in STOPPED]
    proposed: set[str | None] = set()
    messages: list[BaseMessage] = []
    written: dict[int, int] = {}
    for step in trace.steps:
        if step.role == "act":
            output = _output(step)
            proposed.update(c.id for c in output.tool_calls)
            calls = [c.as_langchain() for c in output.tool_calls if c.id not in stopped]
            text = output.reply_text(step.text or "")
            if calls or text or not output.tool_calls:
                written[step.index] = len(messages)
                messages.append(AIMessage(content=text, tool_calls=calls))
            if not output.tool_calls and output.malformed:  # the graph told the agent its call was unreadable
                problems = "; ".join(i.message for i in output.issues if i.code == "invalid_tool_call")
                messages.append(HumanMessage(content=FORMAT_REMINDER.format(problems=problems),
                                             additional_kwargs={GRAPH_NOTE: "format"}))
        elif step.role == "tool" and step.call_id not in stopped:
            call_id = step.call_id or f"call_{step.index}"
            if step.call_id not in proposed:  # no recorded turn proposed it (an imported log): its own turn
                arguments = step.arguments if isinstance(step.arguments, dict) else {"__raw__": step.arguments}
                messages.append(AIMessage(content="", tool_calls=[{"name": step.tool or "", "args": arguments,
                                                                   "id": call_id, "type": "tool_call"}]))
            messages.append(ToolMessage(content=ToolResult.text_of(step.result), tool_call_id=call_id,
                                        name=step.tool or ""))
    last = messages[-1] if messages else None
    if trace.final_answer is not None and not (isinstance(last, AIMessage) and not last.tool_calls
                                               and last.content == trace.final_answer):
        messages.append(AIMessage(content=trace.final_answer))
    return messages, written, len(stopped)


def _output(step: Step) -> ActOutput:
    try:
        return ActOutput.model_validate(step.parsed if isinstance(step.parsed, dict) else {"content": step.text or ""})
    except ValueError:
        raise ValueError(f"act step {step.index} is not a parsed turn") from None


def _system_shown(trace: Trace, system: str, instructions: str | None) -> bool:
    """Whether the run's act prompts hold `system` as the act role's whole system prompt: not when no act
    prompt was recorded (a model of your own, an imported log), nor when they held instructions the trace
    did not record (runs recorded before traces kept `metadata.instructions`): no system message, not a
    wrong one."""
    prompt = next((s.prompt_text for s in trace.steps_of("act") if s.prompt_text), None)
    if prompt is None or system not in prompt:
        return False
    with_instructions = render_act(ActRequest(task="", instructions=_MARK))[0][0]["content"].split(_MARK)[0]
    return instructions is not None or with_instructions not in prompt

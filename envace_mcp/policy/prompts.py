"""Each role's prompt as chat messages; how chats become text is `policy.chat_text`.

Act: a system prompt (role, domain instructions), the task as the user turn, the conversation, then
the rehearsal memory as a last user-side message (so the long system + tools prefix is shared). Rehearse: a *fresh* chat (EnvACE): the simulator system prompt and one user turn
with, in order, the allowed tools, few-shot real calls (`<unavailable>` when none), the conversation
serialised as `User:` / `Assistant:` / `Tool[name]:`, the act role's latest raw message, and the
tool to simulate with its input schema, output schema (MCP gives us one; EnvACE had none) and
arguments; or, inline, the act prompt continued into the tool's reply turn. Critique: the task, the
attempt, earlier reviews, and a fixed answer format.

The names of `policy.chat_text` are importable from here too, as they always were.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from envace_mcp.policy.chat_text import (
    GRAPH_NOTE,
    NOT_EXECUTED,
    TOOL_OUTPUT_CHARS,
    TOOLS_BLOCK_HEAD,
    TOOLS_BLOCK_TAIL,
    ChatMessage,
    ChatTokenizer,
    clip_output,
    compact_schema,
    content_text,
    json_text,
    observations_only,
    plain_chat,
    prompt_text,
    serialise_history,
    template_takes_tools,
    to_chat,
    tool_call_text,
    tool_for_template,
    tool_reply_text,
    tools_block,
)
from envace_mcp.policy.types import ActRequest, CritiqueRequest, Example, RehearseRequest
from envace_mcp.toolbox import ToolSpec

__all__ = [
    # the roles' prompts
    "ACT_SYSTEM",
    "SIMULATOR_SYSTEM",
    "CRITIC_SYSTEM",
    "CRITIQUE_FORMAT",
    "MEMORY_HEADER",
    "LOGGED_HEADER",
    "TOOL_TURN_SLOT",
    "render_act",
    "render_rehearse",
    "render_inline",
    "render_critique",
    "inline_context",
    "inline_prompt",
    "logged_calls",
    # from `policy.chat_text`
    "ChatMessage",
    "ChatTokenizer",
    "GRAPH_NOTE",
    "NOT_EXECUTED",
    "TOOL_OUTPUT_CHARS",
    "TOOLS_BLOCK_HEAD",
    "TOOLS_BLOCK_TAIL",
    "clip_output",
    "compact_schema",
    "content_text",
    "json_text",
    "observations_only",
    "plain_chat",
    "prompt_text",
    "serialise_history",
    "template_takes_tools",
    "to_chat",
    "tool_call_text",
    "tool_for_template",
    "tool_reply_text",
    "tools_block",
]

ACT_SYSTEM = """\
You are a careful assistant that completes the user's request by calling tools.
Call a tool by writing a <tool_call> block; you may call several tools in one turn. Wait for the
tool results before relying on them, never invent them. When you have what you need, reply to the
user in plain text without any tool call; that reply is your final answer. If a request breaks the
policy or cannot be done, say so and do not call the tool."""

SIMULATOR_SYSTEM = """\
You are a precise tool simulator, a silent function executor. Given a tool call, you output exactly \
what the tool would return and nothing else. Check the call in this order:
1. Format: if the call is not a well-formed tool call, answer \
{"error_tool_call": {"code": "INVALID_TOOL_CALL_FORMAT", "details": "<what is wrong>"}}
2. Availability: if the tool is not in the allowed list, answer \
{"error_tool_call": {"code": "TOOL_NOT_AVAILABLE", "details": "<tool name>"}}
3. Parameters: if the arguments do not satisfy the tool's input schema, answer \
{"error_tool_call": {"code": "INVALID_PARAMETERS", "details": "<which field and why>"}}
4. Otherwise produce the result. If an example calls the same tool with similar arguments, reuse its \
result; otherwise invent a result consistent with the examples, the conversation and the output \
schema. If the tool itself would fail (for example insufficient funds or an unknown id), answer \
{"error_tool_call": {"code": "EXECUTION_ERROR", "message": "<the tool's error message>"}}
Answer with one non-empty JSON object or array inside <execution_result></execution_result> and \
nothing else."""

CRITIC_SYSTEM = """\
You review an agent's attempt at a customer's request, run against simulated tools. Judge whether \
the attempt did exactly what the customer asked while following the policy, and what to do better."""

CRITIQUE_FORMAT = """\
Answer in exactly this format:
VERDICT: success or failure
PITFALLS: <mistakes made or nearly made>
ADVICE: <what the next attempt should do>"""

MEMORY_HEADER = ("# Rehearsal memory\nWhat rehearsing this task showed (predicted outcomes, mismatches with "
                 "reality, pitfalls); written by the agent's own rehearsals, not by the user. Use it, but trust "
                 "real tool results over it.\n")


def render_act(request: ActRequest) -> tuple[list[ChatMessage], list[dict[str, Any]]]:
    """Chat messages and `tools=` for the act role.

    The rehearsal memory is the *last* message, not part of the system prompt: the system prompt and
    tool list are then the same for every act turn of a domain, and each turn's prompt extends the
    previous turn's conversation, so both the inference prefix cache and shared-prefix training
    reuse them (the memory changes every turn)."""
    system = ACT_SYSTEM
    if request.instructions:
        system += f"\n\n# Policy\n{request.instructions.strip()}"
    chat = [{"role": "system", "content": system}, {"role": "user", "content": request.task}]
    chat += to_chat(request.messages)
    if request.memory:
        chat.append({"role": "user", "content": MEMORY_HEADER + request.memory.strip()})
    return chat, [tool_for_template(spec) for spec in request.tools]


def _schema(spec: ToolSpec) -> str:
    return json_text(compact_schema(spec.input_schema))


def _examples_text(examples: list[Example]) -> str:
    """Real calls and their results as the simulator prompt shows them."""
    return "\n\n".join(f"Call: {tool_call_text(e.tool, e.arguments)}\nResult: <execution_result>"
                       f"{clip_output(e.result)}</execution_result>" for e in examples)


def render_rehearse(request: RehearseRequest) -> list[ChatMessage]:
    allowed = "\n".join(f"- {s.name}: {s.description}\n  input schema: {_schema(s)}" for s in request.allowed) or "<none>"
    examples = _examples_text(request.examples) or "<unavailable>"
    call = request.call
    if request.tool is not None:
        target = [f"Name: {request.tool.name}", f"Input schema: {_schema(request.tool)}"]
        if request.tool.output_schema:
            target.append(f"Output schema: {json_text(compact_schema(request.tool.output_schema))}")
    else:
        target = [f"Name: {call.name}", "Input schema: <unknown: not in the allowed tools>"]
    target.append(f"Arguments: {json_text(call.arguments)}")
    logged = (f"## Logged calls of {call.name} in other tasks (how this server answered calls like this one)\n"
              f"{_examples_text(request.similar)}\n\n" if request.similar else "")
    user = (
        f"## Allowed tools\n{allowed}\n\n"
        f"## Real calls earlier in this task (examples)\n{examples}\n\n{logged}"
        f"## Conversation so far\n{serialise_history(observations_only(request.history))}\n\n"
        f"## Latest assistant message\n{request.act_message or tool_call_text(call.name, call.arguments)}\n\n"
        "## Tool call to simulate\n" + "\n".join(target)
    )
    return [{"role": "system", "content": SIMULATOR_SYSTEM}, {"role": "user", "content": user}]


TOOL_TURN_SLOT = "\u2063envace:tool-turn\u2063"
"""Stands in for the tool's reply when an inline rehearse prompt is rendered; the prompt is the
rendered text up to it, and what the template writes after it (up to the end of the turn) closes the
turn the model then writes (`inline_prompt`)."""


def inline_context(request: RehearseRequest) -> ActRequest:
    """The act request an inline rehearsal continues: the turn's own (`request.context`), or one
    derived from the history (drop-ins: the first human message is the task); in both, without the
    calls the gate refused (`observations_only`; such a prompt no longer shares the act prompt's prefix)."""
    if request.context is not None:
        return replace(request.context, messages=observations_only(request.context.messages))
    messages = observations_only(request.history)
    for i, message in enumerate(messages):
        if isinstance(message, HumanMessage):
            return ActRequest(task=content_text(message.content), messages=messages[i + 1:], tools=list(request.allowed))
    return ActRequest(task="", messages=messages, tools=list(request.allowed))


def render_inline(request: RehearseRequest) -> tuple[list[ChatMessage], list[dict[str, Any]]]:
    """Chat messages and `tools=` for an inline rehearsal: the act role's prompt of the turn (system,
    tools with their result fields, task, conversation, memory), the proposing assistant turn, and the
    tool's reply as `TOOL_TURN_SLOT`. Rendered and cut at the slot, it is the act prompt + the call the
    act role wrote — already in the prefix cache — and the model continues with the tool's response.

    A turn that proposed several calls is shown with only the call being rehearsed (each call's reply is
    rehearsed alone, concurrently)."""
    context = inline_context(request)
    chat, tools = render_act(context)
    call = request.call
    text = request.act_message.split("<tool_call>")[0].rstrip("\n") if request.act_message else ""
    turn = AIMessage(content=text, tool_calls=[{"name": call.name, "args": call.arguments if isinstance(call.arguments, dict)
                                                 else {"__raw__": call.arguments}, "id": call.id, "type": "tool_call"}])
    if request.similar:
        chat.append({"role": "user", "content": logged_calls(call.name, request.similar)})
    chat += to_chat([turn, ToolMessage(content=TOOL_TURN_SLOT, tool_call_id=call.id, name=call.name)])
    return chat, tools


LOGGED_HEADER = "# Logged calls of {tool}\nHow this server answered calls like the next one in other tasks (from its logs):\n"


def logged_calls(tool: str, similar: list[Example]) -> str:
    """Recalled calls (`RehearseRequest.similar`) as the user-side message an inline rehearsal sees just
    before the call it predicts: each call and its reply in the text protocol of the conversation."""
    return LOGGED_HEADER.format(tool=tool) + "\n".join(
        f"{tool_call_text(e.tool, e.arguments)}\n<tool_response>\n"
        f"{clip_output(e.result)}\n</tool_response>" for e in similar)


def inline_prompt(rendered: str, ends: tuple[str, ...] = ("<|im_end|>",)) -> tuple[str, str]:
    """An inline rehearse prompt rendered with `TOOL_TURN_SLOT`: (the prompt, the text that closes the
    tool's turn after its content, up to the first end-of-turn marker in `ends`, e.g.
    `"\\n</tool_response>"`)."""
    prompt, found, after = rendered.partition(TOOL_TURN_SLOT)
    if not found:
        raise ValueError("the chat template dropped the tool message (it renders no tool turns)")
    cut = min((i for i in (after.find(e) for e in ends if e) if i >= 0), default=len(after))
    return prompt, after[:cut]


def render_critique(request: CritiqueRequest) -> list[ChatMessage]:
    earlier = "\n\n".join(f"Review {i}:\n{c}" for i, c in enumerate(request.earlier, 1)) or "<none>"
    user = (
        f"## Task\n{request.task}\n\n## Attempt (tools were simulated)\n{serialise_history(request.transcript)}\n\n"
        f"## Earlier reviews\n{earlier}\n\n{CRITIQUE_FORMAT}"
    )
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}]

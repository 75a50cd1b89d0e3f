"""Rendering each role's prompt as chat messages.

Act: a system prompt (role, domain instructions), the task as the user turn, the conversation, then
the rehearsal memory as a last user-side message (so the long system + tools prefix is shared). Rehearse: a *fresh* chat (EnvACE): the simulator system prompt and one user turn
with, in order, the allowed tools, few-shot real calls (`<unavailable>` when none), the conversation
serialised as `User:` / `Assistant:` / `Tool[name]:`, the act role's latest raw message, and the
tool to simulate with its input schema, output schema (MCP gives us one; EnvACE had none) and
arguments. Critique: the task, the attempt, earlier reviews, and a fixed answer format.

Tool calls are written in the Hermes / Qwen format. For chat templates that take `tools=` (Qwen3 and
most current models) the template renders tools and calls itself; for templates without tool
support (SmolLM2) `plain_chat` writes the same text protocol into the messages: a `# Tools` block in
the system prompt, `<tool_call>` blocks in assistant turns, `<tool_response>` blocks in user turns.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from envace_mcp.policy.tool_text import OUTPUT_KEY, ToolFormat, compact_block, native
from envace_mcp.policy.types import ActRequest, CritiqueRequest, Example, RehearseRequest
from envace_mcp.toolbox import ToolSpec

ChatMessage = dict[str, Any]

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

TOOLS_BLOCK_HEAD = """\
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>"""

TOOLS_BLOCK_TAIL = """
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>"""


def content_text(content: Any) -> str:
    """A message's content as text: a string as it is, content blocks' text joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content)
    return str(content)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def compact_schema(schema: Any) -> Any:
    """A JSON Schema without the `title` annotations pydantic adds everywhere: they repeat the
    property names, cost prompt tokens (about a fifth of a tool list) and tell the model nothing."""
    if isinstance(schema, list):
        return [compact_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {name: compact_schema(sub) for name, sub in value.items()}
        else:
            out[key] = compact_schema(value)
    return out


def tool_for_template(spec: ToolSpec) -> dict[str, Any]:
    """The `tools=` entry of one catalog tool, schema compacted (its output schema rides along for the
    compact tool text, `tool_text.OUTPUT_KEY`; `prompt_text` takes it out before a template sees it)."""
    fn: dict[str, Any] = {"name": spec.name, "description": spec.description,
                          "parameters": compact_schema(spec.input_schema)}
    if spec.output_schema:
        fn[OUTPUT_KEY] = compact_schema(spec.output_schema)
    return {"type": "function", "function": fn}


def to_chat(messages: list[BaseMessage]) -> list[ChatMessage]:
    """LangChain messages as chat-template messages (OpenAI shape, tool calls structured)."""
    chat: list[ChatMessage] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            chat.append({"role": "system", "content": content_text(message.content)})
        elif isinstance(message, HumanMessage):
            chat.append({"role": "user", "content": content_text(message.content)})
        elif isinstance(message, AIMessage):
            entry: ChatMessage = {"role": "assistant", "content": content_text(message.content)}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {"type": "function", "id": c.get("id"), "function": {"name": c["name"], "arguments": c["args"]}}
                    for c in message.tool_calls
                ]
            chat.append(entry)
        elif isinstance(message, ToolMessage):
            chat.append({"role": "tool", "content": clip_output(content_text(message.content)), "name": message.name or ""})
        else:
            chat.append({"role": "user", "content": content_text(message.content)})
    return chat


TOOL_OUTPUT_CHARS = 16_000
"""How much of one tool output a prompt shows (~4k tokens). Tools can return megabytes (a file, a
table dump); shown whole they would overflow any context. The head and the tail are kept and the cut
is stated, so the model knows it saw part; the trace keeps the result up to
`traces.schema.RESULT_CHARS`."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def clip_output(text: str, limit: int = TOOL_OUTPUT_CHARS) -> str:
    """A tool output as a prompt shows it: at most `limit` characters, and bytes that were not UTF-8
    (lone surrogates, which tokenizers refuse) as U+FFFD."""
    text = _SURROGATE.sub("\ufffd", text)
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 3 // 4], text[-(limit // 4):]
    return f"{head}\n[... {len(text) - len(head) - len(tail):,} characters cut: the output has {len(text):,} ...]\n{tail}"


def tools_block(tools: list[dict[str, Any]], tool_format: ToolFormat = "json") -> str:
    """The `# Tools` block: every schema as JSON (Hermes / Qwen), or one compact line per tool."""
    if tool_format == "compact":
        return compact_block(tools)
    return TOOLS_BLOCK_HEAD + "".join("\n" + _dumps(t) for t in native(tools) or []) + TOOLS_BLOCK_TAIL


def tool_call_text(name: str, arguments: Any) -> str:
    return f'<tool_call>\n{{"name": {_dumps(name)}, "arguments": {_dumps(arguments)}}}\n</tool_call>'


def plain_chat(chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
               tool_format: ToolFormat = "json") -> list[ChatMessage]:
    """The same conversation for a template that knows only system/user/assistant text turns."""
    out: list[ChatMessage] = []
    messages = list(chat)
    system = messages.pop(0)["content"] if messages and messages[0]["role"] == "system" else ""
    if tools:
        block = tools_block(tools, tool_format)
        system = f"{system}\n\n{block}" if system else block
    if system:
        out.append({"role": "system", "content": system})
    for message in messages:
        if message["role"] == "assistant":
            parts = [message.get("content") or ""]
            for call in message.get("tool_calls") or []:
                fn = call.get("function", call)
                parts.append(tool_call_text(fn["name"], fn.get("arguments", {})))
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        elif message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1]["content"].startswith("<tool_response>"):
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block})
        else:
            out.append({"role": message["role"], "content": message.get("content") or ""})
    return out


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders `tools=` itself (Qwen3); if not, `plain_chat` does."""
    template = getattr(tokenizer, "chat_template", None)
    return bool(template) and "tools" in template


def prompt_text(tokenizer: Any, chat: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
                enable_thinking: bool = False, tool_format: ToolFormat = "json") -> str:
    """The exact prompt text a model with this tokenizer sees for a rendered chat (the one place
    prompts become text): the model's own chat template, with `tools=` where it takes them and the
    `plain_chat` text protocol (tools as `tool_format`) otherwise; a tokenizer with no template at all
    gets plain ChatML."""
    if not getattr(tokenizer, "chat_template", None):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                       for m in plain_chat(chat, tools, tool_format))
        return text + "<|im_start|>assistant\n"
    kwargs = {"enable_thinking": enable_thinking}
    if template_takes_tools(tokenizer):
        return tokenizer.apply_chat_template(chat, tools=native(tools), add_generation_prompt=True, tokenize=False,
                                             **kwargs)
    return tokenizer.apply_chat_template(plain_chat(chat, tools, tool_format), add_generation_prompt=True,
                                         tokenize=False, **kwargs)


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


NOT_EXECUTED = "envace_not_executed"
"""`ToolMessage.additional_kwargs` key on a reply the gate (or a human) gave instead of the tool:
its value is the gate's action (`reject`, `block`, `feedback`, `budget`, `rejected`)."""

GRAPH_NOTE = "envace_note"
"""`HumanMessage.additional_kwargs` key on a message the graph wrote to the agent, not the user (its value
says which: `format`, a reminder after a call that could not be read). The gate's evidence rules do not
count it as the user's words or a new request."""


def observations_only(messages: list[BaseMessage]) -> list[BaseMessage]:
    """The conversation as the environment saw it, for the rehearse role: calls that never ran (the
    gate's refusals, marked `NOT_EXECUTED`) and their replies are left out. A refusal is not the
    tool's reply; shown as one, a world model copies it when the agent retries the call, and the gate
    blocks again on its own earlier words."""
    refused = {m.tool_call_id for m in messages if isinstance(m, ToolMessage) and m.additional_kwargs.get(NOT_EXECUTED)}
    if not refused:
        return list(messages)
    kept: list[BaseMessage] = []
    for message in messages:
        if isinstance(message, ToolMessage) and message.tool_call_id in refused:
            continue
        if isinstance(message, AIMessage) and any(c.get("id") in refused for c in message.tool_calls):
            calls = [c for c in message.tool_calls if c.get("id") not in refused]
            if not calls and not content_text(message.content).strip():
                continue
            message = message.model_copy(update={"tool_calls": calls})
        kept.append(message)
    return kept


def serialise_history(messages: list[BaseMessage]) -> str:
    """`User: …` / `Assistant: …` / `Tool[name]: …` lines, as EnvACE's simulator prompt has them."""
    lines = []
    for message in messages:
        if isinstance(message, SystemMessage):
            continue
        if isinstance(message, HumanMessage):
            lines.append(f"User: {content_text(message.content)}")
        elif isinstance(message, AIMessage):
            parts = [content_text(message.content)] + [tool_call_text(c["name"], c["args"]) for c in message.tool_calls]
            lines.append("Assistant: " + "\n".join(p for p in parts if p))
        elif isinstance(message, ToolMessage):
            lines.append(f"Tool[{message.name or 'tool'}]: {clip_output(content_text(message.content))}")
    return "\n".join(lines) if lines else "<empty>"


def _schema(spec: ToolSpec) -> str:
    return _dumps(compact_schema(spec.input_schema))


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
            target.append(f"Output schema: {_dumps(compact_schema(request.tool.output_schema))}")
    else:
        target = [f"Name: {call.name}", "Input schema: <unknown: not in the allowed tools>"]
    target.append(f"Arguments: {_dumps(call.arguments)}")
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


def tool_reply_text(tool: str, value: Any) -> str:
    """A result as an MCP server sends it in a tool message: JSON indented by 2 for structured results
    (FastMCP's serialisation), an error as `Error executing tool <name>: <message>`. For reference
    rehearsals in the inline format, which must read like the real replies they stand for."""
    if isinstance(value, dict) and "error_tool_call" in value:
        error = value["error_tool_call"] if isinstance(value["error_tool_call"], dict) else {}
        return f"Error executing tool {tool}: {error.get('message') or error.get('details') or 'error'}"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2)


def render_critique(request: CritiqueRequest) -> list[ChatMessage]:
    earlier = "\n\n".join(f"Review {i}:\n{c}" for i, c in enumerate(request.earlier, 1)) or "<none>"
    user = (
        f"## Task\n{request.task}\n\n## Attempt (tools were simulated)\n{serialise_history(request.transcript)}\n\n"
        f"## Earlier reviews\n{earlier}\n\n{CRITIQUE_FORMAT}"
    )
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}]

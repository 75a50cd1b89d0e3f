"""Conversations as chat messages and as the text a model reads: the role-agnostic layer under the
role prompts (`policy.prompts`).

LangChain messages become chat-template messages (`to_chat`), the rehearse role's view leaves out the
calls the gate refused (`observations_only`), and a rendered chat becomes prompt text in one place
(`prompt_text`). Tool calls are written in the Hermes / Qwen format. For chat templates that take
`tools=` (Qwen3 and most current models) the template renders tools and calls itself; for templates
without tool support (SmolLM2) `plain_chat` writes the same text protocol into the messages: a `# Tools`
block in the system prompt, `<tool_call>` blocks in assistant turns, `<tool_response>` blocks in user turns.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from envace_mcp.policy.tool_text import OUTPUT_KEY, ToolFormat, compact_block, native
from envace_mcp.toolbox import ToolSpec

ChatMessage = dict[str, Any]


class ChatTokenizer(Protocol):
    """What prompt rendering needs of a tokenizer (a Hugging Face one has both): its chat template, if
    any, and the call that renders a chat with it."""

    chat_template: str | None

    def apply_chat_template(self, conversation: list[ChatMessage], **kwargs: Any) -> Any: ...

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



def content_text(content: object) -> str:
    """A message's content as text: a string as it is, content blocks' text joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content)
    return str(content)


def json_text(value: object) -> str:
    """A JSON value as prompts show it: one line, non-ASCII text as it is."""
    return json.dumps(value, ensure_ascii=False)


def compact_schema(schema: object) -> object:
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
    return TOOLS_BLOCK_HEAD + "".join("\n" + json_text(t) for t in native(tools) or []) + TOOLS_BLOCK_TAIL


def tool_call_text(name: str, arguments: object) -> str:
    return f'<tool_call>\n{{"name": {json_text(name)}, "arguments": {json_text(arguments)}}}\n</tool_call>'


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


def template_takes_tools(tokenizer: ChatTokenizer) -> bool:
    """Whether the tokenizer's chat template renders `tools=` itself (Qwen3); if not, `plain_chat` does."""
    template = getattr(tokenizer, "chat_template", None)
    return bool(template) and "tools" in template


def prompt_text(tokenizer: ChatTokenizer, chat: list[ChatMessage], tools: list[dict[str, Any]] | None, *,
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


NOT_EXECUTED = "envace_not_executed"
"""`ToolMessage.additional_kwargs` key on a reply the gate (or a human) gave instead of the tool:
its value is the gate's action (`reject`, `block`, `feedback`, `budget`, `rejected`)."""

GRAPH_NOTE = "envace_note"
"""`HumanMessage.additional_kwargs` key on a message the graph wrote to the agent, not the user (its value
says which: `format`, a reminder after a call that could not be read). The gate's evidence rules do not
count it as the user's words or a new request."""

FORMAT_REMINDER = (
    "Your last message tried to call a tool but the call could not be read ({problems}). Write each call "
    'as <tool_call>{{"name": "<tool>", "arguments": {{...}}}}</tool_call>, or answer in plain text.'
)
"""What the agent node tells the act role after a turn whose tool call could not be read (and what
exported training conversations show in its place)."""


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


def tool_reply_text(tool: str, value: object) -> str:
    """A result as an MCP server sends it in a tool message: JSON indented by 2 for structured results
    (FastMCP's serialisation), an error as `Error executing tool <name>: <message>`. For reference
    rehearsals in the inline format, which must read like the real replies they stand for."""
    if isinstance(value, dict) and "error_tool_call" in value:
        error = value["error_tool_call"] if isinstance(value["error_tool_call"], dict) else {}
        return f"Error executing tool {tool}: {error.get('message') or error.get('details') or 'error'}"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2)

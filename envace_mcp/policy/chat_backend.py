"""Any LangChain chat model as the policy (e.g. Qwen3 behind vLLM or Ollama's OpenAI API).

For inference and trace collection: no token ids or logprobs, so no logprob-based training.
The act role uses the model's native tool calling (`bind_tools`) when it has it, and the same text
protocol as the transformers backend (a `# Tools` block, `<tool_call>` blocks) when it does not.
Sampling settings belong to the chat model's own configuration; the ones passed here are recorded.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from envace_mcp.policy.base import PromptPolicy
from envace_mcp.policy.parsing import parse_act
from envace_mcp.policy.prompts import ChatMessage, plain_chat, render_act
from envace_mcp.policy.tool_text import native
from envace_mcp.policy.types import (
    ActOutput,
    ActRequest,
    Generation,
    ParseIssue,
    RawCompletion,
    Role,
    SamplingParams,
    ToolCall,
)


def _to_langchain(chat: list[ChatMessage]) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for m in chat:
        cls = {"system": SystemMessage, "assistant": AIMessage}.get(m["role"], HumanMessage)
        out.append(cls(content=m.get("content") or ""))
    return out


class ChatModelPolicy(PromptPolicy):
    """Act, rehearse and critique with a LangChain `BaseChatModel`."""

    def __init__(self, model: BaseChatModel, *, native_tools: bool = True, name: str | None = None,
                 sampling: SamplingParams | None = None) -> None:
        super().__init__(sampling=sampling)
        self.model = model
        self.native_tools = native_tools
        self.name = name or getattr(model, "model_name", None) or getattr(model, "model", None) or type(model).__name__

    async def _complete(self, role: Role, chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        sampling: SamplingParams) -> RawCompletion:
        reply = await self.model.ainvoke(_to_langchain(plain_chat(chat, tools)))
        return RawCompletion(text=_content(reply), finish_reason="stop")

    async def act(self, request: ActRequest, sampling: SamplingParams | None = None) -> Generation[ActOutput]:
        s = self._sampling("act", sampling)
        chat, tools = render_act(request)
        bound = None
        if self.native_tools and tools:
            try:
                bound = self.model.bind_tools(native(tools))
            except NotImplementedError:
                bound = None
        if bound is None:
            raw = await self._complete("act", chat, tools, s)
            return self._generation("act", raw, parse_act(raw.text), s)
        messages: list[BaseMessage] = [SystemMessage(content=chat[0]["content"]), HumanMessage(content=request.task)]
        messages += request.messages
        reply = await bound.ainvoke(messages)
        text = _content(reply)
        calls = [ToolCall(id=c.get("id") or f"call_{i}", name=c["name"], arguments=c.get("args") or {})
                 for i, c in enumerate(getattr(reply, "tool_calls", []) or [])]
        issues = [ParseIssue(code="invalid_tool_call", message=str(bad.get("error") or "invalid tool call"),
                             snippet=str(bad.get("args", ""))[:200])
                  for bad in getattr(reply, "invalid_tool_calls", []) or []]
        if calls or issues:
            parsed = ActOutput(tool_calls=calls, content=text.strip(), issues=issues)
        else:  # a model that writes calls as text despite native tools
            parsed = parse_act(text)
        return self._generation("act", RawCompletion(text=text, finish_reason="stop"), parsed, s)


def _content(message: Any) -> str:
    content = getattr(message, "content", message)
    if isinstance(content, list):
        return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content)
    return str(content or "")

"""The policy's act role as a LangChain chat model: put the trainable policy behind any agent.

    model = policy.as_chat_model()
    agent = create_agent(model, tools=tools, middleware=[RehearsalMiddleware(policy, tools=tools)])

`bind_tools`, tool calls in `AIMessage.tool_calls`, sync and async. The prompt is rendered by the same
renderer the EnvACE graph uses (`prompts.render_act`, then the backend's chat template), so what a
recorder stores is what the model saw: each reply's generation — exact prompt and completion token
ids, per-token sampling logprobs, sampling settings — goes to LangGraph's `custom` stream when the
model runs inside a graph (`envace_mcp.traces.record_run` reads it there, as it does for the EnvACE
graph's own act node). Messages stay small: `response_metadata` has the model name, the finish reason
and token counts, not the token ids (they would be stored again in every checkpoint).

The conversation maps onto the act request: system messages are the domain instructions, the first
human message is the task, everything after it is the conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field

from envace_mcp._sync import run_sync
from envace_mcp.policy.types import ActOutput, ActRequest, Generation, SamplingParams
from envace_mcp.toolbox.langchain import spec_from_tool


class PolicyChatModel(BaseChatModel):
    """A `BaseChatModel` over a policy's act role (see the module docstring)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    policy: Any
    """A `Policy` (normally a `TransformersPolicy`, whose generations carry token ids and logprobs)."""
    tools: list[Any] = Field(default_factory=list)
    """The bound tools' `ToolSpec`s (`bind_tools`)."""
    sampling: SamplingParams | None = None
    """The act role's sampling; `None`: the policy's own default for the role."""

    @property
    def _llm_type(self) -> str:
        return "envace-policy"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"policy": getattr(self.policy, "name", None)}

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> PolicyChatModel:
        """The same model with `tools` (LangChain tools, MCP tools from the toolbox, or OpenAI-format dicts)."""
        return self.model_copy(update={"tools": [spec_from_tool(t) for t in tools]})

    def request(self, messages: Sequence[BaseMessage]) -> ActRequest:
        """The act request a conversation becomes."""
        instructions = "\n\n".join(str(m.content) for m in messages if isinstance(m, SystemMessage)) or None
        rest = [m for m in messages if not isinstance(m, SystemMessage)]
        first = next((i for i, m in enumerate(rest) if isinstance(m, HumanMessage)), None)
        task = str(rest[first].content) if first is not None else ""
        conversation = rest[first + 1:] if first is not None else rest
        return ActRequest(task=task, messages=list(conversation), tools=list(self.tools), instructions=instructions)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        sampling = self.sampling
        if stop:  # the caller's stop strings on top of the act role's own settings
            base = (sampling or getattr(self.policy, "role_sampling", {}).get("act")
                    or getattr(self.policy, "sampling", None) or SamplingParams())
            sampling = base.model_copy(update={"stop": (*base.stop, *stop)})
        generation = await self.policy.act(self.request(messages), sampling)
        _emit(generation)
        return ChatResult(generations=[ChatGeneration(message=self._message(generation))])

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        return run_sync(self._agenerate(messages, stop, **kwargs))

    def _message(self, generation: Generation[ActOutput]) -> AIMessage:
        parsed = generation.parsed
        calls = [c.as_langchain() for c in parsed.tool_calls]
        invalid = [{"type": "invalid_tool_call", "name": None, "args": i.snippet, "id": None, "error": i.message}
                   for i in parsed.issues if i.code == "invalid_tool_call"]
        content = parsed.reply_text(generation.text)
        prompt, completion = len(generation.prompt_ids or []), len(generation.completion_ids or [])
        metadata = {"model_name": generation.model, "finish_reason": generation.finish_reason,
                    "envace": {"role": "act", "prompt_tokens": prompt, "completion_tokens": completion}}
        usage = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}
        return AIMessage(content=content, tool_calls=calls, invalid_tool_calls=invalid, response_metadata=metadata,
                         usage_metadata=usage if generation.completion_ids is not None else None)


def _emit(generation: Generation[Any]) -> None:
    """The generation to the running graph's `custom` stream (trace recorders read it there), if any."""
    try:
        from langgraph.config import get_stream_writer

        writer = get_stream_writer()
    except (RuntimeError, ImportError):
        return
    writer({"envace": "generation", "node": "model", "generation": generation})

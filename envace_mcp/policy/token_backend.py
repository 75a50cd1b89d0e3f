"""Backends that take token ids: prompts are rendered and encoded here, by the one renderer.

The transformers backend (our engine) and the vLLM backend (a server) differ only in who samples:
both render each role's chat with `prompts.prompt_text`, encode it with the model's tokenizer, and
send token ids — so what a trace records is exactly what the sampler saw and produced, and the
trainer never re-tokenises text. Subclasses implement `_generate` and say which ids end a turn.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from envace_mcp.policy.base import PromptPolicy
from envace_mcp.policy.prompts import (
    ChatMessage,
    inline_prompt,
    prompt_text,
    render_inline,
    render_rehearse,
    template_takes_tools,
)
from envace_mcp.policy.tool_text import ToolFormat
from envace_mcp.policy.types import RawCompletion, RehearseFormat, RehearseRequest, Role, SamplingParams

if TYPE_CHECKING:
    from envace_mcp.toolbox.catalog import ToolSpec


class TokenPolicy(PromptPolicy):
    """A `PromptPolicy` whose backend completes token-id prompts (see the module)."""

    def __init__(self, tokenizer: Any, *, sampling: SamplingParams | None = None,
                 role_sampling: dict[Role, SamplingParams] | None = None, enable_thinking: bool = False,
                 tool_format: ToolFormat = "json", rehearse_format: RehearseFormat = "simulator",
                 context_window: int | None = None) -> None:
        super().__init__(sampling=sampling, role_sampling=role_sampling)
        self.context_window = context_window
        """Tokens the model attends over, prompt and completion together (`None`: unknown, unchecked). A
        prompt that leaves less than `max_new_tokens` of it is not sent (`fits`)."""
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.tool_format: ToolFormat = tool_format
        self.rehearse_format: RehearseFormat = rehearse_format
        self.template_has_tools = template_takes_tools(tokenizer)

    @property
    @abstractmethod
    def eos_ids(self) -> set[int]:
        """Token ids that end a turn."""

    @abstractmethod
    async def _generate(self, prompt_ids: list[int], prompt_text: str, sampling: SamplingParams,
                        restrict: Any = None) -> RawCompletion:
        """Sample a completion of `prompt_ids` (whose text is `prompt_text`): its ids, their sampling
        logprobs, and its text with a final end-of-turn token left out (`decode`). `restrict`: a logits
        hook (`reply.ReplyConstraint`), from `reply_constraint`; a backend that takes none ignores it."""

    def reply_constraint(self, tool: ToolSpec | None, sampling: SamplingParams) -> Any:
        """The hook that holds an inline rehearsal of `tool`, sampled as `sampling` says, to a readable
        reply (None: not held)."""
        return None

    def render(self, chat: list[ChatMessage], tools: list[dict[str, Any]] | None) -> str:
        """The exact prompt text the model sees."""
        return prompt_text(self.tokenizer, chat, tools, enable_thinking=self.enable_thinking, tool_format=self.tool_format)

    @property
    def end_texts(self) -> tuple[str, ...]:
        """The end-of-turn tokens as text (where an inline rehearsal's tool turn ends)."""
        return tuple(t for t in self.tokenizer.convert_ids_to_tokens(sorted(self.eos_ids)) if t)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, tokens: list[int]) -> str:
        """The text of sampled tokens (a final end-of-turn token left out)."""
        body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
        return self.tokenizer.decode(body, skip_special_tokens=False)

    def fits(self, prompt_ids: list[int], prompt_text: str, sampling: SamplingParams) -> RawCompletion | None:
        """`None` when the prompt and its token budget fit the context; else the empty completion that
        stands for a generation never run. Past the context a model reads positions it never learned
        (garbage) or its server refuses the request (a crash mid-run); a tool listing or a history can
        grow that large, so the turn fails as data instead: an act turn with no call, an unusable rehearsal."""
        limit = self.context_window
        if limit is None or len(prompt_ids) + sampling.max_new_tokens <= limit:
            return None
        why = (f"the prompt is {len(prompt_ids):,} tokens and {sampling.max_new_tokens:,} more may be generated, "
               f"past the model's context of {limit:,} tokens; nothing was generated")
        return RawCompletion(text="", prompt_text=prompt_text, prompt_ids=list(prompt_ids), completion_ids=[],
                             logprobs=[], finish_reason="length", refused=why)

    def rehearse_prompt(self, request: RehearseRequest) -> tuple[list[int], str]:
        """The rehearse role's prompt ids for `request` (a `RehearseRequest`), exactly as `rehearse` renders
        them, and the text that closes the tool's turn after its content (inline format; "" otherwise):
        what a world model is trained on with the real reply as the target."""
        request = self.recalled(request)
        if self.rehearse_format == "inline":
            prompt, close = inline_prompt(self.render(*render_inline(request)), self.end_texts)
            return self.encode(prompt), close
        return self.encode(self.render(render_rehearse(request), None)), ""

    async def _sample(self, prompt_ids: list[int], prompt_text: str, sampling: SamplingParams,
                      restrict: Any = None) -> RawCompletion:
        refused = self.fits(prompt_ids, prompt_text, sampling)
        if refused is not None:
            return refused
        if restrict is None:
            return await self._generate(prompt_ids, prompt_text, sampling)
        raw = await self._generate(prompt_ids, prompt_text, sampling, restrict=restrict.restrict)
        return raw.model_copy(update={"p_error": restrict.p_error, "logprobs": restrict.unmasked(raw.logprobs)})

    async def _complete(self, role: Role, chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        sampling: SamplingParams) -> RawCompletion:
        text = self.render(chat, tools)
        return await self._sample(self.encode(text), text, sampling)

    async def _continue(self, role: Role, chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        sampling: SamplingParams, reply_to: ToolSpec | None = None) -> tuple[RawCompletion, str]:
        prompt, close = inline_prompt(self.render(chat, tools), self.end_texts)
        marker = close.strip()
        if marker and marker not in sampling.stop:  # the turn's close, where end-of-turn may not follow
            sampling = sampling.model_copy(update={"stop": (*sampling.stop, marker)})
        restrict = self.reply_constraint(reply_to, sampling) if role == "rehearse" else None
        return await self._sample(self.encode(prompt), prompt, sampling, restrict), close

"""The trainable backend: any Hugging Face causal LM behind the three roles, on our own engine.

This module renders each role's chat into the model's prompt text (`prompts.prompt_text`, the one
renderer), encodes it and hands token ids to `envace_mcp.engine.Engine`, which batches, decodes and
records the exact completion ids and per-token sampling logprobs. Templates that take `tools=` (Qwen3:
`<tool_call>` format and the `enable_thinking` switch) render the tools themselves; others get the same
text protocol written into the messages (`prompts.plain_chat`).

Within one conversation each act prompt extends the previous one's, which the engine's prefix cache
reuses. The rehearse role is either EnvACE's fresh simulator chat (no act prefix to reuse), or, with
`rehearse_format="inline"`, the act prompt + the proposed call continued with the tool's reply: its
prompt is the act turn's prompt and completion, already in the cache.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from envace_mcp.engine.generation import Engine
from envace_mcp.engine.model import load_model
from envace_mcp.engine.types import Completion, Job
from envace_mcp.policy.constrained import CallConstraint, TokenText
from envace_mcp.policy.embedded import EMBEDDED_NAME, embedded_model_dir
from envace_mcp.policy.prompts import ChatMessage
from envace_mcp.policy.reply import ReplyConstraint
from envace_mcp.policy.token_backend import TokenPolicy
from envace_mcp.policy.adapter import Adapter
from envace_mcp.policy.tool_text import ToolFormat
from envace_mcp.policy.types import RawCompletion, RehearseFormat, Role, SamplingParams

if TYPE_CHECKING:
    from envace_mcp.toolbox.catalog import ToolSpec


class TransformersPolicy(TokenPolicy):
    """Act, rehearse and critique with one transformers model (optionally under a LoRA adapter).

    Args:
        model, tokenizer: a loaded causal LM and its tokenizer (see `from_pretrained`).
        enable_thinking: passed to chat templates that have the switch (Qwen3).
        tool_format: how tools are written for templates without native tool support (`tool_text`):
            "json" (every schema in full) or "compact" (a third of the tokens; the shipped adapter's).
        rehearse_format: "simulator" (EnvACE's fresh-chat prompt) or "inline" (continue the act
            context with the tool's reply; see `RehearseFormat`).
        seed: seeds the per-request RNG used when a request has no seed of its own.
        max_batch_size, batch_window_s, prefix_cache_tokens, kv_budget_gb: the engine's (see `Engine`).
        constrain_calls: decode the act role's tool calls under the tools' schemas (`constrained`): known
            tool names, declared argument keys, required ones present, values of the right kind. For
            inference; its logprobs are the constrained distribution's, so not for GRPO rollouts.
        constrain_rehearsals: decode inline rehearsals status first and held to a readable reply, with the
            model's own P(error) (`reply.ReplyConstraint`). On by default; off for GRPO rollouts (the
            trainer's recomputed logprobs are the unconstrained distribution's).
        context_window: tokens of prompt + completion the model takes (default: its config's
            `max_position_embeddings`); a request past it is not generated (`TokenPolicy.fits`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str | None = None,
        sampling: SamplingParams | None = None,
        role_sampling: dict[Role, SamplingParams] | None = None,
        max_batch_size: int = 16,
        batch_window_s: float = 0.01,
        enable_thinking: bool = False,
        tool_format: ToolFormat = "json",
        rehearse_format: RehearseFormat = "simulator",
        seed: int = 0,
        prefix_cache_tokens: int = 32768,
        kv_budget_gb: float | Literal["auto"] | None = "auto",
        constrain_calls: bool = False,
        constrain_rehearsals: bool = True,
        context_window: int | None = None,
        batch_invariant: bool = False,
    ) -> None:
        super().__init__(tokenizer, sampling=sampling, role_sampling=role_sampling, enable_thinking=enable_thinking,
                         tool_format=tool_format, rehearse_format=rehearse_format,
                         context_window=context_window or model_context(model))
        self.engine = Engine(model, tokenizer, max_batch_size=max_batch_size, batch_window_s=batch_window_s,
                             prefix_cache_tokens=prefix_cache_tokens, kv_budget_gb=kv_budget_gb)
        self.engine.batch_invariant = batch_invariant  # greedy runs repeat exactly whatever shares the batch
        self.model = model
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self._rng = random.Random(seed)
        self.constrain_calls = constrain_calls
        self.constrain_rehearsals = constrain_rehearsals
        self._token_text: TokenText | None = None
        self.model_source: str | None = None
        """What `from_pretrained` loaded ("embedded", a Hugging Face id or folder): where a second adapter
        (a world model, `roles.with_world_model`) is loaded again."""

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path | None = None,
        *,
        adapter: str | Path | None = None,
        dtype: str | torch.dtype = "auto",
        device: str = "cpu",
        **kwargs: Any,
    ) -> TransformersPolicy:
        """Load a model by Hugging Face id or local folder; `None` loads the embedded default.

        `dtype` "auto" picks what the device is fast at: bfloat16 where it is native (CPUs with AMX or
        AVX512-BF16: ~2x faster generation; GPUs), float32 elsewhere (emulated bf16 is ~1.9x slower), and
        logs the choice; `ENVACE_DTYPE` pins it. float32 makes recorded logprobs match a float32
        trainer's recomputation most closely.
        """
        source = "embedded" if model is None else str(model)
        if model is None:
            kwargs.setdefault("name", f"{EMBEDDED_NAME} (embedded)")
            model = embedded_model_dir()
        folder = Adapter.read(adapter)  # before the weights: a torn envace.json costs no load
        lm, tokenizer = load_model(model, adapter=adapter, dtype=dtype, device=device)
        lm.eval()
        for key, value in (folder.formats if folder else {}).items():  # prompts as the adapter learned them, unless told otherwise
            kwargs.setdefault(key, value)
        policy = cls(lm, tokenizer, name=kwargs.pop("name", str(model)), **kwargs)
        policy.use_adapter(folder)
        policy.model_source = source
        return policy

    # ------------------------------------------------------------------ generation

    @property
    def eos_ids(self) -> set[int]:
        return self.engine.eos_ids

    def job(self, prompt_ids: list[int], sampling: SamplingParams, restrict: Any = None) -> Job:
        """An engine job for `prompt_ids`, seeded by the request or by this policy's own seeded RNG
        (`restrict`: the engine's logits hook, see `Job`)."""
        return Job(prompt_ids, sampling, sampling.seed if sampling.seed is not None else self._rng.randrange(2**63),
                   restrict=restrict)

    async def _generate(self, prompt_ids: list[int], prompt_text: str, sampling: SamplingParams,
                        restrict: Any = None) -> RawCompletion:
        return _raw(await self.engine.submit(self.job(prompt_ids, sampling, restrict=restrict)), prompt_text)

    def reply_constraint(self, tool: ToolSpec | None, sampling: SamplingParams) -> ReplyConstraint | None:
        if not self.constrain_rehearsals:
            return None
        schema = getattr(tool, "output_schema", None)
        kind = self.copy_rules.reply_kind(tool) if self.copy_rules is not None else None  # where it declares none
        return ReplyConstraint(schema, self._tokens(), self.eos_ids, kind=kind,
                               special_ids=set(self.tokenizer.all_special_ids), stops=tuple(sampling.stop),
                               temperature=sampling.temperature)

    def _tokens(self) -> TokenText:
        if self._token_text is None:
            self._token_text = TokenText(self.tokenizer)
        return self._token_text

    async def _complete(self, role: Role, chat: list[ChatMessage], tools: list[dict[str, Any]] | None,
                        sampling: SamplingParams) -> RawCompletion:
        if role != "act" or not self.constrain_calls or not tools:
            return await super()._complete(role, chat, tools, sampling)
        text = self.render(chat, tools)
        ids = self.encode(text)
        refused = self.fits(ids, text, sampling)
        if refused is not None:
            return refused
        job = self.job(ids, sampling, restrict=CallConstraint(tools, self._tokens()).restrict)
        return _raw(await self.engine.submit(job), text)

    # ------------------------------------------------------------------ teacher forcing and scoring

    def force(self, prompt_text: str, completion: str, temperature: float = 1.0, *, score: bool = True) -> RawCompletion:
        """The completion the model *would* record had it sampled `completion`: exact token ids
        (completion + end of turn) and the model's own logprobs of them (`score=False`: no forward
        pass, logprobs None — enough for SFT data). Used to turn reference solutions into training traces."""
        prompt_ids = self.encode(prompt_text)
        eos = self.engine.eos_ids
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        end = end if isinstance(end, int) and end in eos else min(eos)
        completion_ids = self.encode(completion) + [end]
        logprobs = self.engine.score(prompt_ids, completion_ids, temperature) if score else None
        return RawCompletion(text=completion, prompt_text=prompt_text, prompt_ids=prompt_ids,
                             completion_ids=completion_ids, logprobs=logprobs, finish_reason="stop")

    def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0, *,
              reuse_prefix: bool = False) -> list[float]:
        """Logprobs of `completion_ids` after `prompt_ids` from one fresh forward pass (no cache); with
        `reuse_prefix`, after the prompt's keys/values in the prefix cache (`Engine.score`)."""
        return self.engine.score(prompt_ids, completion_ids, temperature, reuse_prefix=reuse_prefix)


def _raw(done: Completion, prompt_text: str) -> RawCompletion:
    return RawCompletion(text=done.text, prompt_text=prompt_text, prompt_ids=done.prompt_ids,
                         completion_ids=done.completion_ids, logprobs=done.logprobs, finish_reason=done.finish_reason)


def model_context(model: Any) -> int | None:
    """The context length a model's config declares (`max_position_embeddings`, GPT-2's `n_positions`)."""
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
